// flash: exact softmax attention, fused and tiled with an online softmax.
// Paper: Dao et al. 2022, "FlashAttention"; backward as in Dao 2023, "FlashAttention-2".
// Complexity: O(N^2 D) time; working memory O(threads * tile) forward, plus O(B H N) for the
//   saved row log-sum-exp and dO.O row sums when the backward pass is wanted.
// Optimises: the N x N score matrix never exists. Each thread takes a block of query rows and
//   streams key/value tiles through L2: S = s Q_i K_j^T and O_i += P V_j are oneDNN matmul
//   primitives on tile shapes (created once per shape), the softmax between them is one
//   vectorised pass per row (max, exp, sum, rescale). Causal skips tiles above the diagonal.
//   Backward recomputes P tile by tile from the saved log-sum-exp. Decode: the new token against
//   a key-value cache, tile by tile with the same online softmax.
// Leaves out: splitting one head's key range across threads in the backward pass (threads take
//   whole heads there, so B*H below the thread count leaves threads idle), low precision.
#include <omp.h>

#include <cmath>
#include <limits>
#include <map>

#include "attention_impls/kv_cache.hpp"
#include "attention_impls/registry.hpp"
#include "core/matmul.hpp"
#include "core/vecmath.hpp"

namespace ab {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tile sizes: a forward S tile of 128 x 256 floats (128 KiB) plus the K and V tiles (64 KiB each
// at D = 64) stay in a 1 MiB L2; the backward pass keeps two score-sized tiles, so it uses
// smaller ones.
constexpr int64_t kFwdRows = 128, kFwdCols = 256;
constexpr int64_t kBwdRows = 64, kBwdCols = 128;
constexpr int64_t kDecodeTile = 256;

// The matmul primitives of one (rows, cols) tile shape.
struct TileOps {
  Matmul qk;                  // S(rows, cols) = s Q_i K_j^T
  Matmul pv;                  // O_i(rows, D) += P V_j                 (forward)
  Matmul dv, dp, dq, dk;      // backward
};

class Flash final : public Attention {
 public:
  explicit Flash(const AttnProblem& p) : p_(p) {}

  double flops(Mode mode) const override {
    if (mode == Mode::decode) return softmax_decode_flops(p_.shape, p_.shape.N + 1);
    return with_backward(dense_attention_flops(p_), mode);
  }

  size_t working_bytes(Mode mode) const override {
    if (mode == Mode::decode)
      return KvCache::bytes(p_.shape, p_.shape.N + 1) +
             static_cast<size_t>(p_.threads) * kDecodeTile * sizeof(float);
    plan(mode);
    const auto& s = p_.shape;
    const size_t T = static_cast<size_t>(p_.threads);
    size_t b = T * scratch_per_thread_ + T * tile_floats(mode) * sizeof(float);
    if (mode == Mode::fwdbwd) b += 2 * static_cast<size_t>(s.B * s.H * s.N) * sizeof(float);
    return b;
  }

  void setup(Mode mode, Rng&) override {
    if (mode == Mode::decode) {
      cache_.allocate(p_.shape, p_.shape.N + 1);
      tiles_ = Buffer<float>(static_cast<size_t>(p_.threads) * kDecodeTile);
      return;
    }
    plan(mode);
    const auto& s = p_.shape;
    const int T = p_.threads;
    scratch_ = Buffer<std::byte>(static_cast<size_t>(T) * scratch_per_thread_);
    tiles_ = Buffer<float>(static_cast<size_t>(T) * tile_floats(mode));
    if (mode == Mode::fwdbwd) {
      lse_ = Buffer<float>(static_cast<size_t>(s.B * s.H * s.N));
      delta_ = Buffer<float>(static_cast<size_t>(s.B * s.H * s.N));
    }
    // Each thread's slot t of every primitive uses scratch region t.
    for (auto& [key, ops] : ops_)
      for (Matmul* m : {&ops.qk, &ops.pv, &ops.dv, &ops.dp, &ops.dq, &ops.dk})
        if (m->spec().M) m->bind(T, scratch_.data(), scratch_per_thread_);
  }

  void forward(const AttnArgs& a) override;
  void backward(const AttnArgs& a) override;
  void decode_prefill(const AttnArgs& a, int64_t n) override { cache_.prefill(a, n); }
  void decode_step(const AttnArgs& t, int64_t pos) override;

 private:
  // Per-thread floats: forward S tile + running max and sum; backward P and dS tiles.
  size_t tile_floats(Mode mode) const {
    size_t f = static_cast<size_t>(kFwdRows * kFwdCols + 2 * kFwdRows);
    if (mode == Mode::fwdbwd) f = std::max(f, static_cast<size_t>(2 * kBwdRows * kBwdCols));
    return f;
  }

  const TileOps& ops(int64_t rows, int64_t cols) const { return ops_.at({rows, cols}); }

  void plan(Mode mode) const {
    if (planned_ && (plan_mode_ == mode || plan_mode_ == Mode::fwdbwd)) return;
    const auto& s = p_.shape;
    const int64_t ld = p_.strides.sn, D = s.D, N = s.N;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    ops_.clear();
    auto sizes = [N](int64_t block) {
      std::vector<int64_t> v;
      if (N >= block) v.push_back(block);
      if (N % block) v.push_back(N % block);
      return v;
    };
    for (int64_t rows : sizes(kFwdRows))
      for (int64_t cols : sizes(kFwdCols)) {
        TileOps& t = ops_[{rows, cols}];
        t.qk = Matmul(MatmulSpec::tile(rows, cols, D, ld, false, ld, true, kFwdCols, scale));
        t.pv = Matmul(MatmulSpec::tile(rows, D, cols, kFwdCols, false, ld, false, ld, 1.0f, true));
      }
    if (mode == Mode::fwdbwd) {
      for (int64_t rows : sizes(kBwdRows))
        for (int64_t cols : sizes(kBwdCols)) {
          // Backward tiles are keyed with a negative row count to keep them apart from the
          // forward ones of the same shape (their leading dimensions differ).
          TileOps& t = ops_[{-rows, cols}];
          const int64_t lt = kBwdCols;
          t.qk = Matmul(MatmulSpec::tile(rows, cols, D, ld, false, ld, true, lt, scale));
          t.dv = Matmul(MatmulSpec::tile(cols, D, rows, lt, true, ld, false, ld, 1.0f, true));
          t.dp = Matmul(MatmulSpec::tile(rows, cols, D, ld, false, ld, true, lt, 1.0f));
          t.dq = Matmul(MatmulSpec::tile(rows, D, cols, lt, false, ld, false, ld, scale, true));
          t.dk = Matmul(MatmulSpec::tile(cols, D, rows, lt, true, ld, false, ld, scale, true));
        }
    }
    size_t scratch = 0;
    for (auto& [key, t] : ops_)
      for (const Matmul* m : {&t.qk, &t.pv, &t.dv, &t.dp, &t.dq, &t.dk})
        scratch = std::max(scratch, m->scratchpad_bytes());
    // Round each thread's region to a cache line so threads never share one.
    scratch_per_thread_ = (scratch + 63) / 64 * 64;
    planned_ = true;
    plan_mode_ = mode;
  }

  AttnProblem p_;
  mutable std::map<std::pair<int64_t, int64_t>, TileOps> ops_;
  mutable size_t scratch_per_thread_ = 0;
  mutable bool planned_ = false;
  mutable Mode plan_mode_ = Mode::fwd;
  Buffer<std::byte> scratch_;
  Buffer<float> tiles_, lse_, delta_;
  KvCache cache_;
};

// Decode: the new token against the key-value cache, tile by tile with the online softmax, so
// only one tile of scores exists per thread.
void Flash::decode_step(const AttnArgs& t, int64_t pos) {
  const auto& s = p_.shape;
  const int64_t D = s.D, BH = s.B * s.H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    cache_.store(b, h, pos, t.k.head(b, h), t.v.head(b, h));
    const float* q = t.q.head(b, h);
    float* sc = tiles_.data() + static_cast<size_t>(omp_get_thread_num()) * kDecodeTile;
    float* o = t.o.head(b, h);
    fill(o, D, 0.0f);
    float m = kNegInf, l = 0.0f;
    for (int64_t c0 = 0; c0 <= pos; c0 += kDecodeTile) {
      const int64_t cols = std::min(kDecodeTile, pos + 1 - c0);
      for (int64_t j = 0; j < cols; ++j) sc[j] = scale * dot(q, cache_.key(b, h, c0 + j), D);
      const float m_new = std::max(m, max_of(sc, cols));
      const float correction = exp_f32(m - m_new);
      l = l * correction + exp_shift_sum(sc, sc, cols, m_new);
      scale_inplace(o, D, correction);
      for (int64_t j = 0; j < cols; ++j) {
        const float p = sc[j];
        const float* v = cache_.value(b, h, c0 + j);
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
      }
      m = m_new;
    }
    scale_inplace(o, D, 1.0f / l);
  }
}

// Forward, per (batch, head, query block) work item:
//   pass 1  S = s Q_i K_j^T                       (matmul, rows x cols)
//   pass 2  per row: causal mask, new max m', P = exp(S - m'), l = l e^(m - m') + sum(P),
//           O_i row *= e^(m - m')                 (one vectorised sweep)
//   pass 3  O_i += P V_j                          (matmul with accumulation)
//   finally O_i /= l, and lse = m + log l is kept for the backward pass.
void Flash::forward(const AttnArgs& a) {
  const auto& s = p_.shape;
  const int64_t N = s.N, D = s.D, nq = (N + kFwdRows - 1) / kFwdRows;
  const int64_t items = s.B * s.H * nq;
  const bool causal = p_.causal;
  float* lse_all = lse_.data();
  const size_t per_thread = tile_floats(plan_mode_);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t it = 0; it < items; ++it) {
    const int tid = omp_get_thread_num();
    const int64_t bh = it / nq, qb = it % nq, b = bh / s.H, h = bh % s.H;
    const int64_t r0 = qb * kFwdRows, rows = std::min(kFwdRows, N - r0);
    float* S = tiles_.data() + static_cast<size_t>(tid) * per_thread;
    float* m = S + kFwdRows * kFwdCols;
    float* l = m + kFwdRows;
    const float* Q = a.q.row(b, h, r0);
    const float* K = a.k.head(b, h);
    const float* V = a.v.head(b, h);
    float* O = a.o.row(b, h, r0);
    const int64_t ldo = a.o.strides.sn;
    for (int64_t r = 0; r < rows; ++r) {
      m[r] = kNegInf;
      l[r] = 0.0f;
      fill(O + r * ldo, D, 0.0f);
    }
    const int64_t key_end = causal ? r0 + rows : N;
    for (int64_t c0 = 0; c0 < key_end; c0 += kFwdCols) {
      const int64_t cols = std::min(kFwdCols, N - c0);
      const TileOps& t = ops(rows, cols);
      t.qk.run(tid, Q, K + c0 * a.k.strides.sn, S);
      for (int64_t r = 0; r < rows; ++r) {
        float* Sr = S + r * kFwdCols;
        // Keys c0 .. c0+valid-1 are admissible for query r0+r.
        const int64_t valid = causal ? std::min(cols, r0 + r - c0 + 1) : cols;
        if (valid <= 0) {
          fill(Sr, cols, 0.0f);
          continue;
        }
        const float m_new = std::max(m[r], max_of(Sr, valid));
        const float correction = exp_f32(m[r] - m_new);  // 0 on the first tile (m = -inf)
        const float sum = exp_shift_sum(Sr, Sr, valid, m_new);
        if (valid < cols) fill(Sr + valid, cols - valid, 0.0f);
        l[r] = l[r] * correction + sum;
        if (correction != 1.0f) scale_inplace(O + r * ldo, D, correction);
        m[r] = m_new;
      }
      t.pv.run(tid, S, V + c0 * a.v.strides.sn, O);
    }
    float* lse = lse_all ? lse_all + bh * N + r0 : nullptr;
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      scale_inplace(O + r * ldo, D, inv);
      if (lse) lse[r] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
    }
  }
}

// Backward, per (batch, head) (FlashAttention-2 order: key tiles outer, query tiles inner):
//   pass 0  delta_i = rowsum(dO_i * O_i)
//   for each key tile j, query tile i:
//   pass 1  S = s Q_i K_j^T;  P = exp(S - lse_i) (masked)      (recomputed, not stored)
//   pass 2  dV_j += P^T dO_i;  dP = dO_i V_j^T                 (matmuls)
//   pass 3  dS = P * (dP - delta_i)                            (elementwise)
//   pass 4  dQ_i += s dS K_j;  dK_j += s dS^T Q_i              (matmuls)
void Flash::backward(const AttnArgs& a) {
  const auto& s = p_.shape;
  const int64_t N = s.N, D = s.D, BH = s.B * s.H;
  const bool causal = p_.causal;
  const size_t per_thread = tile_floats(Mode::fwdbwd);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int tid = omp_get_thread_num();
    const int64_t b = bh / s.H, h = bh % s.H;
    float* P = tiles_.data() + static_cast<size_t>(tid) * per_thread;
    float* dS = P + kBwdRows * kBwdCols;
    const float* lse = lse_.data() + bh * N;
    float* delta = delta_.data() + bh * N;
    for (int64_t i = 0; i < N; ++i) {
      delta[i] = dot(a.dout.row(b, h, i), a.o.row(b, h, i), D);
      fill(a.dq.row(b, h, i), D, 0.0f);
      fill(a.dk.row(b, h, i), D, 0.0f);
      fill(a.dv.row(b, h, i), D, 0.0f);
    }
    for (int64_t c0 = 0; c0 < N; c0 += kBwdCols) {
      const int64_t cols = std::min(kBwdCols, N - c0);
      const float* Kj = a.k.row(b, h, c0);
      const float* Vj = a.v.row(b, h, c0);
      float* dKj = a.dk.row(b, h, c0);
      float* dVj = a.dv.row(b, h, c0);
      const int64_t r_start = causal ? (c0 / kBwdRows) * kBwdRows : 0;
      for (int64_t r0 = r_start; r0 < N; r0 += kBwdRows) {
        const int64_t rows = std::min(kBwdRows, N - r0);
        const TileOps& t = ops(-rows, cols);
        const float* Qi = a.q.row(b, h, r0);
        const float* dOi = a.dout.row(b, h, r0);
        t.qk.run(tid, Qi, Kj, P);
        for (int64_t r = 0; r < rows; ++r) {
          float* Pr = P + r * kBwdCols;
          const int64_t valid = causal ? std::min(cols, r0 + r - c0 + 1) : cols;
          const float shift = lse[r0 + r];
          if (valid <= 0 || shift == kNegInf) {
            fill(Pr, cols, 0.0f);
            continue;
          }
          exp_shift_sum(Pr, Pr, valid, shift);
          if (valid < cols) fill(Pr + valid, cols - valid, 0.0f);
        }
        t.dv.run(tid, P, dOi, dVj);
        t.dp.run(tid, dOi, Vj, dS);
        for (int64_t r = 0; r < rows; ++r) {
          const float* Pr = P + r * kBwdCols;
          float* dSr = dS + r * kBwdCols;
          const float dr = delta[r0 + r];
#pragma omp simd
          for (int64_t c = 0; c < cols; ++c) dSr[c] = Pr[c] * (dSr[c] - dr);
        }
        t.dq.run(tid, dS, Kj, a.dq.row(b, h, r0));
        t.dk.run(tid, dS, Qi, dKj);
      }
    }
  }
}

}  // namespace

MechanismInfo flash_info() {
  MechanismInfo m;
  m.name = "flash";
  m.family = "exact";
  m.summary = "softmax attention, tiled with an online softmax; scores never materialised";
  m.complexity = "O(N^2 D) time, O(N D) memory";
  m.caps = Capabilities{.exact = true, .causal = true, .backward = true, .decode = true,
                        .constraints = ""};
  m.make = [](const AttnProblem& p, const ParamValues&) { return std::make_unique<Flash>(p); };
  return m;
}

}  // namespace ab
