// The key-value cache of the softmax mechanisms' decode mode: K and V of every token so far,
// (B, H, capacity, D) each. Decoding one token reads the whole cache, so its time and memory grow
// with the context; that is the comparison the kernel family's recurrent state is measured
// against.
#pragma once
#include <cmath>
#include <cstring>

#include "attention_impls/attention.hpp"
#include "core/vecmath.hpp"

namespace ab {

class KvCache {
 public:
  static size_t bytes(const Shape4& s, int64_t capacity) {
    return 2 * static_cast<size_t>(s.B * s.H * capacity * s.D) * sizeof(float);
  }
  void allocate(const Shape4& s, int64_t capacity) {
    s_ = s;
    cap_ = capacity;
    k_ = Buffer<float>(static_cast<size_t>(s.B * s.H * capacity * s.D));
    v_ = Buffer<float>(k_.size());
  }
  // Tokens [0, n) of a.k, a.v.
  void prefill(const AttnArgs& a, int64_t n) {
    for (int64_t b = 0; b < s_.B; ++b)
      for (int64_t h = 0; h < s_.H; ++h)
        for (int64_t i = 0; i < n; ++i) store(b, h, i, a.k.row(b, h, i), a.v.row(b, h, i));
  }
  void store(int64_t b, int64_t h, int64_t pos, const float* k, const float* v) const {
    std::memcpy(key(b, h, pos), k, static_cast<size_t>(s_.D) * sizeof(float));
    std::memcpy(value(b, h, pos), v, static_cast<size_t>(s_.D) * sizeof(float));
  }
  float* key(int64_t b, int64_t h, int64_t pos) const { return k_.data() + offset(b, h, pos); }
  float* value(int64_t b, int64_t h, int64_t pos) const { return v_.data() + offset(b, h, pos); }
  int64_t capacity() const { return cap_; }

 private:
  size_t offset(int64_t b, int64_t h, int64_t pos) const {
    return static_cast<size_t>(((b * s_.H + h) * cap_ + pos) * s_.D);
  }
  Shape4 s_;
  int64_t cap_ = 0;
  Buffer<float> k_, v_;
};

// One query against n cached keys with its scores materialised (n floats in `scores`):
// o = sum_j softmax_j(s q . key(j)) value(j), s = 1/sqrt(D). key and value map j to a row.
template <class KeyAt, class ValueAt>
inline void attend_cached(const float* q, int64_t n, int64_t D, KeyAt key, ValueAt value, float* scores, float* o) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t j = 0; j < n; ++j) scores[j] = scale * dot(q, key(j), D);
  const float sum = exp_shift_sum(scores, scores, n, max_of(scores, n));
  fill(o, D, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float p = scores[j] / sum;
    const float* v = value(j);
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
  }
}

// FLOPs of one softmax decode step over `keys` cached keys: q.k and the weighted sum of V.
inline double softmax_decode_flops(const Shape4& s, int64_t keys) {
  return 4.0 * static_cast<double>(keys) * static_cast<double>(s.D) * static_cast<double>(s.B * s.H);
}

}  // namespace ab
