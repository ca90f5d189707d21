// linformer: attention over keys and values projected along the sequence.
// Paper: Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity".
// Complexity: O(N k D) time (projections 2 N k D each for K and V, attention 4 N k D),
//   O(N k) memory for the per-head projections E, F (k, N) plus O(k D) per head.
// Computes: K' = E K, V' = F V (per head, E and F uniform in +-1/sqrt(k), seeded, dumped;
//   share_kv: F = E), O = softmax(s Q K'^T) V'. k is clipped to N.
// Optimises: the projections are oneDNN matmuls per (batch, head); the attention over the k
//   projected keys runs on the tiled online-softmax engine (reduced_keys.cpp, tiled_softmax.cpp).
// bf16 (--dtype bf16): E, F (once at setup; training: every forward call), K and V rounded to bf16,
//   the projections oneDNN bf16 matmuls with float output, the attention in the engine's bf16
//   dense kernel (under attention dropout its bf16 tiles). Backward: the attention over the
//   projected keys in the engine's bf16 tiles; E^T dK', F^T dV' and the gradients of E and F
//   (dK' K^T, dV' V^T) bf16 products too, dK', dV', K and V rounded per head, float output.
// Training: E and F are learned (their gradients with param_grads, summed over the batch).
// Leaves out: causality (a projection along the sequence mixes future tokens; refused as
//   SKIPPED), layer-wise or head-wise sharing of E beyond share_kv.
#include <algorithm>
#include <cmath>

#include "attention_impls/registry.hpp"
#include "attention_impls/reduced_keys.hpp"

namespace ab {
namespace {

class Linformer final : public ReducedKeysAttention {
 public:
  Linformer(const AttnProblem& p, const ParamValues& v)
      : ReducedKeysAttention(p, projected(p, v), projected(p, v) * p.shape.N,
                             1.0 / std::sqrt(static_cast<double>(projected(p, v))), v.get_bool("share_kv")) {}

  double flops(Mode mode) const override {
    const auto& s = problem_.shape;
    // Forward: two projections (2 N k D each) and attention over k keys (4 N k D). Backward:
    // the attention's 10 N k D and the two transposed projections (2 N k D each).
    const double nkd = static_cast<double>(s.N) * static_cast<double>(Nk_) * static_cast<double>(s.D);
    return (mode == Mode::fwd ? 8.0 : 22.0) * nkd * static_cast<double>(s.B * s.H) + param_grad_flops(mode);
  }

  std::vector<DumpTensor> dump_tensors() const override {
    const auto& s = problem_.shape;
    return map_tensors("E", "F", {Nk_, s.N});
  }

 protected:
  void plan_maps(MatmulCache& mm, Mode mode) const override {
    mm.add(spec_project());
    if (mode == Mode::fwdbwd) mm.add(spec_unproject());
    if (mode == Mode::fwdbwd && problem_.param_grads)
      for (bool acc : {false, true}) mm.add(spec_map_grad(acc));
  }
  const char* mechanism() const override { return "linformer"; }
  std::pair<const char*, const char*> map_names() const override { return {"E", "F"}; }
  // dE_h (+)= dK' K^T: (k, D) x (D, N); in a bf16 call bf16 products (the base rounds K and dK').
  void map_backward(const MatmulCache& mm, int tid, const void* X, const void* dXr, float* dMap,
                    bool accumulate) const override {
    mm.run(tid, spec_map_grad(accumulate), dXr, X, dMap);
  }
  double map_backward_flops() const override {
    return 2.0 * static_cast<double>(Nk_) * static_cast<double>(problem_.shape.N) * static_cast<double>(problem_.shape.D);
  }
  // K' = E_h K, V' = F_h V
  void reduce(const MatmulCache& mm, int tid, int64_t h, Which which, const void* X, float* Xr) const override {
    mm.run(tid, spec_project(), input_map(h, which), X, Xr);
  }
  // dK = E_h^T dK', dV = F_h^T dV'
  void expand(const MatmulCache& mm, int tid, int64_t h, Which which, const void* dXr, float* dX) const override {
    mm.run(tid, spec_unproject(), input_map(h, which), dXr, dX);
  }

 private:
  // dMap(k, N) (+)= dXr(k, D) X(N, D)^T
  MatmulSpec spec_map_grad(bool acc) const {
    return with_input_type(
        MatmulSpec::tile(Nk_, problem_.shape.N, problem_.shape.D, problem_.shape.D, false, ld_input(), true, problem_.shape.N, 1.0f, acc));
  }
  // k, clipped to N.
  static int64_t projected(const AttnProblem& p, const ParamValues& v) { return std::min<int64_t>(v.get_int("k"), p.shape.N); }
  // (k, N) x (N, D) -> (k, D)
  MatmulSpec spec_project() const {
    return with_input_type(MatmulSpec::tile(Nk_, problem_.shape.D, problem_.shape.N, problem_.shape.N, false, ld_input(), false, problem_.shape.D));
  }
  // (N, k) = E^T x (k, D) -> (N, D)
  MatmulSpec spec_unproject() const {
    return with_input_type(MatmulSpec::tile(problem_.shape.N, problem_.shape.D, Nk_, problem_.shape.N, true, problem_.shape.D, false, problem_.strides.sn));
  }
};

}  // namespace

MechanismInfo linformer_info() {
  MechanismInfo m;
  m.name = "linformer";
  m.family = "low-rank";
  m.summary = "softmax over k projected keys/values: K' = E K, V' = F V (E, F seeded, dumped)";
  m.complexity = "O(N k D) time, O(N k) memory";
  m.caps = Capabilities{.exact = false, .causal = false, .backward = true, .decode = false,
                        .constraints = "k clipped to N", .attn_dropout = true, .no_attn_dropout = ""};
  m.bf16 = Bf16Support{.available = true,
                       .constraints = "forward and backward (the maps' backward products too), with attention "
                                      "dropout (then in bf16 tiles, not the dense kernel); D of 16, 32, 64 or 128",
                       .backward = true,
                       .attn_dropout = true};
  m.params = {ParamSpec{"k", ParamType::Int, int64_t{256}, 1, 1 << 20, {}, "projected length (clipped to N)"},
              ParamSpec{"share_kv", ParamType::Bool, false, 0, 0, {}, "use F = E"}};
  m.caps.no_additive_bias = "its keys are learned mixtures of all positions (E K), so a logit has no key position to take an offset from";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Linformer>(p, v); };
  m.reference = [](const Attention& impl, const AttnArgs& a, const AttnProblem&, const ParamValues&) {
    const DumpTensor E = dump_tensor(impl, "E"), F = dump_tensor(impl, "F");
    return ref::linformer(a.q, a.k, a.v, E.f32, F.f32, E.shape[1]);
  };
  return m;
}

std::vector<double> ref::linformer(const TensorView& q, const TensorView& k, const TensorView& v, const float* E,
                                   const float* F, int64_t rank) {
  const Shape4& s = q.shape;
  std::vector<double> out(static_cast<size_t>(s.numel()));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      // K' = E_h K, V' = F_h V: (rank, D) each
      Rows kp(static_cast<size_t>(rank), std::vector<double>(static_cast<size_t>(s.D), 0.0)), vp = kp;
      for (int64_t t = 0; t < rank; ++t)
        for (int64_t j = 0; j < s.N; ++j)
          for (int64_t d = 0; d < s.D; ++d) {
            kp[t][d] += double(E[(h * rank + t) * s.N + j]) * k.at(b, h, j, d);
            vp[t][d] += double(F[(h * rank + t) * s.N + j]) * v.at(b, h, j, d);
          }
      put_head(out, s, b, h, attend(q, b, h, kp, vp));
    }
  return out;
}

}  // namespace ab
