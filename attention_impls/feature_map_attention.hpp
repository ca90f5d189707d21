// The shared core of the feature-map ("kernel trick", linear-time) family, `linear` and
// `performer`:
//   O_i = phi(q_i)^T S / (phi(q_i)^T z + eps),  S = sum_j phi(k_j) v_j^T (F x D),  z = sum_j phi(k_j)
// over all j (non-causal) or j <= i (causal), forward, backward and recurrent decode. A mechanism
// supplies only its feature map phi and that map's backward.
//
// Causal runs chunk by chunk (Katharopoulos et al. 2020, and the chunked form of later linear
// attention work): inside a chunk the masked C x C product phi(Q_c) phi(K_c)^T, across chunks the
// running state S, z, so everything is a matrix product. The backward pass is chunked the same
// way in both directions (dQ with the prefix state, dK and dV with a suffix state), storing no
// (F, D) state per position. A stabilised map (Performer) brings keys to one common factor: the
// maximum over the sequence without causality, the prefix maximum with it (see
// feature_map_attention.cpp), so that causal outputs never depend on later keys.
//
// RoPE (AttnProblem::rope) in RoFormer's form for kernelised attention (its eq. 19, section 3.3):
//   O_i = sum_j (R_i phi(q_i))^T (R_j phi(k_j)) v_j / (sum_j phi(q_i)^T phi(k_j) + eps)
// R_n rotating pairs of the F features by position n's angles (core/rope.hpp). The numerator's
// products take rotated features (S = sum_j (R_j phi(k_j)) v_j^T), the normaliser keeps the plain
// ones (z = sum_j phi(k_j)), so it stays positive; the numerator may change sign.
#pragma once
#include "attention_impls/attention.hpp"
#include "core/matmul.hpp"

namespace ab {

class FeatureMapAttention : public Attention {
 public:
  double flops(Mode mode) const override;
  size_t working_bytes(Mode mode) const override;
  void setup(Mode mode, Rng& rng) override;
  void forward(const AttnArgs& a) override;
  void backward(const AttnArgs& a) override;
  void decode_prefill(const AttnArgs& a, int64_t n) override;
  void decode_step(const AttnArgs& t, int64_t pos) override;
  void validate() const override;

  static constexpr float kEps = 1e-6f;

 protected:
  FeatureMapAttention(const AttnProblem& p, int64_t features, int64_t chunk);

  // Features of `rows` rows of X (row stride ldx) into phi (rows x F, row stride F), up to a
  // per-row factor: the map's value is phi_i * exp(logscale_i). A map without a stabiliser
  // writes logscale 0. Queries use phi as written (a per-row factor cancels in the ratio); keys
  // are brought to one common factor, the largest logscale, as Performer's stabiliser requires.
  virtual void map_features(int tid, const float* X, int64_t ldx, int64_t rows, float* phi,
                            float* logscale) const = 0;
  // dX (row stride ldx, overwritten) from dphi (rows x F, may be overwritten), given X and the
  // features phi actually used (after the common key factor).
  virtual void map_features_backward(int tid, const float* X, int64_t ldx, int64_t rows,
                                     const float* phi, float* dphi, float* dX) const = 0;
  virtual double feature_flops(int64_t rows) const = 0;
  // Adds the matmuls the map needs for a block of `rows` rows.
  virtual void plan_features(MatmulCache& mm, int64_t rows) const = 0;
  virtual bool stabilised() const = 0;
  // Untimed: the map's random parameters, and their tracked size.
  virtual void setup_features(Rng& rng) { (void)rng; }
  virtual size_t feature_param_bytes() const { return 0; }

  AttnProblem problem_;
  int64_t F_, C_;
  mutable MatmulCache mm_;

 private:
  struct Layout;  // per-thread float offsets
  Layout layout(Mode mode) const;
  void plan(Mode mode) const;
  std::vector<int64_t> chunk_lengths(int64_t n) const;
  static std::vector<int64_t> block_lengths(int64_t n, int64_t block);
  float* thread_ws(int tid) const;
  // RoPE: `rows` feature rows (row stride F) at positions pos0, pos0 + 1, ... rotated in place
  // (inverse: the backward); nothing without AttnProblem::rope.
  void rotate_features(float* phi, int64_t rows, int64_t pos0, bool inverse) const;
  // Numerator features: a rotated copy of phi (rows at positions 0, 1, ...) with RoPE, else phi.
  float* numerator_features(float* phi, float* rotated, int64_t rows) const;

  // Products, named by what they compute (len: rows of the chunk or sequence).
  MatmulSpec spec_QKt(int64_t len) const;     // A = phiQ_c phiK_c^T        (len x len)
  MatmulSpec spec_AV(int64_t len) const;      // O_c = A V_c                 (len x D)
  MatmulSpec spec_QS(int64_t len, bool acc) const;  // O_c (+)= phiQ_c S   (len x D)
  MatmulSpec spec_KtV(int64_t len, bool acc) const; // S (+)= phiK_c^T V_c (F x D)
  MatmulSpec spec_dNumSt(int64_t len, bool acc) const;  // dphiQ (+)= dNum S^T (len x F)
  MatmulSpec spec_QtdNum(int64_t len, bool acc) const;  // dS/R (+)= phiQ^T dNum (F x D)
  MatmulSpec spec_VdSt(int64_t len, bool acc) const;    // dphiK (+)= V dS^T (len x F)
  MatmulSpec spec_KdS(int64_t len, bool acc) const;     // dV (+)= phiK dS (len x D)
  MatmulSpec spec_dNumVt(int64_t len) const;  // G = dNum_c V_c^T           (len x len)
  MatmulSpec spec_GK(int64_t len) const;      // dphiQ_c = G phiK_c          (len x F)
  MatmulSpec spec_GtQ(int64_t len) const;     // dphiK_c = G^T phiQ_c        (len x F)
  MatmulSpec spec_AtdNum(int64_t len) const;  // dV_c = A^T dNum_c           (len x D)

  void prefix_max(const float* ls, int64_t n, float* pmax) const;
  float chunk_factor(const float* pmax, int64_t c0, int64_t len) const;
  void scale_chunk_keys(float* Kc, const float* ls, int64_t len, float c) const;
  float row_eps(const float* pmax, int64_t i, float c) const;
  void scale_state(float* S, float* z, float f) const;
  float enter_chunk(const float* pmax, const float* ls, float* phiK, float* phiKn, int64_t c0, int64_t len,
                    float c_prev, float* S, float* z) const;
  void features_of_keys(int tid, const float* K, int64_t rows, float* phi, float* ls) const;
  // The causal pass over chunks that forward and backward share: per chunk, its keys at the
  // running factor, A = phiQn_c phiKn_c^T (unmasked, numerator features) and den_i, then
  // body(c0, len) with S, z still the state before the chunk, then the state takes the chunk's
  // keys. zrun: F floats of scratch (RoPE's normaliser).
  template <class Body>
  void causal_chunks(int tid, const float* phiQ, float* phiK, const float* phiQn, float* phiKn, const float* V,
                     const float* pmax, const float* ls, float* S, float* z, float* zrun, float* A, float* den,
                     Body&& body) const;
  void forward_head(int tid, const AttnArgs& a, int64_t b, int64_t h) const;
  void backward_head(int tid, const AttnArgs& a, int64_t b, int64_t h) const;

  Mode mode_ = Mode::fwd;
  Buffer<std::byte> scratch_;
  Buffer<float> ws_;      // per-thread workspaces
  Buffer<float> state_;   // decode: two (S, z, C) sets per (b, h)
  const bool rope_;
  const int64_t rope_rows_;  // positions in the RoPE table: N + 1 (decode's new token)
  Buffer<float> rope_table_;  // cos (rope_rows_, F/2) then sin
  int decode_cur_ = 0;
  int64_t decode_committed_ = 0;
  mutable bool planned_ = false;
  mutable Mode planned_mode_ = Mode::fwd;
};

}  // namespace ab
