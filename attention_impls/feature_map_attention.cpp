#include "attention_impls/feature_map_attention.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/params.hpp"
#include "core/rope.hpp"
#include "core/vecmath.hpp"

namespace ab {

namespace {
// The non-causal forward streams keys, then queries, in blocks of this many rows, so features
// live in L2 and never go to memory.
constexpr int64_t kStreamRows = 1024;

// z += column sums of the rows x F matrix X.
void add_colsum(const float* X, int64_t rows, int64_t F, float* z) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* x = X + i * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) z[f] += x[f];
  }
}
// y += a * x
void axpy(float a, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
// Zero the strictly upper triangle of a len x len block (row stride ld): j > i is masked.
void mask_upper(float* A, int64_t len, int64_t ld) {
  for (int64_t i = 0; i < len; ++i) fill(A + i * ld + i + 1, len - i - 1, 0.0f);
}
}  // namespace

// Per-thread workspace, in floats.
struct FeatureMapAttention::Layout {
  size_t phiQ = 0, phiK = 0, lsQ = 0, lsK = 0, S = 0, z = 0, A = 0, den = 0, pmax = 0;
  size_t phiQr = 0, phiKr = 0, zrun = 0;  // RoPE: rotated features, a running key sum
  size_t dphiQ = 0, dphiK = 0, dNum = 0, dden = 0, G = 0, R = 0, r = 0;
  size_t phiq1 = 0, phik1 = 0, ls2 = 0;  // decode
  size_t total = 0;
};

FeatureMapAttention::FeatureMapAttention(const AttnProblem& p, int64_t features, int64_t chunk)
    : problem_(p), F_(features), C_(chunk), rope_(p.rope), rope_rows_(p.shape.N + 1) {}

void FeatureMapAttention::validate() const {
  if (rope_ && F_ % 2)
    throw InvalidInput(fmt::format("--positions rope rotates pairs of feature dimensions; this map has {} features (odd)", F_));
}

void FeatureMapAttention::rotate_features(float* phi, int64_t rows, int64_t pos0, bool inverse) const {
  if (rope_) rope_rotate_rows(phi, rows, F_, F_, rope_table_.data(), rope_rows_, pos0, inverse);
}

float* FeatureMapAttention::numerator_features(float* phi, float* rotated, int64_t rows) const {
  if (!rope_) return phi;
  std::copy_n(phi, rows * F_, rotated);
  rotate_features(rotated, rows, 0, false);
  return rotated;
}

FeatureMapAttention::Layout FeatureMapAttention::layout(Mode mode) const {
  Layout L;
  const size_t N = static_cast<size_t>(problem_.shape.N), F = static_cast<size_t>(F_),
               D = static_cast<size_t>(problem_.shape.D), C = static_cast<size_t>(C_);
  size_t at = 0;
  auto take = [&at](size_t n) {
    size_t o = at;
    at += (n + 15) / 16 * 16;  // keep each array 64-byte aligned
    return o;
  };
  if (mode == Mode::decode) {
    // Prefill works chunk by chunk through phiK/lsK; a step uses one query and one key row.
    L.phiK = take(C * F);
    L.lsK = take(C);
    L.phiq1 = take(F);
    L.phik1 = take(F);
    L.ls2 = take(2);
    L.total = at;
    return L;
  }
  if (mode == Mode::fwd && !problem_.causal) {
    // Streaming forward: one block of features at a time.
    L.phiK = take(static_cast<size_t>(kStreamRows) * F);
    L.lsK = take(static_cast<size_t>(kStreamRows));
    L.S = take(F * D);
    L.z = take(F);
    L.total = at;
    return L;
  }
  L.phiQ = take(N * F);
  L.phiK = take(N * F);
  L.lsQ = take(N);
  L.lsK = take(N);
  L.S = take(F * D);
  L.z = take(F);
  L.den = take(N);
  if (problem_.causal) {
    L.A = take(C * C);
    L.pmax = take(N);
  }
  if (rope_) {
    L.phiQr = take(N * F);
    L.phiKr = take(N * F);
    L.zrun = take(F);
  }
  if (mode == Mode::fwdbwd) {
    L.dphiQ = take(N * F);
    L.dphiK = take(N * F);
    L.dNum = take(N * D);
    L.dden = take(N);
    L.R = take(F * D);
    L.r = take(F);
    if (problem_.causal) L.G = take(C * C);
  }
  L.total = at;
  return L;
}

std::vector<int64_t> FeatureMapAttention::chunk_lengths(int64_t n) const { return block_lengths(n, C_); }

std::vector<int64_t> FeatureMapAttention::block_lengths(int64_t n, int64_t block) {
  std::vector<int64_t> v;
  if (n >= block) v.push_back(block);
  if (n % block) v.push_back(n % block);
  return v;
}

// ---- the products ----
MatmulSpec FeatureMapAttention::spec_QKt(int64_t len) const {
  return MatmulSpec::tile(len, len, F_, F_, false, F_, true, C_);
}
MatmulSpec FeatureMapAttention::spec_AV(int64_t len) const {
  return MatmulSpec::tile(len, problem_.shape.D, len, C_, false, problem_.strides.sn, false, problem_.strides.sn);
}
MatmulSpec FeatureMapAttention::spec_QS(int64_t len, bool acc) const {
  return MatmulSpec::tile(len, problem_.shape.D, F_, F_, false, problem_.shape.D, false, problem_.strides.sn, 1.0f, acc);
}
MatmulSpec FeatureMapAttention::spec_KtV(int64_t len, bool acc) const {
  return MatmulSpec::tile(F_, problem_.shape.D, len, F_, true, problem_.strides.sn, false, problem_.shape.D, 1.0f, acc);
}
MatmulSpec FeatureMapAttention::spec_dNumSt(int64_t len, bool acc) const {
  const int64_t D = problem_.shape.D;
  return MatmulSpec::tile(len, F_, D, D, false, D, true, F_, 1.0f, acc);
}
MatmulSpec FeatureMapAttention::spec_QtdNum(int64_t len, bool acc) const {
  const int64_t D = problem_.shape.D;
  return MatmulSpec::tile(F_, D, len, F_, true, D, false, D, 1.0f, acc);
}
MatmulSpec FeatureMapAttention::spec_VdSt(int64_t len, bool acc) const {
  const int64_t D = problem_.shape.D;
  return MatmulSpec::tile(len, F_, D, problem_.strides.sn, false, D, true, F_, 1.0f, acc);
}
MatmulSpec FeatureMapAttention::spec_KdS(int64_t len, bool acc) const {
  const int64_t D = problem_.shape.D;
  return MatmulSpec::tile(len, D, F_, F_, false, D, false, problem_.strides.sn, 1.0f, acc);
}
MatmulSpec FeatureMapAttention::spec_dNumVt(int64_t len) const {
  const int64_t D = problem_.shape.D;
  return MatmulSpec::tile(len, len, D, D, false, problem_.strides.sn, true, C_);
}
MatmulSpec FeatureMapAttention::spec_GK(int64_t len) const {
  return MatmulSpec::tile(len, F_, len, C_, false, F_, false, F_);
}
MatmulSpec FeatureMapAttention::spec_GtQ(int64_t len) const {
  return MatmulSpec::tile(len, F_, len, C_, true, F_, false, F_);
}
MatmulSpec FeatureMapAttention::spec_AtdNum(int64_t len) const {
  const int64_t D = problem_.shape.D;
  return MatmulSpec::tile(len, D, len, C_, true, D, false, problem_.strides.sn);
}

void FeatureMapAttention::plan(Mode mode) const {
  if (planned_ && planned_mode_ == mode) return;
  mm_.clear();
  const int64_t N = problem_.shape.N;
  if (mode == Mode::decode) {
    for (int64_t len : chunk_lengths(N)) {
      plan_features(mm_, len);
      mm_.add(spec_KtV(len, true));
    }
    plan_features(mm_, 1);
  } else {
    const bool bwd = mode == Mode::fwdbwd;
    if (!problem_.causal) {
      for (int64_t len : block_lengths(N, kStreamRows)) {
        plan_features(mm_, len);
        mm_.add(spec_KtV(len, true));
        mm_.add(spec_QS(len, false));
      }
    } else {
      plan_features(mm_, N);
    }
    if (!problem_.causal) {
      if (bwd) {
        plan_features(mm_, N);
        mm_.add(spec_KtV(N, false));
        mm_.add(spec_dNumSt(N, false));
        mm_.add(spec_QtdNum(N, false));
        mm_.add(spec_VdSt(N, false));
        mm_.add(spec_KdS(N, false));
      }
    } else {
      for (int64_t len : chunk_lengths(N)) {
        mm_.add(spec_QKt(len));
        mm_.add(spec_AV(len));
        mm_.add(spec_QS(len, true));
        mm_.add(spec_KtV(len, true));
        if (bwd) {
          mm_.add(spec_dNumVt(len));
          mm_.add(spec_GK(len));
          mm_.add(spec_dNumSt(len, true));
          mm_.add(spec_GtQ(len));
          mm_.add(spec_VdSt(len, true));
          mm_.add(spec_AtdNum(len));
          mm_.add(spec_KdS(len, true));
          mm_.add(spec_QtdNum(len, true));
        }
      }
    }
  }
  planned_ = true;
  planned_mode_ = mode;
}

double FeatureMapAttention::flops(Mode mode) const {
  const auto& s = problem_.shape;
  const double N = static_cast<double>(s.N), F = static_cast<double>(F_), D = static_cast<double>(s.D);
  const double BH = static_cast<double>(s.B * s.H);
  if (mode == Mode::decode) {
    // Feature maps of one query and one key (rotated with RoPE); S' = S + phi(k) v^T;
    // phi(q)^T S'; normaliser.
    return BH * (2 * feature_flops(1) + 4 * F * D + 4 * F + (rope_ ? 2 * 3 * F : 0));
  }
  double f = 4 * N * F * D + 3 * N * F;
  // RoPE: each of phi(Q), phi(K) rotated (3 flops a feature); causal, the normaliser from a
  // running key sum (2 N F) instead of the rotated products' row sums.
  if (rope_) f += 6 * N * F + (problem_.causal ? 2 * N * F : 0);
  if (problem_.causal) {
    // Intra-chunk: the causal pairs of each chunk through phiQ phiK^T and A V.
    double pairs = 0;
    for (int64_t c0 = 0; c0 < s.N; c0 += C_) {
      const double len = static_cast<double>(std::min(C_, s.N - c0));
      pairs += len * (len + 1) / 2;
    }
    f += pairs * (2 * F + 2 * D);
  }
  // The core's backward is counted at 2.5x its forward (3.5x in all, the softmax convention; the
  // non-causal backward does exactly five products of the forward's two sizes). The feature
  // maps run twice (forward, recomputed in backward) plus their backward, a product of the
  // same size.
  const double maps = 2 * feature_flops(s.N);
  return BH * (mode == Mode::fwd ? f + maps : 3.5 * f + 3 * maps);
}

size_t FeatureMapAttention::working_bytes(Mode mode) const {
  plan(mode);
  const size_t T = static_cast<size_t>(problem_.threads);
  size_t b = T * mm_.scratch_per_slot() + T * layout(mode).total * sizeof(float);
  if (mode == Mode::decode) {
    const auto& s = problem_.shape;
    b += static_cast<size_t>(s.B * s.H) * 2 * static_cast<size_t>(F_ * s.D + F_ + 1) * sizeof(float);
  }
  if (rope_) b += static_cast<size_t>(rope_rows_ * F_) * sizeof(float);
  return b + feature_param_bytes();
}

void FeatureMapAttention::setup(Mode mode, Rng& rng) {
  plan(mode);
  mode_ = mode;
  const int T = problem_.threads;
  scratch_ = Buffer<std::byte>(static_cast<size_t>(T) * mm_.scratch_per_slot());
  mm_.bind(T, scratch_.data());
  ws_ = Buffer<float>(static_cast<size_t>(T) * layout(mode).total);
  if (mode == Mode::decode) {
    const auto& s = problem_.shape;
    state_ = Buffer<float>(static_cast<size_t>(s.B * s.H) * 2 * static_cast<size_t>(F_ * s.D + F_ + 1));
  }
  if (rope_) {
    rope_table_ = Buffer<float>(static_cast<size_t>(rope_rows_ * F_));
    rope_table(rope_rows_, F_, rope_table_.data());
  }
  setup_features(rng);
}

float* FeatureMapAttention::thread_ws(int tid) const {
  return ws_.data() + static_cast<size_t>(tid) * layout(mode_).total;
}

// Key features with one common factor: rows are multiplied by exp(logscale_j - max logscale).
void FeatureMapAttention::features_of_keys(int tid, const float* K, int64_t rows, float* phi, float* ls) const {
  map_features(tid, K, problem_.strides.sn, rows, phi, ls);
  if (!stabilised()) return;
  const float c = max_of(ls, rows);
  for (int64_t j = 0; j < rows; ++j) scale_inplace(phi + j * F_, F_, exp_f32(ls[j] - c));
}

// Causal key scaling. A query may only depend on the keys it attends, so under causality the
// keys' common factor for query i is the prefix maximum P_i of their log-scales (over j <= i),
// not the maximum over the whole sequence, which would let later keys change earlier outputs
// through eps. A chunk is computed at its last row's factor C_c = P_end: its keys are scaled by
// exp(ls_j - C_c), the running state is rescaled by exp(C_prev - C_c) when C_c grows, and row
// i's eps becomes eps * exp(P_i - C_c), which is the same ratio as scaling everything by P_i.
void FeatureMapAttention::prefix_max(const float* ls, int64_t n, float* pmax) const {
  float m = kNegInf;
  for (int64_t i = 0; i < n; ++i) pmax[i] = m = std::max(m, ls[i]);
}

float FeatureMapAttention::chunk_factor(const float* pmax, int64_t c0, int64_t len) const {
  return stabilised() ? pmax[c0 + len - 1] : 0.0f;
}

void FeatureMapAttention::scale_chunk_keys(float* Kc, const float* ls, int64_t len, float c) const {
  if (!stabilised()) return;
  for (int64_t j = 0; j < len; ++j) scale_inplace(Kc + j * F_, F_, exp_f32(ls[j] - c));
}

// Moves the running state S, z from the previous chunk's factor c_prev to this chunk's and
// scales this chunk's key rows to it (the numerator's rotated copy too: a rotation commutes with
// a factor); returns the chunk's factor.
float FeatureMapAttention::enter_chunk(const float* pmax, const float* ls, float* phiK, float* phiKn, int64_t c0,
                                       int64_t len, float c_prev, float* S, float* z) const {
  const float c = chunk_factor(pmax, c0, len);
  if (c0 > 0 && c != c_prev) scale_state(S, z, exp_f32(c_prev - c));
  scale_chunk_keys(phiK + c0 * F_, ls + c0, len, c);
  if (phiKn != phiK) scale_chunk_keys(phiKn + c0 * F_, ls + c0, len, c);
  return c;
}

void FeatureMapAttention::scale_state(float* S, float* z, float f) const {
  scale_inplace(S, F_ * problem_.shape.D, f);
  scale_inplace(z, F_, f);
}

float FeatureMapAttention::row_eps(const float* pmax, int64_t i, float c) const {
  return stabilised() ? kEps * exp_f32(pmax[i] - c) : kEps;
}

void FeatureMapAttention::forward(const AttnArgs& a) {
  for_each_head(problem_.shape, [&](int tid, int64_t b, int64_t h) { forward_head(tid, a, b, h); });
}

void FeatureMapAttention::backward(const AttnArgs& a) {
  for_each_head(problem_.shape, [&](int tid, int64_t b, int64_t h) { backward_head(tid, a, b, h); });
}

// Forward of one (batch, head).
//   non-causal, streaming in blocks of rows:
//     pass 1  per key block: phiK_b; S += phiK_b^T V_b; z += colsum phiK_b (a stabilised map
//             rescales S, z when the running key maximum grows, ending at the global maximum)
//     pass 2  per query block: O_b = phiQ_b S; O_i /= phiQ_i . z + eps
//   causal, per chunk c:  A = phiQ_c phiK_c^T masked (j <= i);  O_c = A V_c + phiQ_c S;
//           den_i = rowsum A_i + phiQ_i . z + eps;  O_c /= den;  S += phiK_c^T V_c;  z += colsum
void FeatureMapAttention::forward_head(int tid, const AttnArgs& a, int64_t b, int64_t h) const {
  const Layout L = layout(mode_);
  float* w = thread_ws(tid);
  float *phiQ = w + L.phiQ, *phiK = w + L.phiK, *S = w + L.S, *z = w + L.z, *den = w + L.den;
  const int64_t N = problem_.shape.N, D = problem_.shape.D, F = F_, ld = problem_.strides.sn;
  const float* V = a.v.head(b, h);
  float* O = a.o.head(b, h);
  if (!problem_.causal) {
    float *phi = phiK, *ls = w + L.lsK;
    const float* K = a.k.head(b, h);
    const float* Q = a.q.head(b, h);
    fill(S, F * D, 0.0f);
    fill(z, F, 0.0f);
    float c = stabilised() ? kNegInf : 0.0f;
    for (int64_t r0 = 0; r0 < N; r0 += kStreamRows) {
      const int64_t len = std::min(kStreamRows, N - r0);
      map_features(tid, K + r0 * ld, ld, len, phi, ls);
      if (stabilised()) {
        const float m = max_of(ls, len);
        if (m > c) {
          if (r0 > 0) scale_state(S, z, exp_f32(c - m));
          c = m;
        }
        scale_chunk_keys(phi, ls, len, c);
      }
      add_colsum(phi, len, F, z);
      rotate_features(phi, len, r0, false);  // RoPE: the numerator's keys only
      mm_.run(tid, spec_KtV(len, true), phi, V + r0 * ld, S);
    }
    for (int64_t r0 = 0; r0 < N; r0 += kStreamRows) {
      const int64_t len = std::min(kStreamRows, N - r0);
      map_features(tid, Q + r0 * ld, ld, len, phi, ls);
      float* inv_den = ls;  // the queries' per-row factor is not needed (it cancels)
      for (int64_t i = 0; i < len; ++i) inv_den[i] = 1.0f / (dot(phi + i * F, z, F) + kEps);
      rotate_features(phi, len, r0, false);
      float* Ob = O + r0 * ld;
      mm_.run(tid, spec_QS(len, false), phi, S, Ob);
      for (int64_t i = 0; i < len; ++i) scale_inplace(Ob + i * ld, D, inv_den[i]);
    }
    return;
  }
  map_features(tid, a.q.head(b, h), ld, N, phiQ, w + L.lsQ);
  const float* ls = w + L.lsK;
  float *A = w + L.A, *pmax = w + L.pmax;
  map_features(tid, a.k.head(b, h), ld, N, phiK, w + L.lsK);
  const float* phiQn = numerator_features(phiQ, w + L.phiQr, N);
  float* phiKn = numerator_features(phiK, w + L.phiKr, N);
  prefix_max(ls, N, pmax);
  causal_chunks(tid, phiQ, phiK, phiQn, phiKn, V, pmax, ls, S, z, w + L.zrun, A, den, [&](int64_t c0, int64_t len) {
    const float* Qc = phiQn + c0 * F;
    float* Oc = O + c0 * ld;
    mask_upper(A, len, C_);
    mm_.run(tid, spec_AV(len), A, V + c0 * ld, Oc);
    if (c0 > 0) mm_.run(tid, spec_QS(len, true), Qc, S, Oc);
    for (int64_t i = 0; i < len; ++i) scale_inplace(Oc + i * ld, D, 1.0f / den[c0 + i]);
  });
}

template <class Body>
void FeatureMapAttention::causal_chunks(int tid, const float* phiQ, float* phiK, const float* phiQn, float* phiKn,
                                        const float* V, const float* pmax, const float* ls, float* S, float* z,
                                        float* zrun, float* A, float* den, Body&& body) const {
  const int64_t N = problem_.shape.N, F = F_, ld = problem_.strides.sn;
  fill(S, F * problem_.shape.D, 0.0f);
  fill(z, F, 0.0f);
  float c = 0.0f;
  for (int64_t c0 = 0; c0 < N; c0 += C_) {
    const int64_t len = std::min(C_, N - c0);
    c = enter_chunk(pmax, ls, phiK, phiKn, c0, len, c, S, z);
    const float *Qc = phiQ + c0 * F, *Kc = phiK + c0 * F;
    mm_.run(tid, spec_QKt(len), phiQn + c0 * F, phiKn + c0 * F, A);
    if (!rope_) {  // den_i = phiQ_i . (z + sum_{j <= i} phiK_j): the row sums of A
      for (int64_t i = 0; i < len; ++i) {
        float d = row_eps(pmax, c0 + i, c) + dot(Qc + i * F, z, F);
        for (int64_t j = 0; j <= i; ++j) d += A[i * C_ + j];
        den[c0 + i] = d;
      }
    } else {  // A holds rotated products: the plain keys' running sum instead
      std::copy_n(z, F, zrun);
      for (int64_t i = 0; i < len; ++i) {
        axpy(1.0f, Kc + i * F, zrun, F);
        den[c0 + i] = row_eps(pmax, c0 + i, c) + dot(Qc + i * F, zrun, F);
      }
    }
    body(c0, len);
    mm_.run(tid, spec_KtV(len, true), phiKn + c0 * F, V + c0 * ld, S);
    add_colsum(Kc, len, F, z);
  }
}

// Backward of one (batch, head), for L = sum(dO * O). With num_i = phiQ_i S_i and
// den_i = phiQ_i . z_i + eps:  dNum_i = dO_i / den_i,  dden_i = -(dO_i . O_i) / den_i.
//   non-causal: dphiQ = dNum S^T + dden z^T;  dS = phiQ^T dNum;  dz = phiQ^T dden;
//               dphiK = V dS^T + 1 dz^T;  dV = phiK dS
//   causal, forward over chunks (prefix S, z):  G = dNum_c V_c^T + dden_c 1^T masked;
//               dphiQ_c = G phiK_c + dNum_c S^T + dden_c z^T
//   causal, backward over chunks (suffix R = sum phiQ^T dNum, r = sum phiQ^T dden):
//               dphiK_c = G^T phiQ_c + V_c R^T + 1 r^T;  dV_c = A^T dNum_c + phiK_c R
//   then the feature maps' backward gives dQ and dK.
// With RoPE the numerator's terms (dNum) act on the rotated features and reach the plain ones
// through the inverse rotation; the normaliser's terms (dden) act on the plain features directly,
// from running sums of the plain keys (forward) and queries (backward) instead of through G.
void FeatureMapAttention::backward_head(int tid, const AttnArgs& a, int64_t b, int64_t h) const {
  const Layout L = layout(mode_);
  float* w = thread_ws(tid);
  float *phiQ = w + L.phiQ, *phiK = w + L.phiK, *S = w + L.S, *z = w + L.z, *den = w + L.den;
  float *dphiQ = w + L.dphiQ, *dphiK = w + L.dphiK, *dNum = w + L.dNum, *dden = w + L.dden;
  float *R = w + L.R, *r = w + L.r;
  const int64_t N = problem_.shape.N, D = problem_.shape.D, F = F_, ld = problem_.strides.sn;
  const float* V = a.v.head(b, h);
  const float* O = a.o.head(b, h);
  const float* dO = a.dout.head(b, h);
  float* dV = a.dv.head(b, h);
  map_features(tid, a.q.head(b, h), ld, N, phiQ, w + L.lsQ);
  if (!problem_.causal) features_of_keys(tid, a.k.head(b, h), N, phiK, w + L.lsK);
  else map_features(tid, a.k.head(b, h), ld, N, phiK, w + L.lsK);
  // The numerator's features (rotated copies with RoPE; the keys' copy scaled with them).
  const float* phiQn = numerator_features(phiQ, w + L.phiQr, N);
  float* phiKn = numerator_features(phiK, w + L.phiKr, N);
  auto set_dnum = [&](int64_t i) {
    const float inv = 1.0f / den[i];
    const float* g = dO + i * ld;
    float* dn = dNum + i * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) dn[d] = g[d] * inv;
    dden[i] = -dot(g, O + i * ld, D) * inv;
  };

  if (!problem_.causal) {
    mm_.run(tid, spec_KtV(N, false), phiKn, V, S);
    fill(z, F, 0.0f);
    add_colsum(phiK, N, F, z);
    for (int64_t i = 0; i < N; ++i) {
      den[i] = dot(phiQ + i * F, z, F) + kEps;
      set_dnum(i);
    }
    mm_.run(tid, spec_dNumSt(N, false), dNum, S, dphiQ);
    rotate_features(dphiQ, N, 0, true);
    for (int64_t i = 0; i < N; ++i) axpy(dden[i], z, dphiQ + i * F, F);
    float* dS = R;  // the suffix state is not needed without causality
    float* dz = r;
    mm_.run(tid, spec_QtdNum(N, false), phiQn, dNum, dS);
    fill(dz, F, 0.0f);
    for (int64_t i = 0; i < N; ++i) axpy(dden[i], phiQ + i * F, dz, F);
    mm_.run(tid, spec_VdSt(N, false), V, dS, dphiK);
    rotate_features(dphiK, N, 0, true);
    for (int64_t j = 0; j < N; ++j) axpy(1.0f, dz, dphiK + j * F, F);
    mm_.run(tid, spec_KdS(N, false), phiKn, dS, dV);
  } else {
    float *A = w + L.A, *G = w + L.G, *pmax = w + L.pmax;
    const float* ls = w + L.lsK;
    prefix_max(ls, N, pmax);
    float* zrun = w + L.zrun;
    // The masked G = dNum_c V_c^T + dden_c 1^T of a chunk (with RoPE dNum_c V_c^T alone: the
    // normaliser's term is not a product of the rotated features).
    auto make_G = [&](int64_t c0, int64_t len) {
      mm_.run(tid, spec_dNumVt(len), dNum + c0 * D, V + c0 * ld, G);
      for (int64_t i = 0; i < len && !rope_; ++i) {
        float* g = G + i * C_;
        const float dd = dden[c0 + i];
        for (int64_t j = 0; j <= i; ++j) g[j] += dd;
      }
      mask_upper(G, len, C_);
    };
    // Keys stay scaled at their chunk's factor for the reverse pass and the map's backward.
    causal_chunks(tid, phiQ, phiK, phiQn, phiKn, V, pmax, ls, S, z, zrun, A, den, [&](int64_t c0, int64_t len) {
      for (int64_t i = 0; i < len; ++i) set_dnum(c0 + i);
      make_G(c0, len);
      float* dQc = dphiQ + c0 * F;
      mm_.run(tid, spec_GK(len), G, phiKn + c0 * F, dQc);
      if (c0 > 0) mm_.run(tid, spec_dNumSt(len, true), dNum + c0 * D, S, dQc);
      if (!rope_) {
        if (c0 > 0)
          for (int64_t i = 0; i < len; ++i) axpy(dden[c0 + i], z, dQc + i * F, F);
      } else {  // d den_i / d phiQ_i = z + sum_{j <= i} phiK_j
        rotate_features(dQc, len, c0, true);
        std::copy_n(z, F, zrun);
        for (int64_t i = 0; i < len; ++i) {
          axpy(1.0f, phiK + (c0 + i) * F, zrun, F);
          axpy(dden[c0 + i], zrun, dQc + i * F, F);
        }
      }
    });
    fill(R, F * D, 0.0f);
    fill(r, F, 0.0f);
    const int64_t last = (N - 1) / C_ * C_;
    float c_next = 0.0f;
    for (int64_t c0 = last; c0 >= 0; c0 -= C_) {
      const int64_t len = std::min(C_, N - c0);
      // R, r sum later chunks' terms, whose keys were at larger factors: bring them to this
      // chunk's factor.
      const float c = chunk_factor(pmax, c0, len);
      if (c0 != last && c != c_next) {
        const float f = exp_f32(c - c_next);
        scale_inplace(R, F * D, f);
        scale_inplace(r, F, f);
      }
      c_next = c;
      const float *Qc = phiQn + c0 * F, *Kc = phiKn + c0 * F, *Vc = V + c0 * ld;
      mm_.run(tid, spec_QKt(len), Qc, Kc, A);
      mask_upper(A, len, C_);
      make_G(c0, len);
      float* dKc = dphiK + c0 * F;
      float* dVc = dV + c0 * ld;
      mm_.run(tid, spec_GtQ(len), G, Qc, dKc);
      mm_.run(tid, spec_AtdNum(len), A, dNum + c0 * D, dVc);
      if (c0 != last) {
        mm_.run(tid, spec_VdSt(len, true), Vc, R, dKc);
        if (!rope_)
          for (int64_t j = 0; j < len; ++j) axpy(1.0f, r, dKc + j * F, F);
        mm_.run(tid, spec_KdS(len, true), Kc, R, dVc);
      }
      mm_.run(tid, spec_QtdNum(len, true), Qc, dNum + c0 * D, R);
      const float* Qplain = phiQ + c0 * F;
      if (rope_) {  // d den_i / d phiK_j summed over i >= j: r + sum_{i >= j in the chunk} dden_i phiQ_i
        rotate_features(dKc, len, c0, true);
        for (int64_t j = len - 1; j >= 0; --j) {
          axpy(dden[c0 + j], Qplain + j * F, r, F);
          axpy(1.0f, r, dKc + j * F, F);
        }
      } else {
        for (int64_t i = 0; i < len; ++i) axpy(dden[c0 + i], Qplain + i * F, r, F);
      }
    }
  }
  map_features_backward(tid, a.q.head(b, h), ld, N, phiQ, dphiQ, a.dq.head(b, h));
  map_features_backward(tid, a.k.head(b, h), ld, N, phiK, dphiK, a.dk.head(b, h));
}

// ---- recurrent decode ----
// State per (b, h): two sets of (S (F x D), z (F), c), the key factor c being the running
// maximum log-scale of the keys folded in. Set `decode_cur_` holds tokens [0, decode_committed_).

void FeatureMapAttention::decode_prefill(const AttnArgs& a, int64_t n) {
  const auto& s = problem_.shape;
  const int64_t D = s.D, F = F_, ld = problem_.strides.sn, BH = s.B * s.H;
  const size_t set = static_cast<size_t>(F * D + F + 1);
  const Layout L = layout(Mode::decode);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int tid = omp_get_thread_num();
    float* w = thread_ws(tid);
    float* S = state_.data() + static_cast<size_t>(bh) * 2 * set;
    float* z = S + F * D;
    float* c = z + F;
    fill(S, F * D + F, 0.0f);
    *c = stabilised() ? kNegInf : 0.0f;
    const float* K = a.k.head(bh / s.H, bh % s.H);
    const float* V = a.v.head(bh / s.H, bh % s.H);
    for (int64_t c0 = 0; c0 < n; c0 += C_) {
      const int64_t len = std::min(C_, n - c0);
      float *phi = w + L.phiK, *ls = w + L.lsK;
      map_features(tid, K + c0 * ld, ld, len, phi, ls);
      if (stabilised()) {
        const float m = max_of(ls, len);
        if (m > *c) {
          scale_inplace(S, F * D + F, exp_f32(*c - m));
          *c = m;
        }
        for (int64_t j = 0; j < len; ++j) scale_inplace(phi + j * F, F, exp_f32(ls[j] - *c));
      }
      add_colsum(phi, len, F, z);
      rotate_features(phi, len, c0, false);  // RoPE: S holds the rotated keys, z the plain ones
      // A prefix shorter than a chunk has no planned product of its length; fold it row by row.
      if (len == C_ || len == s.N % C_) {
        mm_.run(tid, spec_KtV(len, true), phi, V + c0 * ld, S);
      } else {
        for (int64_t j = 0; j < len; ++j)
          for (int64_t f = 0; f < F; ++f) axpy(phi[j * F + f], V + (c0 + j) * ld, S + f * D, D);
      }
    }
  }
  decode_cur_ = 0;
  decode_committed_ = n;
}

// One step: S' = a S + phi(k) v^T, z' = a z + phi(k) (a rescales to a new key maximum);
// o = phi(q)^T S' / (phi(q) . z' + eps). S', z' go to the other set; the next position keeps them.
// With RoPE, S' takes R_pos phi(k) and the numerator R_pos phi(q).
void FeatureMapAttention::decode_step(const AttnArgs& t, int64_t pos) {
  if (pos == decode_committed_ + 1) {
    decode_cur_ ^= 1;
    decode_committed_ = pos;
  } else if (pos != decode_committed_) {
    throw std::logic_error("decode_step: positions must advance one at a time");
  }
  const auto& s = problem_.shape;
  const int64_t D = s.D, F = F_, BH = s.B * s.H;
  const size_t set = static_cast<size_t>(F * D + F + 1);
  const Layout L = layout(Mode::decode);
  const int src = decode_cur_, dst = decode_cur_ ^ 1;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int tid = omp_get_thread_num();
    const int64_t b = bh / s.H, h = bh % s.H;
    float* w = thread_ws(tid);
    float* base = state_.data() + static_cast<size_t>(bh) * 2 * set;
    const float* S0 = base + src * set;
    const float* z0 = S0 + F * D;
    const float c0 = z0[F];
    float* S1 = base + dst * set;
    float* z1 = S1 + F * D;
    float *phiq = w + L.phiq1, *phik = w + L.phik1, *ls = w + L.ls2;
    map_features(tid, t.k.head(b, h), problem_.strides.sn, 1, phik, ls);
    map_features(tid, t.q.head(b, h), problem_.strides.sn, 1, phiq, ls + 1);
    float alpha = 1.0f, c1 = c0;
    if (stabilised()) {
      c1 = std::max(c0, ls[0]);
      alpha = exp_f32(c0 - c1);
      scale_inplace(phik, F, exp_f32(ls[0] - c1));
    }
    const float* v = t.v.head(b, h);
    for (int64_t f = 0; f < F; ++f) z1[f] = alpha * z0[f] + phik[f];
    z1[F] = c1;
    const float inv_den = 1.0f / (dot(phiq, z1, F) + kEps);
    rotate_features(phik, 1, pos, false);
    rotate_features(phiq, 1, pos, false);
    for (int64_t f = 0; f < F; ++f) {
      const float* src_row = S0 + f * D;
      float* dst_row = S1 + f * D;
      const float pk = phik[f];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dst_row[d] = alpha * src_row[d] + pk * v[d];
    }
    float* o = t.o.head(b, h);
    fill(o, D, 0.0f);
    for (int64_t f = 0; f < F; ++f) axpy(phiq[f], S1 + f * D, o, D);
    scale_inplace(o, D, inv_den);
  }
}

}  // namespace ab
