// performer: FAVOR+ positive orthogonal random features.
// Paper: Choromanski et al. 2021, "Rethinking Attention with Performers".
// Complexity: O(N m D) time (feature maps 2 N D m each for Q and K, the core 4 N m D),
//   O(N m) memory per thread; decode O(m D) per token.
// Features: phi(x) = m^(-1/2) exp(Omega x' - ||x'||^2 / 2 - c), x' = x D^(-1/4), with Omega
//   (m, D) built from blocks of D orthogonal rows (Gram-Schmidt QR of a Gaussian matrix), each
//   row rescaled to the norm of an independent Gaussian vector. The stabiliser c is the maximum
//   of the exponent Omega x' - ||x'||^2/2 over features (queries: per row) or over features and
//   sequence (keys: per batch and head; causal: over the prefix a query sees, so no output
//   depends on a later key through eps); it cancels in the ratio up to eps, and the backward
//   pass treats it as a constant, as the reference implementation does (stop-gradient).
// Optimises: Omega x' is a oneDNN matmul; the exponent is one vectorised pass; the rest is the
//   kernel-attention core.
// Training: a fresh Omega every `redraw` steps (the paper's feature redrawing; 0, the default,
//   keeps the first draw).
// RoPE: in RoFormer's form for kernelised attention (section 3.3), phi(q), phi(k) rotated by
//   their positions in the numerator only (the core does it; the model passes AttnProblem::rope).
// Leaves out: the ReLU kernel variant.
#include <algorithm>
#include <cmath>

#include "attention_impls/feature_map_attention.hpp"
#include "attention_impls/registry.hpp"
#include "core/vecmath.hpp"

namespace ab {
namespace {

class Performer final : public FeatureMapAttention {
 public:
  Performer(const AttnProblem& p, const ParamValues& v)
      : FeatureMapAttention(p, v.get_int("features"), v.get_int("chunk")), redraw_(v.get_int("redraw")) {}

  // Training: a fresh Omega every `redraw` steps (the Performer paper's feature redrawing), at
  // steps 1 + redraw, 1 + 2 redraw, ...; step 1 uses setup's draw.
  void begin_train_step(int64_t step, Rng& rng) override {
    if (redraw_ > 0 && step > 1 && (step - 1) % redraw_ == 0) draw_omega(rng, block_.data());
  }

  std::vector<DumpTensor> dump_tensors() const override {
    return {DumpTensor{"omega", {F_, problem_.shape.D}, omega_.data(), nullptr}};
  }

 protected:
  // phi~ = m^(-1/2) exp(u - max u) with u = D^(-1/4) Omega x; logscale = max u - ||x'||^2 / 2.
  void map_features(int tid, const float* X, int64_t ldx, int64_t rows, float* phi,
                    float* logscale) const override {
    if (!mm_.has(spec_u(rows))) {
      // Blocks of a planned size (decode prefill of an unplanned length).
      int64_t i = 0;
      for (; i + C_ <= rows && mm_.has(spec_u(C_)); i += C_)
        map_features(tid, X + i * ldx, ldx, C_, phi + i * F_, logscale + i);
      for (; i < rows; ++i) map_features(tid, X + i * ldx, ldx, 1, phi + i * F_, logscale + i);
      return;
    }
    const int64_t D = problem_.shape.D, m = F_;
    mm_.run(tid, spec_u(rows), X, omega_.data(), phi);
    const float norm = 1.0f / std::sqrt(static_cast<float>(m));
    const float half_inv_sqrt_d = 0.5f / std::sqrt(static_cast<float>(D));
    for (int64_t i = 0; i < rows; ++i) {
      float* u = phi + i * m;
      const float mx = max_of(u, m);
      const float* x = X + i * ldx;
      logscale[i] = mx - half_inv_sqrt_d * dot(x, x, D);
      exp_shift_sum(u, u, m, mx);
      scale_inplace(u, m, norm);
    }
  }
  // dx = D^(-1/4) (dphi * phi) Omega - D^(-1/2) x sum_f(dphi * phi)
  void map_features_backward(int tid, const float* X, int64_t ldx, int64_t rows, const float* phi,
                             float* dphi, float* dX) const override {
    const int64_t D = problem_.shape.D, m = F_;
    const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t i = 0; i < rows; ++i) {
      float* g = dphi + i * m;
      const float* p = phi + i * m;
#pragma omp simd
      for (int64_t f = 0; f < m; ++f) g[f] *= p[f];
    }
    mm_.run(tid, spec_dx(rows), dphi, omega_.data(), dX);
    for (int64_t i = 0; i < rows; ++i) {
      float t = 0;
      const float* g = dphi + i * m;
#pragma omp simd reduction(+ : t)
      for (int64_t f = 0; f < m; ++f) t += g[f];
      const float* x = X + i * ldx;
      float* dx = dX + i * ldx;
      const float a = -inv_sqrt_d * t;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dx[d] += a * x[d];
    }
  }
  double feature_flops(int64_t rows) const override {
    // Omega x' as a product, plus the exponent pass (counted as one multiply-add per feature).
    return 2.0 * rows * problem_.shape.D * F_ + 2.0 * rows * F_;
  }
  void plan_features(MatmulCache& mm, int64_t rows) const override {
    mm.add(spec_u(rows));
    mm.add(spec_dx(rows));
  }
  bool stabilised() const override { return true; }

  // Omega, and with redrawing the Gaussian block its draws orthonormalise.
  size_t feature_param_bytes() const override {
    return static_cast<size_t>(F_ * problem_.shape.D) * sizeof(float) +
           (redraw_ > 0 ? static_cast<size_t>(problem_.shape.D * problem_.shape.D) * sizeof(double) : 0);
  }

  void setup_features(Rng& rng) override {
    const int64_t D = problem_.shape.D;
    omega_ = Buffer<float>(static_cast<size_t>(F_ * D));
    if (redraw_ > 0) {  // kept for the redraws (tracked)
      block_ = Buffer<double>(static_cast<size_t>(D * D));
      draw_omega(rng, block_.data());
    } else {  // needed once, in setup
      std::vector<double> block(static_cast<size_t>(D * D));
      draw_omega(rng, block.data());
    }
  }

 private:
  // Omega (m, D) in blocks of D orthonormal rows, each rescaled to the norm of an independent
  // D-dimensional Gaussian vector; `block` (D x D) holds one block's draws. No allocation.
  void draw_omega(Rng& rng, double* block) {
    const int64_t D = problem_.shape.D, m = F_;
    for (int64_t r0 = 0; r0 < m; r0 += D) {
      // Rows of a Gaussian D x D matrix, orthonormalised (modified Gram-Schmidt = the Q of QR).
      for (int64_t i = 0; i < D * D; ++i) block[i] = rng.normal();
      for (int64_t i = 0; i < D; ++i) {
        double* ri = &block[static_cast<size_t>(i * D)];
        for (int64_t j = 0; j < i; ++j) {
          const double* rj = &block[static_cast<size_t>(j * D)];
          double d = 0;
          for (int64_t k = 0; k < D; ++k) d += ri[k] * rj[k];
          for (int64_t k = 0; k < D; ++k) ri[k] -= d * rj[k];
        }
        double n = 0;
        for (int64_t k = 0; k < D; ++k) n += ri[k] * ri[k];
        n = std::sqrt(n);
        for (int64_t k = 0; k < D; ++k) ri[k] /= n;
      }
      for (int64_t i = 0; i < D && r0 + i < m; ++i) {
        // The row's length: the norm of an independent D-dimensional Gaussian vector.
        double len = 0;
        for (int64_t k = 0; k < D; ++k) {
          const double g = rng.normal();
          len += g * g;
        }
        len = std::sqrt(len);
        for (int64_t k = 0; k < D; ++k)
          omega_[static_cast<size_t>((r0 + i) * D + k)] = static_cast<float>(block[static_cast<size_t>(i * D + k)] * len);
      }
    }
  }

 private:
  // u (rows x m) = D^(-1/4) X Omega^T
  MatmulSpec spec_u(int64_t rows) const {
    const int64_t D = problem_.shape.D;
    return MatmulSpec::tile(rows, F_, D, problem_.strides.sn, false, D, true, F_,
                            1.0f / std::pow(static_cast<float>(D), 0.25f));
  }
  // dX (rows x D) = D^(-1/4) G Omega
  MatmulSpec spec_dx(int64_t rows) const {
    const int64_t D = problem_.shape.D;
    return MatmulSpec::tile(rows, D, F_, F_, false, D, false, problem_.strides.sn,
                            1.0f / std::pow(static_cast<float>(D), 0.25f));
  }

  Buffer<float> omega_;
  Buffer<double> block_;  // redraw > 0: one block's Gaussian draws
  int64_t redraw_;
};

}  // namespace

MechanismInfo performer_info() {
  MechanismInfo m;
  m.name = "performer";
  m.family = "kernel";
  m.summary = "FAVOR+: positive orthogonal random features (Omega seeded, dumped), linear attention core";
  m.complexity = "O(N m D) time, O(N m) memory; decode O(m D) per token";
  m.caps = Capabilities{.exact = false, .causal = true, .backward = true, .decode = true,
                        .constraints = "", .attn_dropout = false, .no_attn_dropout = "it forms no attention probabilities (random features, normalised as a ratio)", .rope = true,
                        .no_rope = "", .rope_feature_maps = true};
  m.params = {ParamSpec{"features", ParamType::Int, int64_t{256}, 1, 65536, {}, "random features m"},
              ParamSpec{"chunk", ParamType::Int, int64_t{64}, 1, 4096, {},
                        "causal chunk length: masked chunk x chunk products inside, running state across"},
              ParamSpec{"redraw", ParamType::Int, int64_t{0}, 0, 1 << 30, {},
                        "training: draw a fresh Omega every this many steps (0: never)"}};
  m.caps.no_additive_bias = "its output is a ratio of random-feature sums and never forms a logit per (query, key) pair to add a bias to";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Performer>(p, v); };
  m.reference = [](const Attention& impl, const AttnArgs& a, const AttnProblem& p, const ParamValues&) {
    const DumpTensor omega = dump_tensor(impl, "omega");
    return ref::performer(a.q, a.k, a.v, p.causal, omega.f32, omega.shape[0], p.rope);
  };
  return m;
}

std::vector<double> ref::performer(const TensorView& q, const TensorView& k, const TensorView& v, bool causal,
                                   const float* omega, int64_t m, bool rope) {
  const Shape4& s = q.shape;
  // u = omega x' - |x'|^2 / 2 with x' = x D^-1/4: the exponent of phi(x) before stabilising, (m).
  auto exponent = [&](const TensorView& x, int64_t b, int64_t h, int64_t n) {
    const double scale = std::pow(double(s.D), -0.25);
    double norm2 = 0;
    for (int64_t d = 0; d < s.D; ++d) norm2 += double(x.at(b, h, n, d)) * x.at(b, h, n, d) * scale * scale;
    std::vector<double> u(static_cast<size_t>(m));
    for (int64_t f = 0; f < m; ++f) {
      double acc = 0;
      for (int64_t d = 0; d < s.D; ++d) acc += double(omega[f * s.D + d]) * x.at(b, h, n, d) * scale;
      u[f] = acc - norm2 / 2;
    }
    return u;
  };
  auto features = [&](const std::vector<double>& u, double stabiliser) {  // m^-1/2 exp(u - c), (m)
    std::vector<double> f(u.size());
    for (size_t x = 0; x < u.size(); ++x) f[x] = std::exp(u[x] - stabiliser) / std::sqrt(double(m));
    return f;
  };
  std::vector<double> out(static_cast<size_t>(s.numel()));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      // 1. exponents; each key row's maximum, and the maximum over all keys
      Rows uq, uk;
      std::vector<double> kmax;
      for (int64_t n = 0; n < s.N; ++n) {
        uq.push_back(exponent(q, b, h, n));
        uk.push_back(exponent(k, b, h, n));
        kmax.push_back(*std::max_element(uk.back().begin(), uk.back().end()));
      }
      const double all_keys = *std::max_element(kmax.begin(), kmax.end());
      // 2. per query: its own stabiliser, the keys' over what it may see, then the ratio
      double seen_max = -1e300;
      for (int64_t i = 0; i < s.N; ++i) {
        seen_max = std::max(seen_max, kmax[i]);
        const double ck = causal ? seen_max : all_keys;
        Rows fk;
        for (int64_t j = 0; j <= (causal ? i : s.N - 1); ++j) fk.push_back(features(uk[j], ck));
        const auto fq = features(uq[i], *std::max_element(uq[i].begin(), uq[i].end()));
        const auto o = feature_ratio(fq, i, fk, v, b, h, rope);
        for (int64_t d = 0; d < s.D; ++d) out[idx(s, b, h, i, d)] = o[d];
      }
    }
  return out;
}

}  // namespace ab
