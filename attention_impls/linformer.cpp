// linformer: attention over keys and values projected along the sequence.
// Paper: Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity".
// Complexity: O(N k D) time (projections 2 N k D each for K and V, attention 4 N k D),
//   O(N k) memory for the per-head projections E, F (k, N) plus O(k D) per head.
// Computes: K' = E K, V' = F V (per head, E and F uniform in +-1/sqrt(k), seeded, dumped;
//   share_kv: F = E), O = softmax(s Q K'^T) V'. k is clipped to N.
// Optimises: the projections are oneDNN matmuls per (batch, head); the attention over the k
//   projected keys runs on the tiled online-softmax engine (tiled_softmax.cpp).
// Leaves out: causality (a projection along the sequence mixes future tokens; refused as
//   SKIPPED), layer-wise or head-wise sharing of E beyond share_kv.
#include <omp.h>

#include <cmath>

#include "attention_impls/registry.hpp"
#include "attention_impls/tiled_softmax.hpp"

namespace ab {
namespace {

class Linformer final : public Attention {
 public:
  Linformer(const AttnProblem& p, const ParamValues& v)
      : p_(p),
        k_(std::min<int64_t>(v.get_int("k"), p.shape.N)),
        share_(v.get_bool("share_kv")),
        qk_(p.shape.D, p.strides.sn, p.shape.D, 1.0f / std::sqrt(static_cast<float>(p.shape.D))),
        core_(TiledSoftmaxShape::dense(p.shape.B, p.shape.H, p.shape.N, k_, p.shape.D, false, p.shape.D,
                                p.strides.sn, p.threads)) {}

  double flops(Mode mode) const override {
    const auto& s = p_.shape;
    // Forward: two projections (2 N k D each) and attention over k keys (4 N k D). Backward:
    // the attention's 10 N k D and the two transposed projections (2 N k D each).
    const double nkd = static_cast<double>(s.N) * static_cast<double>(k_) * static_cast<double>(s.D);
    return (mode == Mode::fwd ? 8.0 : 22.0) * nkd * static_cast<double>(s.B * s.H);
  }

  size_t working_bytes(Mode mode) const override {
    plan(mode);
    return param_bytes() + (mode == Mode::fwdbwd ? 4 : 2) * projected_bytes() +
           static_cast<size_t>(p_.threads) * proj_.scratch_per_slot() + core_.working_bytes(mode);
  }

  void setup(Mode mode, Rng& rng) override {
    plan(mode);
    const auto& s = p_.shape;
    const size_t pe = static_cast<size_t>(s.H * k_ * s.N);
    E_ = Buffer<float>(pe);
    const double lim = 1.0 / std::sqrt(static_cast<double>(k_));
    rng.fill_uniform(E_.data(), static_cast<int64_t>(pe), -lim, lim);
    if (!share_) {
      F_ = Buffer<float>(pe);
      rng.fill_uniform(F_.data(), static_cast<int64_t>(pe), -lim, lim);
    }
    const size_t pk = projected_bytes() / sizeof(float);
    Kp_ = Buffer<float>(pk);
    Vp_ = Buffer<float>(pk);
    if (mode == Mode::fwdbwd) {
      dKp_ = Buffer<float>(pk);
      dVp_ = Buffer<float>(pk);
    }
    proj_scratch_ = Buffer<std::byte>(static_cast<size_t>(p_.threads) * proj_.scratch_per_slot());
    proj_.bind(p_.threads, proj_scratch_.data());
    core_.setup(mode);
  }

  // Pass 1: K' = E_h K, V' = F_h V per (b, h). Pass 2: the engine over the k projected keys.
  void forward(const AttnArgs& a) override {
    const auto& s = p_.shape;
    const int64_t BH = s.B * s.H;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int tid = omp_get_thread_num();
      const int64_t b = bh / s.H, h = bh % s.H;
      proj_.run(tid, spec_project(), E(h), a.k.head(b, h), view(Kp_).head(b, h));
      proj_.run(tid, spec_project(), F(h), a.v.head(b, h), view(Vp_).head(b, h));
    }
    qk_.bind(a.q, view(Kp_));
    core_.forward(qk_, view(Vp_), a.o);
  }

  // The engine gives dQ, dK', dV'; then dK = E_h^T dK', dV = F_h^T dV'.
  void backward(const AttnArgs& a) override {
    const auto& s = p_.shape;
    qk_.bind(a.q, view(Kp_));
    qk_.bind_grads(a.dq, view(dKp_));
    core_.backward(qk_, view(Vp_), a.o, a.dout, view(dVp_));
    const int64_t BH = s.B * s.H;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int tid = omp_get_thread_num();
      const int64_t b = bh / s.H, h = bh % s.H;
      proj_.run(tid, spec_unproject(), E(h), view(dKp_).head(b, h), a.dk.head(b, h));
      proj_.run(tid, spec_unproject(), F(h), view(dVp_).head(b, h), a.dv.head(b, h));
    }
  }

  std::vector<DumpTensor> dump_tensors() const override {
    const auto& s = p_.shape;
    return {DumpTensor{"E", {s.H, k_, s.N}, E_.data(), nullptr},
            DumpTensor{"F", {s.H, k_, s.N}, share_ ? E_.data() : F_.data(), nullptr}};
  }

 private:
  // (k, N) x (N, D) -> (k, D)
  MatmulSpec spec_project() const {
    return MatmulSpec::tile(k_, p_.shape.D, p_.shape.N, p_.shape.N, false, p_.strides.sn, false, p_.shape.D);
  }
  // (N, k) = E^T x (k, D) -> (N, D)
  MatmulSpec spec_unproject() const {
    return MatmulSpec::tile(p_.shape.N, p_.shape.D, k_, p_.shape.N, true, p_.shape.D, false, p_.strides.sn);
  }
  void plan(Mode mode) const {
    if (planned_ && planned_mode_ == mode) return;
    proj_.clear();
    proj_.add(spec_project());
    if (mode == Mode::fwdbwd) proj_.add(spec_unproject());
    core_.plan(mode, qk_);
    planned_ = true;
    planned_mode_ = mode;
  }
  size_t param_bytes() const {
    return (share_ ? 1 : 2) * static_cast<size_t>(p_.shape.H * k_ * p_.shape.N) * sizeof(float);
  }
  size_t projected_bytes() const {
    return static_cast<size_t>(p_.shape.B * p_.shape.H * k_ * p_.shape.D) * sizeof(float);
  }
  TensorView view(const Buffer<float>& buf) const {
    const Shape4 s{p_.shape.B, p_.shape.H, k_, p_.shape.D};
    return TensorView{buf.data(), s, Strides3::contiguous(s)};
  }
  const float* E(int64_t h) const { return E_.data() + h * k_ * p_.shape.N; }
  const float* F(int64_t h) const { return (share_ ? E_ : F_).data() + h * k_ * p_.shape.N; }

  AttnProblem p_;
  int64_t k_;
  bool share_;
  QKLogits qk_;
  mutable TiledSoftmax core_;
  mutable MatmulCache proj_;
  mutable bool planned_ = false;
  mutable Mode planned_mode_ = Mode::fwd;
  Buffer<float> E_, F_, Kp_, Vp_, dKp_, dVp_;
  Buffer<std::byte> proj_scratch_;
};

}  // namespace

MechanismInfo linformer_info() {
  MechanismInfo m;
  m.name = "linformer";
  m.family = "low-rank";
  m.summary = "softmax over k projected keys/values: K' = E K, V' = F V (E, F seeded, dumped)";
  m.complexity = "O(N k D) time, O(N k) memory";
  m.caps = Capabilities{.exact = false, .causal = false, .backward = true, .decode = false,
                        .constraints = "k clipped to N"};
  m.params = {ParamSpec{"k", ParamType::Int, int64_t{256}, 1, 1 << 20, {}, "projected length (clipped to N)"},
              ParamSpec{"share_kv", ParamType::Bool, false, 0, 0, {}, "use F = E"}};
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Linformer>(p, v); };
  return m;
}

}  // namespace ab
