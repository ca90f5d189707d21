// Plain triple-loop references in double precision: the oracle every exact mechanism is tested
// against. Slow and obvious on purpose.
#pragma once
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/tensor.hpp"

namespace ab::ref {

// allowed(i, j): may query i use key j. Rows without an admissible key give zero output.
using Mask = std::function<bool(int64_t, int64_t)>;
inline Mask dense_mask(bool causal) {
  if (causal) return [](int64_t i, int64_t j) { return j <= i; };
  return [](int64_t, int64_t) { return true; };
}

struct Grads {
  std::vector<double> dq, dk, dv;
};

inline size_t idx(const Shape4& s, int64_t b, int64_t h, int64_t n, int64_t d) {
  return static_cast<size_t>(((b * s.H + h) * s.N + n) * s.D + d);
}

// Attention probabilities of one (b, h): P[i][j].
inline std::vector<double> probs(const TensorView& q, const TensorView& k, int64_t b, int64_t h,
                                 const Mask& allowed) {
  const auto& s = q.shape;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  std::vector<double> P(static_cast<size_t>(s.N * s.N), 0.0);
  for (int64_t i = 0; i < s.N; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < s.N; ++j) {
      if (!allowed(i, j)) continue;
      double dot = 0;
      for (int64_t d = 0; d < s.D; ++d) dot += double(q.at(b, h, i, d)) * k.at(b, h, j, d);
      P[i * s.N + j] = dot * scale;
      mx = std::max(mx, dot * scale);
    }
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

inline std::vector<double> forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const Mask& allowed) {
  const auto& s = q.shape;
  std::vector<double> out(static_cast<size_t>(s.numel()), 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      auto P = probs(q, k, b, h, allowed);
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t j = 0; j < s.N; ++j) {
          const double p = P[i * s.N + j];
          if (p == 0) continue;
          for (int64_t d = 0; d < s.D; ++d) out[idx(s, b, h, i, d)] += p * v.at(b, h, j, d);
        }
    }
  return out;
}

// Analytic gradients of L = sum(dout * O).
inline Grads backward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& dout, const Mask& allowed) {
  const auto& s = q.shape;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  Grads g;
  g.dq.assign(static_cast<size_t>(s.numel()), 0.0);
  g.dk = g.dq;
  g.dv = g.dq;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      auto P = probs(q, k, b, h, allowed);
      for (int64_t i = 0; i < s.N; ++i) {
        std::vector<double> dP(static_cast<size_t>(s.N), 0.0);
        double rowdot = 0;
        for (int64_t j = 0; j < s.N; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < s.D; ++d) acc += double(dout.at(b, h, i, d)) * v.at(b, h, j, d);
          dP[j] = acc;
          rowdot += P[i * s.N + j] * acc;
        }
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

// sum(dout * forward(q, k, v)) in double.
inline double loss(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& dout, const Mask& allowed) {
  auto o = forward(q, k, v, allowed);
  double l = 0;
  const auto& s = q.shape;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t d = 0; d < s.D; ++d) l += o[idx(s, b, h, i, d)] * dout.at(b, h, i, d);
  return l;
}

// max |a - b| / max |b|: a relative error over the whole tensor. The denominator has a floor of
// 1e-2 (inputs are standard normal) so that a tensor that is exactly zero in theory, such as dQ
// when N = 1, is compared absolutely against float rounding. A caller whose zero-in-theory
// tensor is the difference of larger terms passes their scale as the floor (see max_abs).
inline double rel_err(const float* a, const std::vector<double>& b, double floor = 1e-2) {
  double num = 0, den = floor;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

inline double max_abs(const std::vector<double>& b) {
  double m = 0;
  for (double x : b) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace ab::ref
