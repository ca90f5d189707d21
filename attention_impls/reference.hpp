// The plain formula of softmax attention under a mask, in double precision: the oracle every
// exact mechanism's kernel is compared with (each mechanism file says which pairs it computes:
// MechanismInfo::reference_mask). Triple loops, slow and obvious on purpose, llm.c style; the
// tests call it, the suite never times it.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.hpp"

namespace ab::ref {

// allowed(i, j): may query i use key j. Rows without an admissible key give zero output.
using Mask = std::function<bool(int64_t, int64_t)>;
Mask dense_mask(bool causal);
// `pattern`, and with causal also j <= i.
Mask causal_and(Mask pattern, bool causal);

struct Grads {
  std::vector<double> dq, dk, dv;  // (B, H, N, D) each, row-major
};

// Index of (b, h, n, d) in a row-major (B, H, N, D) tensor.
inline size_t idx(const Shape4& s, int64_t b, int64_t h, int64_t n, int64_t d) {
  return static_cast<size_t>(((b * s.H + h) * s.N + n) * s.D + d);
}

// P (N, N) of head (b, h): softmax_j(q_i . k_j / sqrt(D)) over the allowed keys, 0 elsewhere.
std::vector<double> probs(const TensorView& q, const TensorView& k, int64_t b, int64_t h, const Mask& allowed);
// O (B, H, N, D) = P V, every head.
std::vector<double> forward(const TensorView& q, const TensorView& k, const TensorView& v, const Mask& allowed);
// Analytic gradients of L = sum(dout * O): dV = P^T dO, dP = dO V^T,
// dS = P (dP - rowsum(dP P)) / sqrt(D), dQ = dS K, dK = dS^T Q.
Grads backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout, const Mask& allowed);
// sum(dout * forward(q, k, v)).
double loss(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout, const Mask& allowed);

}  // namespace ab::ref
