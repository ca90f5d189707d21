#include "model/layers.hpp"

#include "core/vecmath.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

namespace ab {
namespace {
using dnnl::memory;
using dims = memory::dims;

memory::desc plain(int64_t rows, int64_t cols) { return memory::desc(dims{rows, cols}, memory::data_type::f32, memory::format_tag::ab); }
memory::desc vec(int64_t n) { return memory::desc(dims{n}, memory::data_type::f32, memory::format_tag::a); }

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}
}  // namespace

// ---- BoundPrimitive ----
void BoundPrimitive::arg(int arg, const memory::desc& md) {
  mems_.emplace_back(md, cpu_engine(), static_cast<void*>(DNNL_MEMORY_NONE));
  args_.push_back(dnnl_exec_arg_t{arg, mems_.back().get()});
}

void BoundPrimitive::bind(std::byte* scratch) {
  if (!prim_) return;  // a backward primitive the mode does not need
  ensure_streams(1);
  mems_.emplace_back(scratch_desc_, cpu_engine(), scratchpad_bytes() ? static_cast<void*>(scratch) : nullptr);
  args_.push_back(dnnl_exec_arg_t{DNNL_ARG_SCRATCHPAD, mems_.back().get()});
  // The vector may have reallocated: refresh the C handles.
  for (size_t i = 0; i < args_.size(); ++i) args_[i].memory = mems_[i].get();
}

void BoundPrimitive::run(std::initializer_list<const void*> ptrs) const {
  if (ptrs.size() + 1 != mems_.size()) throw std::logic_error("BoundPrimitive: wrong number of arguments");
  size_t i = 0;
  for (const void* p : ptrs) dnnl_memory_set_data_handle_v2(mems_[i++].get(), const_cast<void*>(p), nullptr);
  const dnnl_status_t st =
      dnnl_primitive_execute(prim_.get(), cpu_stream(0).get(), static_cast<int>(args_.size()), args_.data());
  if (st != dnnl_success) throw std::runtime_error(fmt::format("oneDNN primitive execution failed (status {})", static_cast<int>(st)));
}

// ---- Linear ----
Linear::Linear(int64_t M, int64_t K, int64_t N, bool with_backward, bool bf16, bool weights_nk, bool bias)
    : M_(M), K_(K), N_(N), weights_nk_(weights_nk), bf16_(bf16) {
  auto spec = [](MatmulSpec s) {
    s.single_thread = false;  // called outside any parallel region: oneDNN parallelises
    return s;
  };
  MatmulSpec fwd = spec(weights_nk ? MatmulSpec::tile(M, N, K, K, false, K, true, N)    // X · W^T, W (N, K)
                                   : MatmulSpec::tile(M, N, K, K, false, N, false, N));  // X · W, W (K, N)
  fwd.bias = bias;
  fwd_ = Matmul(bf16 ? fwd.with_bf16_inputs() : fwd);
  auto typed = [&](MatmulSpec s) { return bf16 ? spec(s).with_bf16_inputs() : spec(s); };
  if (with_backward && weights_nk) {
    bwd_data_ = Matmul(typed(MatmulSpec::tile(M, K, N, N, false, K, false, K)));    // dY · W
    bwd_weights_ = Matmul(typed(MatmulSpec::tile(N, K, M, N, true, K, false, K)));  // dY^T · X
  } else if (with_backward) {
    bwd_data_ = Matmul(typed(MatmulSpec::tile(M, K, N, N, false, N, true, K)));    // dY · W^T
    bwd_weights_ = Matmul(typed(MatmulSpec::tile(K, N, M, K, true, N, false, N)));  // X^T · dY
  }
}

size_t Linear::scratchpad_bytes() const {
  return std::max({fwd_.scratchpad_bytes(), bwd_data_.scratchpad_bytes(), bwd_weights_.scratchpad_bytes()});
}

void Linear::bind(std::byte* scratch) {
  fwd_.bind(1, scratch);
  if (bwd_data_.spec().M) {
    bwd_data_.bind(1, scratch);
    bwd_weights_.bind(1, scratch);
  }
}

void Linear::forward(const void* X, const void* W, const float* b, float* Y) const { fwd_.run(0, X, W, Y, b); }

// db (N) = the column sums of Y (M, N), rows added in order: each thread sums its static share
// of the rows, and the shares are added in thread order (a fixed order per thread count).
// Yb: Y rounded to bf16 in the same pass (the backward products' dY read once, not twice).
// Columns in chunks of 256, whose sums stay in L1 while the rows stream by.
namespace {
void column_sums(const float* Y, int64_t M, int64_t N, float* db, uint16_t* Yb) {
  constexpr int64_t kChunk = 256;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t lo = M * t / T, hi = M * (t + 1) / T;
    for (int64_t c0 = 0; c0 < N; c0 += kChunk) {
      const int64_t w = std::min(kChunk, N - c0);
      alignas(64) float part[kChunk];
      std::fill_n(part, w, 0.0f);
      for (int64_t r = lo; r < hi; ++r) {
        const float* y = Y + r * N + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) part[c] += y[c];
        if (Yb) to_bf16(y, Yb + r * N + c0, w);
      }
      for (int u = 0; u < T; ++u) {  // the shares in thread order
        if (u == t)
          for (int64_t c = 0; c < w; ++c) db[c0 + c] = u == 0 ? part[c] : db[c0 + c] + part[c];
#pragma omp barrier
      }
    }
  }
}
}  // namespace

void Linear::backward(const void* X, const void* W, const float* dY, uint16_t* dY_bf16, float* dX, float* dW,
                      float* db) const {
  if (bf16_ != (dY_bf16 != nullptr)) throw std::logic_error("Linear::backward: a bf16 layer takes dY's bf16 buffer, a float one none");
  // 1. db and (bf16) dY rounded, one pass over dY.
  if (db) column_sums(dY, M_, N_, db, dY_bf16);
  else if (dY_bf16) to_bf16_parallel(dY, dY_bf16, M_ * N_);
  const void* dYp = dY_bf16 ? static_cast<const void*>(dY_bf16) : static_cast<const void*>(dY);
  // 2. The products.
  bwd_data_.run(0, dYp, W, dX);
  if (weights_nk_) bwd_weights_.run(0, dYp, X, dW);  // weights (N, K): dY^T · X
  else bwd_weights_.run(0, X, dYp, dW);
}

// ---- LayerNorm ----
LayerNorm::LayerNorm(int64_t rows, int64_t cols, bool with_backward) {
  constexpr float kEps = 1e-6f;
  const auto data = plain(rows, cols), stat = vec(rows), param = vec(cols);
  const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  // forward_training in both modes: it outputs the mean and variance the backward pass reads
  // (in inference they are written and not read; rows floats each).
  dnnl::layer_normalization_forward::primitive_desc fpd(
      dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, data, stat, kEps, flags),
      user_scratchpad(), cpu_engine());
  fwd_ = BoundPrimitive(dnnl::layer_normalization_forward(fpd), fpd.scratchpad_desc());
  fwd_.arg(DNNL_ARG_SRC, data);
  fwd_.arg(DNNL_ARG_SCALE, param);
  fwd_.arg(DNNL_ARG_SHIFT, param);
  fwd_.arg(DNNL_ARG_DST, data);
  fwd_.arg(DNNL_ARG_MEAN, stat);
  fwd_.arg(DNNL_ARG_VARIANCE, stat);
  if (with_backward) {
    dnnl::layer_normalization_backward::primitive_desc bpd(
        dnnl::layer_normalization_backward::desc(dnnl::prop_kind::backward, data, data, stat, kEps, flags),
        user_scratchpad(), cpu_engine(), fpd);
    bwd_ = BoundPrimitive(dnnl::layer_normalization_backward(bpd), bpd.scratchpad_desc());
    bwd_.arg(DNNL_ARG_SRC, data);
    bwd_.arg(DNNL_ARG_MEAN, stat);
    bwd_.arg(DNNL_ARG_VARIANCE, stat);
    bwd_.arg(DNNL_ARG_DIFF_DST, data);
    bwd_.arg(DNNL_ARG_SCALE, param);
    bwd_.arg(DNNL_ARG_SHIFT, param);  // oneDNN 2.6 lists it among the backward arguments
    bwd_.arg(DNNL_ARG_DIFF_SRC, data);
    bwd_.arg(DNNL_ARG_DIFF_SCALE, param);
    bwd_.arg(DNNL_ARG_DIFF_SHIFT, param);
  }
}

size_t LayerNorm::scratchpad_bytes() const { return std::max(fwd_.scratchpad_bytes(), bwd_.scratchpad_bytes()); }

void LayerNorm::bind(std::byte* scratch) {
  fwd_.bind(scratch);
  bwd_.bind(scratch);
}

void LayerNorm::forward(const float* x, const float* g, const float* b, float* y, float* mean, float* var) const {
  fwd_.run({x, g, b, y, mean, var});
}

void LayerNorm::backward(const float* x, const float* mean, const float* var, const float* dy, const float* g,
                         const float* b, float* dx, float* dg, float* db) const {
  bwd_.run({x, mean, var, dy, g, b, dx, dg, db});
}

// ---- Gelu ----
Gelu::Gelu(int64_t n, bool with_backward) {
  const auto md = vec(n);
  const auto alg = dnnl::algorithm::eltwise_gelu_tanh;
  dnnl::eltwise_forward::primitive_desc fpd(dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, md),
                                            user_scratchpad(), cpu_engine());
  fwd_ = BoundPrimitive(dnnl::eltwise_forward(fpd), fpd.scratchpad_desc());
  fwd_.arg(DNNL_ARG_SRC, md);
  fwd_.arg(DNNL_ARG_DST, md);
  if (with_backward) {
    dnnl::eltwise_backward::primitive_desc bpd(dnnl::eltwise_backward::desc(alg, md, md), user_scratchpad(),
                                               cpu_engine(), fpd);
    bwd_ = BoundPrimitive(dnnl::eltwise_backward(bpd), bpd.scratchpad_desc());
    bwd_.arg(DNNL_ARG_SRC, md);
    bwd_.arg(DNNL_ARG_DIFF_DST, md);
    bwd_.arg(DNNL_ARG_DIFF_SRC, md);
  }
}

size_t Gelu::scratchpad_bytes() const { return std::max(fwd_.scratchpad_bytes(), bwd_.scratchpad_bytes()); }

void Gelu::bind(std::byte* scratch) {
  fwd_.bind(scratch);
  bwd_.bind(scratch);
}

void Gelu::forward(const float* u, float* g) const { fwd_.run({u, g}); }
void Gelu::backward(const float* u, const float* dg, float* du) const { bwd_.run({u, dg, du}); }

// ---- element-wise passes ----
void sinusoidal_positions(int64_t N, int64_t d, float* P) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < d; i += 2) {
      const double angle = static_cast<double>(n) / std::pow(10000.0, static_cast<double>(i) / static_cast<double>(d));
      P[n * d + i] = static_cast<float>(std::sin(angle));
      if (i + 1 < d) P[n * d + i + 1] = static_cast<float>(std::cos(angle));
    }
}

void embedding_forward(const int32_t* tokens, int64_t rows, int64_t S, int64_t G, int64_t d, const float* E,
                       const float* positions, const float* cls, const float* globals, float* x) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = r % S;
    float* y = x + r * d;
    if (s < G) {  // a global row: its learned embedding, no position
      std::copy_n(globals + s * d, d, y);
      continue;
    }
    const int64_t n = s - G;
    const float* e = E + static_cast<int64_t>(tokens[r]) * d;
    if (positions) {
      const float* p = positions + n * d;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) y[c] = e[c] + p[c];
    } else {
      std::copy_n(e, d, y);
    }
    if (cls && n == 0)
      for (int64_t c = 0; c < d; ++c) y[c] += cls[c];
  }
}

void embedding_backward(const int32_t* tokens, int64_t rows, int64_t S, int64_t G, int64_t d, const float* dx,
                        float* dE, float* dcls, float* dglobals, float* dpos) {
  constexpr int64_t kCols = 16;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < d; c0 += kCols) {
    const int64_t c1 = std::min(d, c0 + kCols);
    if (dcls)
      for (int64_t c = c0; c < c1; ++c) dcls[c] = 0;
    if (dpos)
      for (int64_t n = 0; n < S - G; ++n)
        for (int64_t c = c0; c < c1; ++c) dpos[n * d + c] = 0;
    if (dglobals)
      for (int64_t j = 0; j < G; ++j)
        for (int64_t c = c0; c < c1; ++c) dglobals[j * d + c] = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = dx + r * d;
      const int64_t s = r % S;
      if (s < G) {
        for (int64_t c = c0; c < c1; ++c) dglobals[s * d + c] += g[c];
        continue;
      }
      float* e = dE + static_cast<int64_t>(tokens[r]) * d;
      for (int64_t c = c0; c < c1; ++c) e[c] += g[c];
      if (dcls && s == G)
        for (int64_t c = c0; c < c1; ++c) dcls[c] += g[c];
      if (dpos)
        for (int64_t c = c0; c < c1; ++c) dpos[(s - G) * d + c] += g[c];
    }
  }
}

void split_heads(const float* qkv, int64_t B, int64_t N, int64_t H, int64_t Dh, float* q, float* k, float* v) {
  const int64_t d = H * Dh;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) {
      const float* row = qkv + (b * N + n) * 3 * d;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t dst = ((b * H + h) * N + n) * Dh;
        std::copy_n(row + h * Dh, Dh, q + dst);
        std::copy_n(row + d + h * Dh, Dh, k + dst);
        std::copy_n(row + 2 * d + h * Dh, Dh, v + dst);
      }
    }
}

void merge_qkv(const float* q, const float* k, const float* v, int64_t B, int64_t N, int64_t H, int64_t Dh, float* qkv) {
  const int64_t d = H * Dh;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n) {
      float* row = qkv + (b * N + n) * 3 * d;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t src = ((b * H + h) * N + n) * Dh;
        std::copy_n(q + src, Dh, row + h * Dh);
        std::copy_n(k + src, Dh, row + d + h * Dh);
        std::copy_n(v + src, Dh, row + 2 * d + h * Dh);
      }
    }
}

namespace {
// o (B, H, N, Dh) -> a (B·N, H·Dh): floats copied, or bf16 numbers rounded on the way.
template <class Out>
void merge_heads_into(const float* o, int64_t B, int64_t N, int64_t H, int64_t Dh, Out* a) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) {
        const float* from = o + ((b * H + h) * N + n) * Dh;
        Out* to = a + (b * N + n) * H * Dh + h * Dh;
        if constexpr (std::is_same_v<Out, float>) std::copy_n(from, Dh, to);
        else to_bf16(from, to, Dh);
      }
}
}  // namespace

void merge_heads(const float* o, int64_t B, int64_t N, int64_t H, int64_t Dh, float* a) { merge_heads_into(o, B, N, H, Dh, a); }
void merge_heads(const float* o, int64_t B, int64_t N, int64_t H, int64_t Dh, uint16_t* a) { merge_heads_into(o, B, N, H, Dh, a); }

void split_single(const float* a, int64_t B, int64_t N, int64_t H, int64_t Dh, float* o) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) std::copy_n(a + (b * N + n) * H * Dh + h * Dh, Dh, o + ((b * H + h) * N + n) * Dh);
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

double cross_entropy(float* probs, const int32_t* target, int64_t rows, int64_t C, bool with_grad) {
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) counted += target[r] >= 0;
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (target[r] >= 0)
      loss -= std::log(std::max(static_cast<double>(probs[r * C + target[r]]), static_cast<double>(std::numeric_limits<float>::min())));
  if (with_grad) {
    const float scale = counted ? 1.0f / static_cast<float>(counted) : 0.0f;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* p = probs + r * C;
      if (target[r] < 0) {
        std::fill_n(p, C, 0.0f);
        continue;
      }
      p[target[r]] -= 1.0f;
      for (int64_t c = 0; c < C; ++c) p[c] *= scale;
    }
  }
  return counted ? loss / static_cast<double>(counted) : 0.0;
}

void AdamW::update(float* w, const float* g, float* m, float* v, int64_t n, int64_t step) const {
  const float c1 = 1.0f / (1.0f - std::pow(beta1, static_cast<float>(step)));
  const float c2 = 1.0f / (1.0f - std::pow(beta2, static_cast<float>(step)));
  const float b1 = beta1, b2 = beta2, e = eps, a = lr, wd = weight_decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    w[i] -= a * (m[i] * c1 / (std::sqrt(v[i] * c2) + e) + wd * w[i]);
  }
}

}  // namespace ab
