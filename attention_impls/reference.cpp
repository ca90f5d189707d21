#include "attention_impls/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ab::ref {

Mask dense_mask(bool causal) {
  if (causal) return [](int64_t i, int64_t j) { return j <= i; };
  return [](int64_t, int64_t) { return true; };
}

Mask causal_and(Mask pattern, bool causal) {
  if (!causal) return pattern;
  return [pattern = std::move(pattern)](int64_t i, int64_t j) { return j <= i && pattern(i, j); };
}

std::vector<double> probs(const TensorView& q, const TensorView& k, int64_t b, int64_t h, const Mask& allowed) {
  const auto& s = q.shape;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  std::vector<double> P(static_cast<size_t>(s.N * s.N), 0.0);
  for (int64_t i = 0; i < s.N; ++i) {
    // 1. the scaled scores of the allowed keys and their maximum
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < s.N; ++j) {
      if (!allowed(i, j)) continue;
      double dot = 0;
      for (int64_t d = 0; d < s.D; ++d) dot += double(q.at(b, h, i, d)) * k.at(b, h, j, d);
      P[i * s.N + j] = dot * scale;
      mx = std::max(mx, dot * scale);
    }
    // 2. exp and normalise
    double sum = 0;
    for (int64_t j = 0; j < s.N; ++j) {
      if (!allowed(i, j)) continue;
      P[i * s.N + j] = std::exp(P[i * s.N + j] - mx);
      sum += P[i * s.N + j];
    }
    for (int64_t j = 0; j < s.N; ++j) P[i * s.N + j] = allowed(i, j) ? P[i * s.N + j] / sum : 0.0;
  }
  return P;
}

std::vector<double> forward(const TensorView& q, const TensorView& k, const TensorView& v, const Mask& allowed) {
  const auto& s = q.shape;
  std::vector<double> out(static_cast<size_t>(s.numel()), 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const auto P = probs(q, k, b, h, allowed);
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t j = 0; j < s.N; ++j) {
          const double p = P[i * s.N + j];
          if (p == 0) continue;
          for (int64_t d = 0; d < s.D; ++d) out[idx(s, b, h, i, d)] += p * v.at(b, h, j, d);
        }
    }
  return out;
}

Grads backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout, const Mask& allowed) {
  const auto& s = q.shape;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  Grads g;
  g.dq.assign(static_cast<size_t>(s.numel()), 0.0);
  g.dk = g.dq;
  g.dv = g.dq;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const auto P = probs(q, k, b, h, allowed);
      for (int64_t i = 0; i < s.N; ++i) {
        // 1. dP[j] = dO_i . v_j, and the row term sum_j P_ij dP_ij
        std::vector<double> dP(static_cast<size_t>(s.N), 0.0);
        double rowdot = 0;
        for (int64_t j = 0; j < s.N; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < s.D; ++d) acc += double(dout.at(b, h, i, d)) * v.at(b, h, j, d);
          dP[j] = acc;
          rowdot += P[i * s.N + j] * acc;
        }
        // 2. dS, and its products into dQ, dK; P's into dV
        for (int64_t j = 0; j < s.N; ++j) {
          const double p = P[i * s.N + j];
          if (p == 0) continue;
          const double dS = p * (dP[j] - rowdot) * scale;
          for (int64_t d = 0; d < s.D; ++d) {
            g.dv[idx(s, b, h, j, d)] += p * dout.at(b, h, i, d);
            g.dq[idx(s, b, h, i, d)] += dS * k.at(b, h, j, d);
            g.dk[idx(s, b, h, j, d)] += dS * q.at(b, h, i, d);
          }
        }
      }
    }
  return g;
}

double loss(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout, const Mask& allowed) {
  const auto o = forward(q, k, v, allowed);
  double l = 0;
  const auto& s = q.shape;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t d = 0; d < s.D; ++d) l += o[idx(s, b, h, i, d)] * dout.at(b, h, i, d);
  return l;
}

}  // namespace ab::ref
