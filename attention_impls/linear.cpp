// linear: the Linear Transformer's attention.
// Paper: Katharopoulos et al. 2020, "Transformers are RNNs: Fast Autoregressive Transformers
//   with Linear Attention".
// Computes: phi(x) = elu(x) + 1; O_i = phi(q_i)^T S / (phi(q_i)^T z + eps) with
//   S = sum_j phi(k_j) v_j^T, z = sum_j phi(k_j) over all j, or over j <= i when causal; eps 1e-6.
// Complexity: O(N D^2) time, O(N D) memory per thread; decode O(D^2) time and memory per token,
//   whatever the context length.
// Optimises: phi(x) = elu(x) + 1 is one vectorised pass; the rest is the kernel-attention core
//   (feature_map_attention.cpp): every product a oneDNN matmul, causal chunk by chunk (`chunk`).
// RoPE: in RoFormer's form for kernelised attention (section 3.3), phi(q), phi(k) rotated by
//   their positions in the numerator only (the core does it; the model passes AttnProblem::rope).
// Leaves out: feature maps other than elu + 1; numerator and denominator are not fused into one
//   product (the normaliser is an O(N D) dot per row).
#include <cmath>

#include "attention_impls/feature_map_attention.hpp"
#include "attention_impls/registry.hpp"
#include "core/vecmath.hpp"

namespace ab {
namespace {

class Linear final : public FeatureMapAttention {
 public:
  Linear(const AttnProblem& p, const ParamValues& v)
      : FeatureMapAttention(p, p.shape.D, v.get_int("chunk")) {}

 protected:
  void map_features(int, const float* X, int64_t ldx, int64_t rows, float* phi,
                    float* logscale) const override {
    const int64_t D = problem_.shape.D;
    // Contiguous rows are one flat vector loop.
    const int64_t runs = ldx == D ? 1 : rows, len = ldx == D ? rows * D : D;
    for (int64_t i = 0; i < runs; ++i) {
      const float* x = X + i * ldx;
      float* y = phi + i * D;
      // elu(x) + 1 = exp(min(x, 0)) + max(x, 0), as three unconditional vector passes (GCC
      // vectorises neither exp_f32 inside a select nor a conditional store). exp(0) is exactly 1.
#pragma omp simd
      for (int64_t d = 0; d < len; ++d) y[d] = x[d] < 0.0f ? x[d] : 0.0f;
      exp_shift_sum(y, y, len, 0.0f);
#pragma omp simd
      for (int64_t d = 0; d < len; ++d) y[d] += x[d] > 0.0f ? x[d] : 0.0f;
    }
    fill(logscale, rows, 0.0f);
  }
  // d phi / dx = 1 for x > 0, exp(x) = phi(x) otherwise.
  void map_features_backward(int, const float* X, int64_t ldx, int64_t rows, const float* phi,
                             float* dphi, float* dX) const override {
    const int64_t D = problem_.shape.D;
    const int64_t runs = ldx == D ? 1 : rows, len = ldx == D ? rows * D : D;
    for (int64_t i = 0; i < runs; ++i) {
      const float *x = X + i * ldx, *p = phi + i * D, *g = dphi + i * D;
      float* dx = dX + i * ldx;
#pragma omp simd
      for (int64_t d = 0; d < len; ++d) dx[d] = x[d] > 0.0f ? g[d] : g[d] * p[d];
    }
  }
  double feature_flops(int64_t) const override { return 0; }
  void plan_features(MatmulCache&, int64_t) const override {}
  bool stabilised() const override { return false; }
};

}  // namespace

MechanismInfo linear_info() {
  MechanismInfo m;
  m.name = "linear";
  m.family = "kernel";
  m.summary = "Linear Transformer: phi(x) = elu(x)+1, phi(Q) (phi(K)^T V) normalised; causal chunk-wise";
  m.complexity = "O(N D^2) time, O(N D) memory; decode O(D^2) per token";
  m.caps = Capabilities{.exact = false, .causal = true, .backward = true, .decode = true,
                        .constraints = "", .attn_dropout = false, .no_attn_dropout = "it forms no attention probabilities (a feature map, normalised as a ratio)", .rope = true,
                        .no_rope = "", .rope_feature_maps = true};
  m.params = {ParamSpec{"chunk", ParamType::Int, int64_t{64}, 1, 4096, {},
                        "causal chunk length: masked chunk x chunk products inside, running state across"}};
  m.caps.no_additive_bias = "its output is a ratio of feature-map sums and never forms a logit per (query, key) pair to add a bias to";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Linear>(p, v); };
  m.reference = [](const Attention&, const AttnArgs& a, const AttnProblem& p, const ParamValues&) {
    return ref::linear_attention(a.q, a.k, a.v, p.causal, p.rope);
  };
  return m;
}

std::vector<double> ref::linear_attention(const TensorView& q, const TensorView& k, const TensorView& v, bool causal,
                                          bool rope) {
  const Shape4& s = q.shape;
  auto phi = [&](const TensorView& x, int64_t b, int64_t h, int64_t n) {  // elu(x) + 1, (D)
    std::vector<double> f(static_cast<size_t>(s.D));
    for (int64_t d = 0; d < s.D; ++d) {
      const double e = x.at(b, h, n, d);
      f[d] = e > 0 ? e + 1.0 : std::exp(e);
    }
    return f;
  };
  std::vector<double> out(static_cast<size_t>(s.numel()));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      Rows fk;
      for (int64_t j = 0; j < s.N; ++j) fk.push_back(phi(k, b, h, j));
      for (int64_t i = 0; i < s.N; ++i) {
        const Rows seen(fk.begin(), causal ? fk.begin() + i + 1 : fk.end());
        const auto o = feature_ratio(phi(q, b, h, i), i, seen, v, b, h, rope);
        for (int64_t d = 0; d < s.D; ++d) out[idx(s, b, h, i, d)] = o[d];
      }
    }
  return out;
}

}  // namespace ab
