#include "attention_impls/reduced_keys.hpp"

#include <omp.h>

#include <cmath>

namespace ab {

ReducedKeysAttention::ReducedKeysAttention(const AttnProblem& p, int64_t reduced, int64_t map_floats,
                                           double init_limit, bool shared)
    : p_(p),
      Nk_(reduced),
      qk_(p.shape.D, p.strides.sn, p.shape.D, 1.0f / std::sqrt(static_cast<float>(p.shape.D))),
      core_(TiledSoftmaxShape::dense(p.shape.B, p.shape.H, p.shape.N, reduced, p.shape.D, false, p.shape.D,
                                     p.strides.sn, p.threads)),
      map_floats_(map_floats),
      init_limit_(init_limit),
      shared_(shared) {}

// The maps, and with param_grads their gradients.
size_t ReducedKeysAttention::map_bytes() const {
  return (p_.param_grads ? 2 : 1) * (shared_ ? 1 : 2) * static_cast<size_t>(p_.shape.H * map_floats_) * sizeof(float);
}

std::vector<LearnedTensor> ReducedKeysAttention::learned() {
  const auto [key_name, value_name] = map_names();
  const int64_t n = p_.shape.H * map_floats_;
  std::vector<LearnedTensor> out = {{key_name, key_map_.data(), key_map_grad_.data(), n}};
  if (!shared_) out.push_back({value_name, value_map_.data(), value_map_grad_.data(), n});
  return out;
}

double ReducedKeysAttention::param_grad_flops(Mode mode) const {
  if (mode != Mode::fwdbwd || !p_.param_grads) return 0;
  return 2.0 * map_backward_flops() * static_cast<double>(p_.shape.B * p_.shape.H);
}

const float* ReducedKeysAttention::map(int64_t h, Which which) const {
  return (which == kKeys || shared_ ? key_map_ : value_map_).data() + h * map_floats_;
}

std::vector<DumpTensor> ReducedKeysAttention::map_tensors(const char* key_name, const char* value_name,
                                                          const std::vector<int64_t>& per_head_shape) const {
  std::vector<int64_t> shape = {p_.shape.H};
  shape.insert(shape.end(), per_head_shape.begin(), per_head_shape.end());
  return {DumpTensor{key_name, shape, key_map_.data(), nullptr},
          DumpTensor{value_name, shape, shared_ ? key_map_.data() : value_map_.data(), nullptr}};
}

void ReducedKeysAttention::plan(Mode mode) const {
  if (planned_ && planned_mode_ == mode) return;
  maps_.clear();
  plan_maps(maps_, mode);
  core_.plan(mode, qk_);
  planned_ = true;
  planned_mode_ = mode;
}

size_t ReducedKeysAttention::reduced_bytes() const {
  return static_cast<size_t>(p_.shape.B * p_.shape.H * Nk_ * p_.shape.D) * sizeof(float);
}

TensorView ReducedKeysAttention::view(const Buffer<float>& buf) const {
  const Shape4 s{p_.shape.B, p_.shape.H, Nk_, p_.shape.D};
  return TensorView{buf.data(), s, Strides3::contiguous(s)};
}

size_t ReducedKeysAttention::working_bytes(Mode mode) const {
  plan(mode);
  return map_bytes() + (mode == Mode::fwdbwd ? 4 : 2) * reduced_bytes() +
         static_cast<size_t>(p_.threads) * maps_.scratch_per_slot() + core_.working_bytes(mode);
}

void ReducedKeysAttention::setup(Mode mode, Rng& rng) {
  plan(mode);
  const size_t n_map = static_cast<size_t>(p_.shape.H * map_floats_);
  key_map_ = Buffer<float>(n_map);
  rng.fill_uniform(key_map_.data(), static_cast<int64_t>(n_map), -init_limit_, init_limit_);
  if (!shared_) {
    value_map_ = Buffer<float>(n_map);
    rng.fill_uniform(value_map_.data(), static_cast<int64_t>(n_map), -init_limit_, init_limit_);
  }
  if (p_.param_grads && mode == Mode::fwdbwd) {
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
  scratch_ = Buffer<std::byte>(static_cast<size_t>(p_.threads) * maps_.scratch_per_slot());
  maps_.bind(p_.threads, scratch_.data());
  core_.setup(mode);
}

void ReducedKeysAttention::forward(const AttnArgs& a) {
  const auto& s = p_.shape;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int tid = omp_get_thread_num();
    const int64_t b = bh / s.H, h = bh % s.H;
    reduce(maps_, tid, h, kKeys, a.k.head(b, h), view(Kr_).head(b, h));
    reduce(maps_, tid, h, kValues, a.v.head(b, h), view(Vr_).head(b, h));
  }
  qk_.bind(a.q, view(Kr_));
  core_.forward(qk_, view(Vr_), a.o);
}

void ReducedKeysAttention::backward(const AttnArgs& a) {
  const auto& s = p_.shape;
  qk_.bind(a.q, view(Kr_));
  qk_.bind_grads(a.dq, view(dKr_));
  core_.backward(qk_, view(Vr_), a.o, a.dout, view(dVr_));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int tid = omp_get_thread_num();
    const int64_t b = bh / s.H, h = bh % s.H;
    expand(maps_, tid, h, kKeys, view(dKr_).head(b, h), a.dk.head(b, h));
    expand(maps_, tid, h, kValues, view(dVr_).head(b, h), a.dv.head(b, h));
  }
  if (!p_.param_grads) return;
  // The maps' gradients, summed over the batch: one thread per head, the batch in order, so the
  // sum is the same whatever the thread count.
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < s.H; ++h) {
    const int tid = omp_get_thread_num();
    const int64_t n = map_floats_;
    for (int64_t b = 0; b < s.B; ++b) {
      map_backward(maps_, tid, a.k.head(b, h), view(dKr_).head(b, h), key_map_grad_.data() + h * n, b > 0);
      float* dv_map = (shared_ ? key_map_grad_ : value_map_grad_).data() + h * n;
      map_backward(maps_, tid, a.v.head(b, h), view(dVr_).head(b, h), dv_map, shared_ || b > 0);
    }
  }
}

}  // namespace ab
