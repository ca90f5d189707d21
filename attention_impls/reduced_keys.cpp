#include "attention_impls/reduced_keys.hpp"

#include <omp.h>

#include <cmath>

#include "core/vecmath.hpp"

namespace ab {
namespace {

TiledSoftmaxShape engine_shape(const AttnProblem& p, int64_t reduced) {
  TiledSoftmaxShape s = TiledSoftmaxShape::dense(p.shape.B, p.shape.H, p.shape.N, reduced, p.shape.D, false, p.shape.D,
                                                 p.strides.sn, p.threads);
  // bf16: the dense kernel, or under attention dropout the bf16 tiles (K', V' as bf16 copies).
  const bool bf16 = p.dtype == Dtype::bf16, tiles16 = bf16_tiles_for_dropout(p);
  s.bf16 = bf16 && !tiles16;
  s.bf16_tiles = tiles16;
  if (bf16) s.ld_dout = p.shape.D;  // backward: dO's contiguous bf16 copy
  if (tiles16) s.ld_dv = p.shape.D;  // dV' float, contiguous like the V' copy
  return s;
}

}  // namespace

ReducedKeysAttention::ReducedKeysAttention(const AttnProblem& p, int64_t reduced, int64_t map_floats,
                                           double init_limit, bool shared)
    : problem_(p),
      Nk_(reduced),
      qk_(p.shape.D, p.strides.sn, p.shape.D, 1.0f / std::sqrt(static_cast<float>(p.shape.D))),
      qk16_(p.shape.D, p.shape.D, p.shape.D, 1.0f / std::sqrt(static_cast<float>(p.shape.D)), false, true),
      core_(engine_shape(p, reduced)),
      map_floats_(map_floats),
      init_limit_(init_limit),
      shared_(shared) {
  qk16_.set_grad_strides(p.strides.sn, p.shape.D);  // dQ the caller's, dK' contiguous
}

// The maps, and with param_grads their gradients.
size_t ReducedKeysAttention::map_bytes() const {
  return (problem_.param_grads ? 2 : 1) * (shared_ ? 1 : 2) * static_cast<size_t>(problem_.shape.H * map_floats_) * sizeof(float);
}

std::vector<LearnedTensor> ReducedKeysAttention::learned() {
  const auto [key_name, value_name] = map_names();
  const int64_t n = problem_.shape.H * map_floats_;
  std::vector<LearnedTensor> out = {{key_name, key_map_.data(), key_map_grad_.data(), n}};
  if (!shared_) out.push_back({value_name, value_map_.data(), value_map_grad_.data(), n});
  return out;
}

double ReducedKeysAttention::param_grad_flops(Mode mode) const {
  if (mode != Mode::fwdbwd || !problem_.param_grads) return 0;
  return 2.0 * map_backward_flops() * static_cast<double>(problem_.shape.B * problem_.shape.H);
}

const float* ReducedKeysAttention::map(int64_t h, Which which) const {
  return (which == kKeys || shared_ ? key_map_ : value_map_).data() + h * map_floats_;
}

const void* ReducedKeysAttention::input_map(int64_t h, Which which) const {
  if (!bf16()) return map(h, which);
  const int64_t value_map = which == kValues && !shared_ ? problem_.shape.H * map_floats_ : 0;
  return maps_bf16_.data() + value_map + h * map_floats_;
}

void ReducedKeysAttention::validate() const {
  if (bf16() && !TiledSoftmax::dense_bf16_kernel(problem_.shape.D))
    throw InvalidInput(fmt::format("{} --dtype bf16 needs D of 16, 32, 64 or 128 and a build for AVX512-BF16; got D={}",
                                   mechanism(), problem_.shape.D));
}

size_t ReducedKeysAttention::bf16_bytes(Mode mode) const {
  if (!bf16()) return 0;
  const size_t maps = (shared_ ? 1 : 2) * static_cast<size_t>(problem_.shape.H * map_floats_);
  const size_t rows = static_cast<size_t>(problem_.threads * problem_.shape.N * problem_.shape.D);
  // Backward (and every call under attention dropout): Q and dO (B H N D), K' and V' (B H Nk D)
  // rounded for the engine's bf16 tiles.
  const size_t copies = mode == Mode::fwdbwd || tiles16() ? static_cast<size_t>(problem_.shape.B * problem_.shape.H * (2 * problem_.shape.N + 2 * Nk_) * problem_.shape.D) : 0;
  // The maps' bf16 backward: each thread's rounded dK' or dV' (Nk x D).
  const size_t grad_rows = mode == Mode::fwdbwd ? static_cast<size_t>(problem_.threads * Nk_ * problem_.shape.D) : 0;
  return (maps + rows + copies + grad_rows) * sizeof(uint16_t);
}

std::vector<DumpTensor> ReducedKeysAttention::map_tensors(const char* key_name, const char* value_name,
                                                          const std::vector<int64_t>& per_head_shape) const {
  std::vector<int64_t> shape = {problem_.shape.H};
  shape.insert(shape.end(), per_head_shape.begin(), per_head_shape.end());
  return {DumpTensor{key_name, shape, key_map_.data(), nullptr},
          DumpTensor{value_name, shape, shared_ ? key_map_.data() : value_map_.data(), nullptr}};
}

void ReducedKeysAttention::plan(Mode mode) const {
  if (planned_ && planned_mode_ == mode) return;
  maps_.clear();
  plan_maps(maps_, mode);
  // bf16 with a backward pass: the engine's tiles for the bf16 source (its forward runs the dense
  // kernel, which packs the float inputs itself).
  if (bf16() && (mode == Mode::fwdbwd || tiles16())) core_.plan(mode, qk16_);
  else core_.plan(mode, qk_);
  planned_ = true;
  planned_mode_ = mode;
}

size_t ReducedKeysAttention::reduced_bytes() const {
  return static_cast<size_t>(problem_.shape.B * problem_.shape.H * Nk_ * problem_.shape.D) * sizeof(float);
}

TensorView ReducedKeysAttention::view(const Buffer<float>& buf) const {
  const Shape4 s{problem_.shape.B, problem_.shape.H, Nk_, problem_.shape.D};
  return TensorView{buf.data(), s, Strides3::contiguous(s)};
}

size_t ReducedKeysAttention::working_bytes(Mode mode) const {
  plan(mode);
  return map_bytes() + (mode == Mode::fwdbwd ? 4 : 2) * reduced_bytes() + bf16_bytes(mode) +
         static_cast<size_t>(problem_.threads) * maps_.scratch_per_slot() + core_.working_bytes(mode);
}

void ReducedKeysAttention::setup(Mode mode, Rng& rng) {
  plan(mode);
  const size_t n_map = static_cast<size_t>(problem_.shape.H * map_floats_);
  key_map_ = Buffer<float>(n_map);
  rng.fill_uniform(key_map_.data(), static_cast<int64_t>(n_map), -init_limit_, init_limit_);
  if (!shared_) {
    value_map_ = Buffer<float>(n_map);
    rng.fill_uniform(value_map_.data(), static_cast<int64_t>(n_map), -init_limit_, init_limit_);
  }
  if (problem_.param_grads && mode == Mode::fwdbwd) {
    key_map_grad_ = Buffer<float>(n_map);
    if (!shared_) value_map_grad_ = Buffer<float>(n_map);
  }
  const size_t n = reduced_bytes() / sizeof(float);
  Kr_ = Buffer<float>(n);
  Vr_ = Buffer<float>(n);
  if (mode == Mode::fwdbwd) {
    dKr_ = Buffer<float>(n);
    dVr_ = Buffer<float>(n);
  }
  if (bf16()) {
    // The maps rounded once here for inference (rounding Linformer's maps, 2 H k N floats, 4x K
    // and V at k = 256, D = 64, per call cost more memory traffic than the bf16 product saved);
    // with a backward pass training changes them, so each forward call rounds them again.
    maps_bf16_ = Buffer<uint16_t>((shared_ ? 1 : 2) * n_map);
    round_maps();
    rows_bf16_ = Buffer<uint16_t>(static_cast<size_t>(problem_.threads * problem_.shape.N * problem_.shape.D));
    if (mode == Mode::fwdbwd || tiles16()) {
      const size_t q = static_cast<size_t>(problem_.shape.numel()), r = static_cast<size_t>(problem_.shape.B * problem_.shape.H * Nk_ * problem_.shape.D);
      bwd_bf16_ = Buffer<uint16_t>(2 * q + 2 * r);
    }
    if (mode == Mode::fwdbwd)
      grad_rows_bf16_ = Buffer<uint16_t>(static_cast<size_t>(problem_.threads * Nk_ * problem_.shape.D));
  }
  scratch_ = Buffer<std::byte>(static_cast<size_t>(problem_.threads) * maps_.scratch_per_slot());
  maps_.bind(problem_.threads, scratch_.data());
  core_.setup(mode);
}

void ReducedKeysAttention::round_maps() {
  const size_t n_map = static_cast<size_t>(problem_.shape.H * map_floats_);
  to_bf16_parallel(key_map_.data(), maps_bf16_.data(), static_cast<int64_t>(n_map));
  if (!shared_) to_bf16_parallel(value_map_.data(), maps_bf16_.data() + n_map, static_cast<int64_t>(n_map));
}

void ReducedKeysAttention::forward(const AttnArgs& a) {
  const auto& s = problem_.shape;
  if (bf16() && bwd_bf16_.size()) round_maps();  // training: this step's maps
  // One head's K or V as reduce() reads it: itself, or (bf16) rounded into this thread's rows.
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int tid = omp_get_thread_num();
    const int64_t b = bh / s.H, h = bh % s.H;
    reduce(maps_, tid, h, kKeys, input_rows(tid, a.k.head(b, h)), view(Kr_).head(b, h));
    reduce(maps_, tid, h, kValues, input_rows(tid, a.v.head(b, h)), view(Vr_).head(b, h));
  }
  if (tiles16()) {
    round_reduced(a, true, false);
    const int64_t nq = s.numel(), nr = s.B * s.H * Nk_ * s.D;
    qk16_.bind(bf16_pairs(0, s.N), bf16_pairs(2 * nq, Nk_));
    core_.forward(qk16_, bf16_pairs(2 * nq + nr, Nk_), a.o);
    return;
  }
  qk_.bind(a.q, view(Kr_));
  core_.forward(qk_, view(Vr_), a.o);
}

// bwd_bf16_ holds Q (B H N D), dO (B H N D), K' and V' (B H Nk D), in that order.
void ReducedKeysAttention::round_reduced(const AttnArgs& a, bool inputs, bool dout) {
  const auto& s = problem_.shape;
  const int64_t nq = s.numel(), nr = s.B * s.H * Nk_ * s.D;
  uint16_t *q16 = bwd_bf16_.data(), *do16 = q16 + nq, *kr16 = do16 + nq, *vr16 = kr16 + nr;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh)
    for (int64_t i = 0; i < s.N; ++i) {
      const int64_t b = bh / s.H, h = bh % s.H, at = (bh * s.N + i) * s.D;
      if (inputs) to_bf16(a.q.row(b, h, i), q16 + at, s.D);
      if (dout) to_bf16(a.dout.row(b, h, i), do16 + at, s.D);
    }
  if (!inputs) return;
  to_bf16_parallel(Kr_.data(), kr16, nr);
  to_bf16_parallel(Vr_.data(), vr16, nr);
}

const void* ReducedKeysAttention::input_rows(int tid, const float* X) {
  if (!bf16()) return X;
  const auto& s = problem_.shape;
  uint16_t* rows = rows_bf16_.data() + tid * s.N * s.D;
  for (int64_t t = 0; t < s.N; ++t) to_bf16(X + t * problem_.strides.sn, rows + t * s.D, s.D);
  return rows;
}

TensorView ReducedKeysAttention::bf16_pairs(int64_t offset, int64_t rows) const {
  const auto& s = problem_.shape;
  const Shape4 sh{s.B, s.H, rows, s.D / 2};
  return TensorView{reinterpret_cast<float*>(bwd_bf16_.data() + offset), sh, Strides3::contiguous(sh)};
}

void ReducedKeysAttention::backward(const AttnArgs& a) {
  const auto& s = problem_.shape;
  if (bf16()) {
    // The engine over the reduced keys in bf16: Q, dO, K', V' rounded into contiguous copies
    // (under dropout Q, K', V' are the forward's), dQ, dK', dV' in float.
    const int64_t nq = s.numel(), nr = s.B * s.H * Nk_ * s.D;
    round_reduced(a, !tiles16(), true);  // under dropout Q, K', V' are the forward's
    qk16_.bind(bf16_pairs(0, s.N), bf16_pairs(2 * nq, Nk_));
    qk16_.bind_grads(a.dq, view(dKr_));
    core_.bind_bf16(bf16_pairs(2 * nq + nr, Nk_), bf16_pairs(nq, s.N));
    core_.backward(qk16_, view(Vr_), a.o, a.dout, view(dVr_));
  } else {
    qk_.bind(a.q, view(Kr_));
    qk_.bind_grads(a.dq, view(dKr_));
    core_.backward(qk_, view(Vr_), a.o, a.dout, view(dVr_));
  }
  // The maps' products read dK', dV' (and K, V) as floats, or (bf16) rounded into this thread's
  // rows.
  auto grad_rows = [&](int tid, const float* dXr) -> const void* {
    if (!bf16()) return dXr;
    uint16_t* rows = grad_rows_bf16_.data() + tid * Nk_ * s.D;
    to_bf16(dXr, rows, Nk_ * s.D);
    return rows;
  };
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int tid = omp_get_thread_num();
    const int64_t b = bh / s.H, h = bh % s.H;
    expand(maps_, tid, h, kKeys, grad_rows(tid, view(dKr_).head(b, h)), a.dk.head(b, h));
    expand(maps_, tid, h, kValues, grad_rows(tid, view(dVr_).head(b, h)), a.dv.head(b, h));
  }
  if (!problem_.param_grads) return;
  // The maps' gradients, summed over the batch: one thread per head, the batch in order, so the
  // sum is the same whatever the thread count.
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < s.H; ++h) {
    const int tid = omp_get_thread_num();
    const int64_t n = map_floats_;
    for (int64_t b = 0; b < s.B; ++b) {
      map_backward(maps_, tid, input_rows(tid, a.k.head(b, h)), grad_rows(tid, view(dKr_).head(b, h)),
                   key_map_grad_.data() + h * n, b > 0);
      float* dv_map = (shared_ ? key_map_grad_ : value_map_grad_).data() + h * n;
      map_backward(maps_, tid, input_rows(tid, a.v.head(b, h)), grad_rows(tid, view(dVr_).head(b, h)), dv_map,
                   shared_ || b > 0);
    }
  }
}

}  // namespace ab
