// vanilla: softmax attention with the score matrix materialised.
// Paper: Vaswani et al. 2017, "Attention Is All You Need".
// Computes: O = softmax(s Q K^T + M) V, s = 1/sqrt(D), M = -inf above the diagonal when causal.
// Complexity: O(N^2 D) time, O(B H N^2) memory (the full (B, H, N, N) score tensor, as the
//   PyTorch default of the efficient-Transformer papers' era held it).
// Optimises: the order of the forward's passes. The whole score tensor is still materialised
//   (it is what the backward reads), but it is written a block of query rows at a time, and each
//   block is softmax-normalised and multiplied by V while it is still in cache, instead of three
//   passes over a tensor far larger than the caches. The backward pass runs each step over the
//   whole tensor, as a framework does: oneDNN's batched matmuls, and the softmax backward as one
//   vectorised pass per row (core's RowSoftmax; oneDNN's own is a reference loop without AVX-512).
// Decode: a key-value cache of every token; the new token's scores are materialised.
// Leaves out: fusion and tiling of the key axis (a block holds whole rows of scores, so no
//   online softmax); that is `flash`. Causal runs the full N^2 products and masks, as a framework
//   does, so its GFLOP/s on useful (causal) FLOPs is about half.
// bf16 (--dtype bf16): Q, K, V rounded to bf16 (pass 0), both products oneDNN bf16 matmuls with
//   float output, the softmax in float, P rounded to bf16 for its product with V (pass 3b): what
//   a framework's bf16 autocast does. Backward: dO and dS rounded, the four products in bf16, the
//   softmax backward and every gradient in float. Attention dropout as in float32: the mask on the
//   float probabilities, P·M rounded for its product with V, dP~ masked in float.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention_impls/kv_cache.hpp"
#include "attention_impls/position_bias.hpp"
#include "attention_impls/registry.hpp"
#include "core/vecmath.hpp"
#include "core/matmul.hpp"

namespace ab {
namespace {

class Vanilla final : public Attention {
 public:
  explicit Vanilla(const AttnProblem& p)
      : problem_(p), bias_(p.bias, p.shape, p.causal, 1.0f / std::sqrt(static_cast<float>(p.shape.D)), p.threads) {}

  double flops(Mode mode) const override {
    if (mode == Mode::decode) return softmax_decode_flops(problem_.shape, problem_.shape.N + 1);
    return with_backward(dense_attention_flops(problem_), mode);
  }

  // Causal: the whole N x N product, masked afterwards.
  std::optional<double> admissible_fraction() const override {
    const double n = static_cast<double>(problem_.shape.N);
    return dense_pairs(problem_.shape.N, problem_.causal) / (n * n);
  }

  size_t working_bytes(Mode mode) const override {
    if (mode == Mode::decode) return KvCache::bytes(problem_.shape, problem_.shape.N + 1) + decode_scores_bytes();
    const Plan& pl = plan(mode);
    return scores_bytes() * (mode == Mode::fwd ? 1 : 2) + pl.scratch_bytes + bf16_bytes(mode) +
           pl.block_scratch_bytes * static_cast<size_t>(problem_.threads) + bias_.working_bytes(mode);
  }

  void setup(Mode mode, Rng& rng) override {
    if (mode == Mode::decode) {
      if (bias_.active()) throw InvalidInput("vanilla decodes without a position encoding (the model adds it in its forward pass only)");
      cache_.allocate(problem_.shape, problem_.shape.N + 1);
      scores_ = Buffer<float>(decode_scores_bytes() / sizeof(float));
      return;
    }
    Plan& pl = plan(mode);
    scores_ = Buffer<float>(scores_bytes() / sizeof(float));
    if (mode == Mode::fwdbwd) dscores_ = Buffer<float>(scores_bytes() / sizeof(float));
    if (bf16()) bf16_ = Buffer<uint16_t>(bf16_bytes(mode) / sizeof(uint16_t));
    scratch_ = Buffer<std::byte>(pl.scratch_bytes);
    for (Matmul* m : {&pl.qk, &pl.pv, &pl.dv, &pl.dp, &pl.dq, &pl.dk})
      if (m->spec().M) m->bind(1, scratch_.data());
    pl.softmax.bind(scratch_.data());
    // The row blocks' products: one slot (and scratchpad) per thread.
    block_scratch_ = Buffer<std::byte>(pl.block_scratch_bytes * static_cast<size_t>(problem_.threads));
    for (Matmul* m : {&pl.qk_block, &pl.pv_block, &pl.qk_last, &pl.pv_last})
      if (m->spec().M) m->bind(problem_.threads, block_scratch_.data(), pl.block_scratch_bytes);
    bias_.setup(mode, rng);
  }

  // For each (batch, head) and block of R query rows (the threads share the blocks out):
  //   pass 1  S_blk = s Q_blk K^T     (R, N), into the materialised scores    (oneDNN)
  //   pass 1' with a position encoding, its bias added to each row (position_bias.hpp)
  //   pass 2  causal: P[i, j > i] = 0 (the softmax of -inf), the row's softmax over j <= i
  //   pass 3  P_blk = softmax(S_blk) by rows, in place
  //   pass 3' with dropout, the dropped probabilities P~ = P * M go to the backward pass's
  //           buffer (it has one in fwdbwd mode; fwd mode drops in place), so P stays for it
  //   pass 4  O_blk = P_blk V          (R, D)                                  (oneDNN)
  void forward(const AttnArgs& a) override {
    const Plan& pl = *plan_;
    if (bf16()) {
      forward_bf16(a);
      return;
    }
    const auto& s = problem_.shape;
    const int64_t N = s.N, R = pl.block_rows, blocks = (N + R - 1) / R, items = s.B * s.H * blocks;
    float* dropped = dscores_.data() ? dscores_.data() : scores_.data();
    bias_.prepare(a.q);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int tid = omp_get_thread_num();
      const int64_t bh = it / blocks, b = bh / s.H, h = bh % s.H, r0 = it % blocks * R, rows = std::min(R, N - r0);
      const bool last = rows < R;
      float* S = scores_.data() + (bh * N + r0) * N;
      // Pass 1.
      (last ? pl.qk_last : pl.qk_block).run(tid, a.q.row(b, h, r0), a.k.head(b, h), S);
      // Pass 1'.
      if (bias_.active())
        for (int64_t r = 0; r < rows; ++r) bias_.add_row(b, h, r0 + r, KeyPositions{}, N, S + r * N);
      // Passes 2, 3, 3'.
      for (int64_t r = 0; r < rows; ++r) {
        float* row = S + r * N;
        const int64_t i = r0 + r, used = problem_.causal ? i + 1 : N;
        if (used < N) fill(row + used, N - used, 0.0f);  // exp(-inf): what the mask leaves
        const float m = max_of(row, used);
        scale_inplace(row, used, 1.0f / exp_shift_sum(row, row, used, m));
        if (dropout_.active()) {
          float* d = dropped + (bh * N + i) * N;
          if (d != row) std::memcpy(d, row, static_cast<size_t>(N) * sizeof(float));
          dropout_.apply(d, N, bh * N + i, 0);
        }
      }
      // Pass 4.
      const float* P = (dropout_.active() ? dropped : scores_.data()) + (bh * N + r0) * N;
      (last ? pl.pv_last : pl.pv_block).run(tid, P, a.v.head(b, h), a.o.row(b, h, r0));
    }
  }

  void set_dropout(const Dropout& d) override { dropout_ = d; }

  void validate() const override {
    if (bf16() && !(problem_.strides == Strides3::contiguous(problem_.shape)))
      throw InvalidInput("vanilla --dtype bf16 needs contiguous (B, H, N, D) inputs");
    if (bf16() && problem_.bias.active()) throw InvalidInput("vanilla adds a position encoding in float32 only (no --dtype bf16)");
  }

  void decode_prefill(const AttnArgs& a, int64_t n) override { cache_.prefill(a, n); }

  // The new token's key and value go into the cache; its scores against every cached key are
  // materialised (pos + 1 floats per head), softmax-normalised, and weight the cached values.
  void decode_step(const AttnArgs& t, int64_t pos) override {
    const auto& s = problem_.shape;
    const int64_t BH = s.B * s.H, cap = cache_.capacity();
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int64_t b = bh / s.H, h = bh % s.H;
      cache_.store(b, h, pos, t.k.head(b, h), t.v.head(b, h));
      attend_cached(
          t.q.head(b, h), pos + 1, s.D, [&](int64_t j) { return cache_.key(b, h, j); },
          [&](int64_t j) { return cache_.value(b, h, j); }, scores_.data() + bh * cap, t.o.head(b, h));
    }
  }

  // dV = P^T dO; dP = dO V^T; dS = softmax_backward(P, dP); dQ = s dS K; dK = s dS^T Q.
  // With dropout: dV = P~^T dO (P~ in the dscores buffer), dP~ = dO V^T, dP = dP~ * M.
  // With a position encoding: dS summed into its gradients by offset, and Shaw's term of dQ.
  void backward(const AttnArgs& a) override {
    const Plan& pl = *plan_;
    if (bf16()) {
      backward_bf16(a);
      return;
    }
    pl.dv.run(0, dropout_.active() ? dscores_.data() : scores_.data(), a.dout.data, a.dv.data);
    pl.dp.run(0, a.dout.data, a.v.data, dscores_.data());
    if (dropout_.active())
      for_each_score_row(dscores_.data(), dscores_.data(), [&](float* row, int64_t r) { dropout_.apply(row, problem_.shape.N, r, 0); });
    pl.softmax.backward(scores_.data(), dscores_.data());
    pl.dq.run(0, dscores_.data(), a.k.data, a.dq.data);
    pl.dk.run(0, dscores_.data(), a.q.data, a.dk.data);
    if (bias_.active()) {
      bias_.begin_backward();
      const auto& s = problem_.shape;
      const int64_t N = s.N;
#pragma omp parallel for schedule(static) num_threads(problem_.threads)
      for (int64_t bh = 0; bh < s.B * s.H; ++bh)
        for (int64_t i = 0; i < N; ++i)
          bias_.accumulate_row(omp_get_thread_num(), bh / s.H, bh % s.H, i, KeyPositions{}, N, dscores_.data() + (bh * N + i) * N);
      bias_.finish_backward(a.q, a.dq, problem_.param_grads);
    }
  }
  std::vector<LearnedTensor> learned() override { return bias_.learned(); }
  std::vector<DumpTensor> dump_tensors() const override { return bias_.dump_tensors(); }

 private:
  // f(row of dst, r) for every score row r = (b H + h) N + i, dst's row a copy of src's first
  // (when they differ).
  template <class F>
  void for_each_score_row(const float* src, float* dst, F&& f) const {
    const int64_t rows = problem_.shape.B * problem_.shape.H * problem_.shape.N, N = problem_.shape.N;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      if (dst != src) std::memcpy(dst + r * N, src + r * N, static_cast<size_t>(N) * sizeof(float));
      f(dst + r * N, r);
    }
  }

  bool bf16() const { return problem_.dtype == Dtype::bf16; }
  // bf16: Q, K, V (B H N D each) and P (B H N N), as 16-bit numbers; backward, also dO (and dS
  // in P's place once dV is made).
  size_t bf16_bytes(Mode mode) const {
    if (!bf16()) return 0;
    const auto& s = problem_.shape;
    return static_cast<size_t>((mode == Mode::fwdbwd ? 4 : 3) * s.numel() + s.B * s.H * s.N * s.N) * sizeof(uint16_t);
  }

  // The bf16 backward, the float one's passes with bf16 products: dO to bf16; dV = P^T dO (P
  // the forward's bf16 copy); dP = dO V^T (float); dS = softmax_backward(P, dP) in float; dS to
  // bf16 (into P's copy, used); dQ = s dS K, dK = s dS^T Q (bf16 products, float gradients).
  void backward_bf16(const AttnArgs& a) {
    const Plan& pl = *plan_;
    const int64_t n = problem_.shape.numel(), nn = problem_.shape.B * problem_.shape.H * problem_.shape.N * problem_.shape.N;
    uint16_t *q = bf16_.data(), *k = q + n, *v = k + n, *probs = v + n, *dout = probs + nn;
    to_bf16_parallel(a.dout.data, dout, n);
    pl.dv.run(0, probs, dout, a.dv.data);  // with dropout the forward rounded P * M
    pl.dp.run(0, dout, v, dscores_.data());
    if (dropout_.active())
      for_each_score_row(dscores_.data(), dscores_.data(), [&](float* row, int64_t r) { dropout_.apply(row, problem_.shape.N, r, 0); });
    pl.softmax.backward(scores_.data(), dscores_.data());
    uint16_t* ds = probs;
    to_bf16_parallel(dscores_.data(), ds, nn);
    pl.dq.run(0, ds, k, a.dq.data);
    pl.dk.run(0, ds, q, a.dk.data);
  }

  // Pass 0: Q, K, V to bf16. Pass 1: S = s Q K^T (bf16 product, float S). Pass 2: causal mask.
  // Pass 3: P = softmax(S) in float, in place. Pass 3' with dropout, P~ = P * M into the
  // backward's buffer (fwd mode: in place), as the float path. Pass 3b: P (or P~) to bf16.
  // Pass 4: O = P V (bf16 product, float O).
  void forward_bf16(const AttnArgs& a) {
    const Plan& pl = *plan_;
    const int64_t n = problem_.shape.numel(), nn = problem_.shape.B * problem_.shape.H * problem_.shape.N * problem_.shape.N;
    uint16_t *q = bf16_.data(), *k = q + n, *v = k + n, *probs = v + n;
    to_bf16_parallel(a.q.data, q, n);
    to_bf16_parallel(a.k.data, k, n);
    to_bf16_parallel(a.v.data, v, n);
    pl.qk.run(0, q, k, scores_.data());
    if (problem_.causal) mask_upper(scores_.data());
    pl.softmax.forward(scores_.data());
    const float* P = scores_.data();
    if (dropout_.active()) {
      float* dropped = dscores_.data() ? dscores_.data() : scores_.data();
      for_each_score_row(scores_.data(), dropped, [&](float* row, int64_t r) { dropout_.apply(row, problem_.shape.N, r, 0); });
      P = dropped;
    }
    to_bf16_parallel(P, probs, nn);
    pl.pv.run(0, probs, v, a.o.data);
  }

  struct Plan {
    Matmul qk, pv;          // the batched products of the bf16 forward (empty in float)
    Matmul dv, dp, dq, dk;  // the backward's batched products (fwdbwd)
    RowSoftmax softmax;
    size_t scratch_bytes = 0;
    // The f32 forward's row blocks: R rows, and the N mod R rows of the last block.
    int64_t block_rows = 0;
    Matmul qk_block, pv_block, qk_last, pv_last;
    size_t block_scratch_bytes = 0;  // per thread
  };

  size_t decode_scores_bytes() const {
    return static_cast<size_t>(problem_.shape.B * problem_.shape.H * (problem_.shape.N + 1)) * sizeof(float);
  }

  size_t scores_bytes() const {
    const auto& s = problem_.shape;
    return static_cast<size_t>(s.B * s.H * s.N * s.N) * sizeof(float);
  }

  // Primitive descriptors are created here, before any allocation, because their scratchpad
  // sizes are part of the declared working memory.
  Plan& plan(Mode mode) const {
    if (plan_ && plan_mode_ == mode) return *plan_;
    const auto& s = problem_.shape;
    const auto& st = problem_.strides;
    const int64_t N = s.N, NN = N * N;
    const std::array<int64_t, 4> rowm{st.sb, st.sh, st.sn, 1}, colm{st.sb, st.sh, 1, st.sn};
    const std::array<int64_t, 4> sc{s.H * NN, NN, N, 1}, scT{s.H * NN, NN, 1, N};
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
    auto spec = [&](int64_t M, int64_t Nn, int64_t K, std::array<int64_t, 4> A,
                    std::array<int64_t, 4> B, std::array<int64_t, 4> C, float alpha) {
      MatmulSpec m;
      m.b0 = s.B;
      m.b1 = s.H;
      m.M = M;
      m.N = Nn;
      m.K = K;
      m.a = A;
      m.b = B;
      m.c = C;
      m.alpha = alpha;
      m.single_thread = false;
      return m;
    };
    auto pl = std::make_unique<Plan>();
    if (bf16()) {  // the float forward takes row blocks (below) instead
      pl->qk = Matmul(spec(N, N, s.D, rowm, colm, sc, scale).with_bf16_inputs());
      pl->pv = Matmul(spec(N, s.D, N, sc, rowm, rowm, 1.0f).with_bf16_inputs());
    }
    const bool bwd = mode == Mode::fwdbwd;
    if (bwd) {  // bf16: the same products on bf16 copies (contiguous: the strides are theirs too)
      auto typed = [&](const MatmulSpec& m) { return bf16() ? m.with_bf16_inputs() : m; };
      pl->dv = Matmul(typed(spec(N, s.D, N, scT, rowm, rowm, 1.0f)));
      pl->dp = Matmul(typed(spec(N, N, s.D, rowm, colm, sc, 1.0f)));
      pl->dq = Matmul(typed(spec(N, s.D, N, sc, rowm, rowm, scale)));
      pl->dk = Matmul(typed(spec(N, s.D, N, scT, rowm, rowm, scale)));
    }
    pl->softmax = RowSoftmax(s.B * s.H * N, N);
    // Row blocks of about 1 MiB of scores (16 to 256 rows): on the Zen 5, blocks of 1 to 8 MiB
    // ran alike and 128-512 KiB ones 5-15% slower at N = 2048 and 4096 (one thread, forward).
    pl->block_rows = std::min(N, std::clamp<int64_t>((1024 * 1024 / 4 / N) / 16 * 16, 16, 256));
    auto block_specs = [&](int64_t rows, Matmul& qk_m, Matmul& pv_m) {
      qk_m = Matmul(MatmulSpec::tile(rows, N, s.D, st.sn, false, st.sn, true, N, scale));
      pv_m = Matmul(MatmulSpec::tile(rows, s.D, N, N, false, st.sn, false, st.sn));
      for (const Matmul* m : {&qk_m, &pv_m}) pl->block_scratch_bytes = std::max(pl->block_scratch_bytes, m->scratchpad_bytes());
    };
    if (!bf16()) {
      block_specs(pl->block_rows, pl->qk_block, pl->pv_block);
      if (N % pl->block_rows) block_specs(N % pl->block_rows, pl->qk_last, pl->pv_last);
    }
    size_t scratch = pl->softmax.scratchpad_bytes();
    for (const Matmul* m : {&pl->qk, &pl->pv, &pl->dv, &pl->dp, &pl->dq, &pl->dk})
      scratch = std::max(scratch, m->scratchpad_bytes());
    pl->scratch_bytes = scratch;
    plan_ = std::move(pl);
    plan_mode_ = mode;
    return *plan_;
  }

  void mask_upper(float* S) const {
    const int64_t N = problem_.shape.N, rows = problem_.shape.B * problem_.shape.H * N;
    const float ninf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % N;
      float* row = S + r * N;
      for (int64_t j = i + 1; j < N; ++j) row[j] = ninf;
    }
  }

  AttnProblem problem_;
  Dropout dropout_;
  mutable std::unique_ptr<Plan> plan_;
  mutable Mode plan_mode_ = Mode::fwd;
  Buffer<float> scores_, dscores_;
  Buffer<uint16_t> bf16_;
  Buffer<std::byte> scratch_, block_scratch_;
  KvCache cache_;
  PositionBias bias_;
};

}  // namespace

MechanismInfo vanilla_info() {
  MechanismInfo m;
  m.name = "vanilla";
  m.family = "exact";
  m.summary = "softmax attention, (B,H,N,N) scores materialised, oneDNN matmuls + softmax";
  m.complexity = "O(N^2 D) time, O(N^2) memory";
  m.caps = Capabilities{.exact = true, .causal = true, .backward = true, .decode = true,
                        .constraints = "", .attn_dropout = true, .no_attn_dropout = ""};
  m.caps.additive_bias = true;
  m.caps.no_additive_bias = "";
  m.bf16 = Bf16Support{.available = true, .constraints = "forward and backward, with attention dropout; contiguous inputs",
                       .backward = true, .attn_dropout = true};
  m.make = [](const AttnProblem& p, const ParamValues&) { return std::make_unique<Vanilla>(p); };
  // Every pair (with causal, every earlier key and itself).
  m.reference_mask = [](const ParamValues&, int64_t, bool causal) { return ref::dense_mask(causal); };
  return m;
}

}  // namespace ab
