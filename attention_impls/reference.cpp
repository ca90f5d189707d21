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

std::vector<double> attend(const TensorView& q, int64_t b, int64_t h, const Rows& keys, const Rows& values) {
  const int64_t N = q.shape.N, D = q.shape.D, T = static_cast<int64_t>(keys.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> out(static_cast<size_t>(N * D), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    // 1. scores and their maximum
    std::vector<double> sc(static_cast<size_t>(T));
    double mx = -1e300;
    for (int64_t t = 0; t < T; ++t) {
      double dot = 0;
      for (int64_t c = 0; c < D; ++c) dot += double(q.at(b, h, i, c)) * keys[t][c];
      sc[t] = dot * scale;
      mx = std::max(mx, sc[t]);
    }
    // 2. softmax, then the weighted values
    double sum = 0;
    for (auto& x : sc) sum += (x = std::exp(x - mx));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < D; ++c) out[i * D + c] += sc[t] / sum * values[t][c];
  }
  return out;
}

void put_head(std::vector<double>& out, const Shape4& s, int64_t b, int64_t h, const std::vector<double>& head) {
  for (int64_t i = 0; i < s.N; ++i)
    for (int64_t d = 0; d < s.D; ++d) out[idx(s, b, h, i, d)] = head[i * s.D + d];
}

std::vector<double> rotated(const std::vector<double>& x, int64_t n) {
  const auto F = static_cast<int64_t>(x.size());
  std::vector<double> y(x);
  for (int64_t p = 0; 2 * p + 1 < F; ++p) {
    const double angle = double(n) * std::pow(10000.0, -2.0 * double(p) / double(F));
    y[2 * p] = x[2 * p] * std::cos(angle) - x[2 * p + 1] * std::sin(angle);
    y[2 * p + 1] = x[2 * p] * std::sin(angle) + x[2 * p + 1] * std::cos(angle);
  }
  return y;
}

std::vector<double> feature_ratio(const std::vector<double>& fq, int64_t i, const Rows& fk, const TensorView& v,
                                  int64_t b, int64_t h, bool rope) {
  auto dot = [](const std::vector<double>& x, const std::vector<double>& y) {
    double s = 0;
    for (size_t f = 0; f < x.size(); ++f) s += x[f] * y[f];
    return s;
  };
  const int64_t D = v.shape.D;
  double den = 1e-6;
  std::vector<double> num(static_cast<size_t>(D), 0.0);
  const std::vector<double> fq_rot = rope ? rotated(fq, i) : fq;
  for (int64_t j = 0; j < static_cast<int64_t>(fk.size()); ++j) {
    den += dot(fq, fk[j]);
    const double w = rope ? dot(fq_rot, rotated(fk[j], j)) : dot(fq, fk[j]);
    for (int64_t d = 0; d < D; ++d) num[d] += w * v.at(b, h, j, d);
  }
  for (auto& x : num) x /= den;
  return num;
}

void LseCombine::add(double lse, const std::vector<double>& piece) {
  const double mn = std::max(m, lse), keep = std::exp(m - mn), take = std::exp(lse - mn);
  for (size_t c = 0; c < o.size(); ++c) o[c] = keep * o[c] + take * piece[c];
  z = keep * z + take;
  m = mn;
}

std::vector<double> LseCombine::result() const {
  std::vector<double> r(o.size(), 0.0);
  if (z > 0)
    for (size_t c = 0; c < o.size(); ++c) r[c] = o[c] / z;
  return r;
}

void attend_positions(const TensorView& q, const TensorView& v, int64_t b, int64_t h, int64_t i, const Rows& key,
                      const std::vector<int64_t>& keys, LseCombine& acc) {
  const int64_t D = q.shape.D;
  std::vector<double> sc;
  double mx = -1e300;
  for (int64_t j : keys) {
    double dot = 0;
    for (int64_t c = 0; c < D; ++c) dot += double(q.at(b, h, i, c)) * key[j][c];
    sc.push_back(dot / std::sqrt(double(D)));
    mx = std::max(mx, sc.back());
  }
  double sum = 0;
  for (double x : sc) sum += std::exp(x - mx);
  std::vector<double> o(static_cast<size_t>(D), 0.0);
  for (size_t t = 0; t < keys.size(); ++t)
    for (int64_t c = 0; c < D; ++c) o[c] += std::exp(sc[t] - mx) / sum * v.at(b, h, keys[t], c);
  acc.add(mx + std::log(sum), o);
}

Rows shared_keys(const TensorView& q, int64_t b, int64_t h) {
  const int64_t N = q.shape.N, D = q.shape.D;
  Rows key(static_cast<size_t>(N), std::vector<double>(static_cast<size_t>(D)));
  for (int64_t j = 0; j < N; ++j) {
    double n2 = 0;
    for (int64_t d = 0; d < D; ++d) n2 += double(q.at(b, h, j, d)) * q.at(b, h, j, d);
    for (int64_t d = 0; d < D; ++d) key[j][d] = q.at(b, h, j, d) / std::sqrt(n2);
  }
  return key;
}

}  // namespace ab::ref
