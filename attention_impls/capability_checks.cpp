#include "attention_impls/capability_checks.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "attention_impls/registry.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"

namespace ab {
namespace {

constexpr uint64_t kStreamInputs = 0x434142ull, kStreamRedraw = 0x52454452ull, kStreamParams = 100;  // "CAB", "REDR"

// One instance at the first length of 256, 128, 64 that the mechanism (with these parameters)
// accepts, B 1, H 2, D 16, causal; nullptr with `why` when none does.
std::unique_ptr<Attention> instance(const MechanismInfo& info, const ParamValues& pv, Mode mode, uint64_t seed, Shape4* shape,
                                    std::string* why, bool causal = true) {
  for (int64_t N : {256, 128, 64}) {
    const Shape4 s{1, 2, N, 16};
    try {
      auto impl = info.make(AttnProblem{s, causal, Strides3::contiguous(s), 1}, pv);
      impl->validate();
      Rng rng(seed, kStreamParams);
      impl->setup(mode, rng);
      *shape = s;
      return impl;
    } catch (const InvalidInput& e) {
      *why = e.what();
    }
  }
  return nullptr;
}

struct Inputs {
  Tensor q, k, v, o;
  explicit Inputs(const Shape4& s) : q(s), k(s), v(s), o(s) {}
  AttnArgs args() const { return AttnArgs{q.view(), k.view(), v.view(), o.view(), {}, {}, {}, {}}; }
};

void fill(Inputs& in, uint64_t seed, uint64_t stream, int64_t from_position) {
  Rng rng(seed, stream);
  const Shape4 s = in.q.shape();
  for (Tensor* t : {&in.q, &in.k, &in.v})
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t n = from_position; n < s.N; ++n)
          for (int64_t d = 0; d < s.D; ++d) t->view().at(b, h, n, d) = static_cast<float>(rng.normal());
}

// The largest |a - b| over positions [first, last] of all heads, relative to b's largest
// magnitude there.
double relative_difference(const Tensor& a, const Tensor& b, int64_t first, int64_t last) {
  const Shape4 s = a.shape();
  double diff = 0, scale = 0;
  for (int64_t bb = 0; bb < s.B; ++bb)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t n = first; n <= last; ++n)
        for (int64_t d = 0; d < s.D; ++d) {
          const double x = a.view().at(bb, h, n, d), y = b.view().at(bb, h, n, d);
          diff = std::max(diff, std::abs(x - y));
          scale = std::max(scale, std::abs(y));
        }
  return scale > 0 ? diff / scale : diff;
}

CapabilityCheck prefix_check(const MechanismInfo& info, const std::vector<std::string>& params, uint64_t seed, bool causal) {
  CapabilityCheck c;
  c.applies = true;
  omp_set_num_threads(1);
  Shape4 s;
  auto impl = instance(info, resolve_params(info, params), Mode::fwd, seed, &s, &c.detail, causal);
  if (!impl) return c;
  c.seq = s.N;
  Inputs full(s);
  fill(full, seed, kStreamInputs, 0);
  impl->forward(full.args());
  c.passed = true;
  // Cut points across the sequence, block and chunk boundaries included.
  for (int64_t cut : {int64_t{0}, s.N / 4 - 1, s.N / 4, s.N / 2 - 1, s.N / 2 + 3, 3 * s.N / 4, s.N - 2}) {
    Inputs other(s);
    for (auto [from, to] : {std::pair{&full.q, &other.q}, std::pair{&full.k, &other.k}, std::pair{&full.v, &other.v}})
      std::copy_n(from->data(), from->size(), to->data());
    fill(other, seed, kStreamRedraw + static_cast<uint64_t>(cut), cut + 1);  // the future redrawn
    impl->forward(other.args());
    const double d = relative_difference(other.o, full.o, 0, cut);
    c.worst = std::max(c.worst, d);
    if (d > kCapabilityTolerance && c.detail.empty()) {
      c.passed = false;
      c.detail = fmt::format("positions 0..{} moved by {:.2e} (relative) when positions {}..{} changed", cut, d, cut + 1, s.N - 1);
    }
  }
  if (!c.passed) return c;
  c.detail = fmt::format("N = {}: the past unchanged by the future to {:.1e}", s.N, c.worst);
  return c;
}
}  // namespace

CapabilityCheck check_causal_prefix(const std::string& mechanism, const std::vector<std::string>& params, uint64_t seed) {
  const MechanismInfo& info = find_mechanism(mechanism);
  if (!info.caps.causal) return CapabilityCheck{};
  return prefix_check(info, params, seed, true);
}

CapabilityCheck check_prefix_without_mask(const std::string& mechanism, const std::vector<std::string>& params, uint64_t seed) {
  return prefix_check(find_mechanism(mechanism), params, seed, false);
}

CapabilityCheck check_decode(const std::string& mechanism, const std::vector<std::string>& params, uint64_t seed) {
  const MechanismInfo& info = find_mechanism(mechanism);
  CapabilityCheck c;
  c.applies = info.caps.decode;
  if (!c.applies) return c;
  omp_set_num_threads(1);
  const ParamValues pv = resolve_params(info, params);
  Shape4 s;
  auto full_impl = instance(info, pv, Mode::fwd, seed, &s, &c.detail);
  if (!full_impl) return c;
  c.seq = s.N;
  Inputs full(s);
  fill(full, seed, kStreamInputs, 0);
  full_impl->forward(full.args());
  c.passed = true;
  for (int64_t prefill : {int64_t{0}, s.N / 2 + 1}) {
    auto impl = info.make(AttnProblem{s, true, Strides3::contiguous(s), 1}, pv);
    Rng rng(seed, kStreamParams);
    impl->setup(Mode::decode, rng);
    Inputs step(s);
    for (auto [from, to] : {std::pair{&full.q, &step.q}, std::pair{&full.k, &step.k}, std::pair{&full.v, &step.v}})
      std::copy_n(from->data(), from->size(), to->data());
    const AttnArgs a = step.args();
    impl->decode_prefill(a, prefill);
    for (int64_t t = prefill; t < s.N; ++t) impl->decode_step(a.token(t), t);
    const double d = relative_difference(step.o, full.o, prefill, s.N - 1);
    c.worst = std::max(c.worst, d);
    if (d > kCapabilityTolerance && c.passed) {
      c.passed = false;
      c.detail = fmt::format("after a prefill of {}, decoded tokens differ from the causal forward by {:.2e} (relative)", prefill, d);
    }
  }
  if (c.passed) c.detail = fmt::format("N = {}: token by token equals the causal forward to {:.1e}", s.N, c.worst);
  return c;
}

}  // namespace ab
