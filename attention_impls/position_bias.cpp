#include "attention_impls/position_bias.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/vecmath.hpp"

namespace ab {

std::string to_string(const PositionBiasSpec& s) {
  switch (s.kind) {
    case PositionBiasKind::none: return "none";
    case PositionBiasKind::alibi: return "alibi";
    case PositionBiasKind::t5: return fmt::format("bias:{}:{}", s.buckets, s.max_distance);
    case PositionBiasKind::shaw: return fmt::format("shaw:{}", s.clip);
  }
  return "?";
}

int64_t t5_bucket(int64_t offset, bool bidirectional, int64_t buckets, int64_t max_distance) {
  int64_t ret = 0;
  int64_t n = -offset;  // T5 counts the distance back from the query
  if (bidirectional) {
    buckets /= 2;
    if (n < 0) ret += buckets;
    n = std::abs(n);
  } else {
    n = std::max<int64_t>(n, 0);
  }
  const int64_t max_exact = buckets / 2;
  if (n < max_exact) return ret + n;
  // Computed in float as mesh-tensorflow and the PyTorch port do, truncated toward zero.
  const float large = std::log(static_cast<float>(n) / static_cast<float>(max_exact)) /
                      std::log(static_cast<float>(max_distance) / static_cast<float>(max_exact)) *
                      static_cast<float>(buckets - max_exact);
  return ret + std::min<int64_t>(max_exact + static_cast<int64_t>(large), buckets - 1);
}

std::vector<float> alibi_slopes(int64_t H) {
  auto power_of_two = [](int64_t n) {
    std::vector<float> s(static_cast<size_t>(n));
    const double start = std::pow(2.0, -8.0 / static_cast<double>(n));
    for (int64_t h = 0; h < n; ++h) s[static_cast<size_t>(h)] = static_cast<float>(std::pow(start, static_cast<double>(h + 1)));
    return s;
  };
  int64_t p = 1;
  while (2 * p <= H) p *= 2;
  std::vector<float> s = power_of_two(p);
  if (p < H) {
    const std::vector<float> twice = power_of_two(2 * p);
    for (int64_t h = 0; static_cast<int64_t>(s.size()) < H; h += 2) s.push_back(twice[static_cast<size_t>(h)]);
  }
  return s;
}

PositionBias::PositionBias(const PositionBiasSpec& spec, const Shape4& shape, bool causal, float scale, int threads)
    : spec_(spec), shape_(shape), causal_(causal), scale_(scale), threads_(threads) {
  if (spec_.kind == PositionBiasKind::t5) {
    if (spec_.buckets < 2 || (!causal && spec_.buckets < 4) || spec_.buckets % 2)
      throw InvalidInput(fmt::format("t5 bias buckets must be even and at least {}, got {}", causal ? 2 : 4, spec_.buckets));
    const int64_t exact = (causal ? spec_.buckets : spec_.buckets / 2) / 2;
    if (spec_.max_distance <= exact)
      throw InvalidInput(fmt::format("t5 bias max distance must exceed the {} exact buckets, got {}", exact, spec_.max_distance));
  }
  if (spec_.kind == PositionBiasKind::shaw && spec_.clip < 1)
    throw InvalidInput(fmt::format("shaw clip must be at least 1, got {}", spec_.clip));
  if (spec_.kind == PositionBiasKind::alibi) slopes_ = alibi_slopes(shape_.H);
}

int64_t PositionBias::reach() const {
  return spec_.kind == PositionBiasKind::shaw ? spec_.clip : shape_.N - 1;
}

size_t PositionBias::table_floats() const {
  if (!active()) return 0;
  const auto rf = static_cast<size_t>(row_floats());
  return spec_.kind == PositionBiasKind::shaw ? static_cast<size_t>(shape_.B * shape_.H * shape_.N) * rf
                                              : static_cast<size_t>(shape_.H) * rf;
}

size_t PositionBias::accum_floats() const {
  switch (spec_.kind) {
    case PositionBiasKind::t5: return static_cast<size_t>(threads_ * shape_.H * row_floats());
    case PositionBiasKind::shaw: return table_floats();
    default: return 0;
  }
}

size_t PositionBias::param_floats() const {
  switch (spec_.kind) {
    case PositionBiasKind::t5: return static_cast<size_t>(shape_.H * spec_.buckets);
    case PositionBiasKind::shaw: return static_cast<size_t>(row_floats() * shape_.D);
    default: return 0;
  }
}

size_t PositionBias::working_bytes(Mode mode) const {
  const bool bwd = mode == Mode::fwdbwd;
  size_t f = table_floats() + param_floats() * (bwd ? 2 : 1) + (bwd ? accum_floats() : 0);
  size_t i = spec_.kind == PositionBiasKind::t5 ? static_cast<size_t>(2 * shape_.N - 1) : 0;
  return f * sizeof(float) + i * sizeof(int64_t);
}

void PositionBias::setup(Mode mode, Rng& rng) {
  if (!active()) return;
  tables_ = Buffer<float>(table_floats());
  if (param_floats() > 0) {
    param_ = Buffer<float>(param_floats());
    rng.fill_normal(param_.data(), static_cast<int64_t>(param_.size()), 0.02);
    if (mode == Mode::fwdbwd) {
      grad_ = Buffer<float>(param_floats());
      grad_.zero();
    }
  }
  if (mode == Mode::fwdbwd && accum_floats() > 0) accum_ = Buffer<float>(accum_floats());
  if (spec_.kind == PositionBiasKind::t5) {
    const int64_t N = shape_.N;
    buckets_ = Buffer<int64_t>(static_cast<size_t>(2 * N - 1));
    for (int64_t o = -(N - 1); o <= N - 1; ++o)
      buckets_.data()[o + N - 1] = t5_bucket(o, !causal_, spec_.buckets, spec_.max_distance);
  }
}

std::vector<LearnedTensor> PositionBias::learned() {
  const auto n = static_cast<int64_t>(param_floats());
  if (n == 0) return {};
  return {LearnedTensor{spec_.kind == PositionBiasKind::t5 ? "position_bias" : "shaw_keys", param_.data(), grad_.data(), n}};
}

std::vector<DumpTensor> PositionBias::dump_tensors() const {
  switch (spec_.kind) {
    case PositionBiasKind::t5: return {DumpTensor{"position_bias", {shape_.H, spec_.buckets}, param_.data(), nullptr}};
    case PositionBiasKind::shaw: return {DumpTensor{"shaw_keys", {row_floats(), shape_.D}, param_.data(), nullptr}};
    default: return {};
  }
}

const float* PositionBias::row_table(int64_t b, int64_t h, int64_t i) const {
  const int64_t rf = row_floats(), K = reach();
  if (spec_.kind == PositionBiasKind::shaw) return tables_.data() + ((b * shape_.H + h) * shape_.N + i) * rf + K;
  return tables_.data() + h * rf + K;
}

// 1. The row tables: per head over every offset (alibi, t5), or s q_i . a_r per query row (shaw).
void PositionBias::prepare(const TensorView& q) {
  if (!active()) return;
  const int64_t H = shape_.H, N = shape_.N, D = shape_.D, rf = row_floats(), K = reach();
  if (spec_.kind == PositionBiasKind::alibi) {
    for (int64_t h = 0; h < H; ++h)
      for (int64_t o = -K; o <= K; ++o) tables_.data()[h * rf + o + K] = -slopes_[static_cast<size_t>(h)] * static_cast<float>(std::abs(o));
  } else if (spec_.kind == PositionBiasKind::t5) {
    for (int64_t h = 0; h < H; ++h)
      for (int64_t o = -K; o <= K; ++o) tables_.data()[h * rf + o + K] = param_.data()[h * spec_.buckets + buckets_.data()[o + K]];
  } else {
    const float* A = param_.data();
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t bh = 0; bh < shape_.B * H; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      for (int64_t i = 0; i < N; ++i) {
        const float* qi = q.row(b, h, i);
        float* R = tables_.data() + (bh * N + i) * rf;
        for (int64_t r = 0; r < rf; ++r) R[r] = scale_ * dot(qi, A + r * D, D);
      }
    }
  }
}

namespace {
// Consecutive keys first .. first + cols - 1 against query i: the columns whose offset is below
// -K, within [-K, K], and above K, as [0, lo), [lo, hi), [hi, cols).
std::pair<int64_t, int64_t> clamp_split(int64_t first, int64_t i, int64_t cols, int64_t K) {
  const int64_t lo = std::clamp<int64_t>(i - K - first, 0, cols), hi = std::clamp<int64_t>(i + K + 1 - first, lo, cols);
  return {lo, hi};
}
}  // namespace

void PositionBias::add_row(int64_t b, int64_t h, int64_t i, const KeyPositions& keys, int64_t cols, float* S) const {
  const float* R = row_table(b, h, i);
  const int64_t K = reach();
  if (keys.consecutive()) {  // consecutive keys: a clamped run, a slice, a clamped run
    const auto [lo, hi] = clamp_split(keys.first, i, cols, K);
    const float left = R[-K], right = R[K];
    const float* Ri = R + (keys.first - i);
    for (int64_t c = 0; c < lo; ++c) S[c] += left;
#pragma omp simd
    for (int64_t c = lo; c < hi; ++c) S[c] += Ri[c];
    for (int64_t c = hi; c < cols; ++c) S[c] += right;
    return;
  }
  for (int64_t c = 0; c < cols; ++c) S[c] += R[std::clamp(keys.at(c) - i, -K, K)];
}

void PositionBias::begin_backward() {
  if (accum_.size() > 0) accum_.zero();
}

void PositionBias::accumulate_row(int tid, int64_t b, int64_t h, int64_t i, const KeyPositions& keys, int64_t cols,
                                  const float* dS) {
  if (spec_.kind == PositionBiasKind::alibi || spec_.kind == PositionBiasKind::none) return;
  const int64_t K = reach(), rf = row_floats();
  float* G = spec_.kind == PositionBiasKind::shaw ? accum_.data() + ((b * shape_.H + h) * shape_.N + i) * rf + K
                                                  : accum_.data() + (static_cast<int64_t>(tid) * shape_.H + h) * rf + K;
  if (keys.consecutive()) {
    const auto [lo, hi] = clamp_split(keys.first, i, cols, K);
    float left = 0.0f, right = 0.0f;
#pragma omp simd reduction(+ : left)
    for (int64_t c = 0; c < lo; ++c) left += dS[c];
#pragma omp simd reduction(+ : right)
    for (int64_t c = hi; c < cols; ++c) right += dS[c];
    G[-K] += left;
    G[K] += right;
    float* Gi = G + (keys.first - i);
#pragma omp simd
    for (int64_t c = lo; c < hi; ++c) Gi[c] += dS[c];
    return;
  }
  for (int64_t c = 0; c < cols; ++c) G[std::clamp(keys.at(c) - i, -K, K)] += dS[c];
}

// 2. The gradients from the accumulated sums (t5: per thread and head; shaw: per row).
void PositionBias::finish_backward(const TensorView& q, const TensorView& dq, bool param_grads) {
  const int64_t B = shape_.B, H = shape_.H, N = shape_.N, D = shape_.D, rf = row_floats(), K = reach();
  if (spec_.kind == PositionBiasKind::t5 && param_grads) {
    float* g = grad_.data();
    std::fill(g, g + param_floats(), 0.0f);
    for (int t = 0; t < threads_; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float* G = accum_.data() + (static_cast<int64_t>(t) * H + h) * rf;
        for (int64_t o = -K; o <= K; ++o) g[h * spec_.buckets + buckets_.data()[o + K]] += G[o + K];
      }
  }
  if (spec_.kind != PositionBiasKind::shaw) return;
  const float* A = param_.data();
  // dq_i += s sum_r G_i[r] a_r
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t i = 0; i < N; ++i) {
      const float* G = accum_.data() + (bh * N + i) * rf;
      float* dqi = dq.row(b, h, i);
      for (int64_t r = 0; r < rf; ++r) {
        const float g = scale_ * G[r];
        if (g == 0.0f) continue;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) dqi[d] += g * A[r * D + d];
      }
    }
  }
  if (!param_grads) return;
  // da_r = s sum_{b, h, i} G_i[r] q_i, one embedding per thread in a fixed order (deterministic).
  float* dA = grad_.data();
#pragma omp parallel for schedule(static) num_threads(threads_)
  for (int64_t r = 0; r < rf; ++r) {
    float* da = dA + r * D;
    std::fill(da, da + D, 0.0f);
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t i = 0; i < N; ++i) {
        const float g = scale_ * accum_.data()[(bh * N + i) * rf + r];
        if (g == 0.0f) continue;
        const float* qi = q.row(bh / H, bh % H, i);
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) da[d] += g * qi[d];
      }
  }
}

void BiasedLogits::locate(int64_t b, int64_t h, int64_t r0, int64_t c0, int64_t& pb, int64_t& ph, int64_t& q0,
                          KeyPositions& keys) const {
  int64_t resid = 0;
  if (at_.fold) {
    pb = b / at_.heads;
    ph = b % at_.heads;
    resid = h;
  } else {
    pb = b;
    ph = h;
  }
  q0 = at_.q_first + resid + r0 * at_.q_step;
  if (at_.gather) {
    keys = KeyPositions{0, 1, at_.gather + ph * at_.gather_n + c0};
  } else {
    keys = KeyPositions{at_.k_first + resid + c0 * at_.k_step, at_.k_step, nullptr};
  }
}

void BiasedLogits::logits(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows, int64_t c0,
                          int64_t cols, float* S, int64_t ldS) const {
  inner_->logits(mm, tid, b, h, r0, rows, c0, cols, S, ldS);
  int64_t pb, ph, q0;
  KeyPositions keys;
  locate(b, h, r0, c0, pb, ph, q0, keys);
  for (int64_t r = 0; r < rows; ++r) bias_->add_row(pb, ph, q0 + r * at_.q_step, keys, cols, S + r * ldS);
}

void BiasedLogits::logits_backward(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows,
                                   int64_t c0, int64_t cols, const float* dS, int64_t ldS) const {
  inner_->logits_backward(mm, tid, b, h, r0, rows, c0, cols, dS, ldS);
  int64_t pb, ph, q0;
  KeyPositions keys;
  locate(b, h, r0, c0, pb, ph, q0, keys);
  for (int64_t r = 0; r < rows; ++r) bias_->accumulate_row(tid, pb, ph, q0 + r * at_.q_step, keys, cols, dS + r * ldS);
}

}  // namespace ab
