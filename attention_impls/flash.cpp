// flash: exact softmax attention, fused and tiled with an online softmax.
// Paper: Dao et al. 2022, "FlashAttention"; backward as in Dao 2023, "FlashAttention-2".
// Computes: the same O = softmax(s Q K^T + M) V as vanilla, to float32 rounding.
// Complexity: O(N^2 D) time; working memory O(threads * tile) forward, plus B H N D floats for
//   the dense kernel's transposed keys, plus O(B H N) for the saved row log-sum-exp and dO.O
//   row sums when the backward pass is wanted.
// Optimises: the N x N score matrix never exists. Each thread takes a block of query rows and
//   streams key/value tiles through L2 (the engine in tiled_softmax.cpp). On AVX-512 with D of
//   16, 32, 64 or 128 and no attention dropout, forward runs the engine's dense kernel: the keys
//   transposed once per call, then 6 query rows at a time against a 512-key tile with the
//   scores in registers and L1, the row maxima taken from the product's registers and the
//   exponential folded into one FMA and a 2^t polynomial (0.92-1.02 of the one-thread GEMM rate
//   from N = 2048 on a Zen 5, docs/measurements/amd-epyc-zen5.md). Elsewhere, and for the
//   backward pass, S = s Q_i K_j^T and O_i += P V_j are oneDNN matmul primitives on tile shapes
//   (created once per shape) with one vectorised softmax pass per row between them. Causal
//   skips tiles above the diagonal.
//   Backward recomputes P tile by tile from the saved log-sum-exp; threads take whole heads, or,
//   when B*H does not divide over them, parts of each head's key tiles with a partial dQ each
//   (TiledSoftmax::key_parts). Decode: the new token against a key-value cache, tile by tile
//   with the same online softmax.
// Leaves out: a fused backward kernel (the backward is still oneDNN tiles, in bf16 too).
// bf16 (--dtype bf16, AVX512-BF16): the dense kernel with Q, K, V rounded to bf16 once per call,
//   both products by vdpbf16ps (two bf16 products added into each float lane), the softmax and
//   its statistics in float, the probabilities rounded to bf16 for their product with V.
//   Backward: Q, K, V and dO rounded once per call into contiguous copies (4 B H N D bf16
//   numbers), the engine's tiles as oneDNN bf16 products (P and dS rounded per tile), every
//   gradient and row statistic in float. Planned for attention dropout (training), the forward
//   runs the engine's bf16 tiles instead of the dense kernel, which has no dropout mask: Q, K, V
//   rounded once per call into the copies, oneDNN bf16 products, the mask on the float
//   probabilities, P·M rounded for its product with V; the backward reads the forward's copies.
#include <omp.h>

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "attention_impls/kv_cache.hpp"
#include "attention_impls/position_bias.hpp"
#include "attention_impls/registry.hpp"
#include "attention_impls/tiled_softmax.hpp"
#include "core/vecmath.hpp"

namespace ab {
namespace {

constexpr int64_t kDecodeTile = 256;

TiledSoftmaxShape shape_of(const AttnProblem& p) {
  TiledSoftmaxShape s = TiledSoftmaxShape::dense(p.shape.B, p.shape.H, p.shape.N, p.shape.N, p.shape.D, p.causal,
                                                 p.strides.sn, p.strides.sn, p.threads);
  // bf16: the dense kernel, or under attention dropout the engine's bf16 tiles over contiguous
  // copies (rows of D bf16 numbers; dV and O float at the caller's stride).
  const bool tiles16 = bf16_tiles_for_dropout(p);
  s.bf16 = p.dtype == Dtype::bf16 && !tiles16;
  s.bf16_tiles = tiles16;
  if (tiles16) {
    s.ld_v = p.shape.D;
    s.ld_dv = p.strides.sn;
    s.ld_dout = p.shape.D;
  }
  // Backward tiles of 128 queries x 256 keys (the engine's default is 64 x 128): each key tile
  // streams Q, dO and dQ once, so twice the keys per tile halves that traffic, which two threads
  // share (Zen 5, N = 1024 ... 4096: 5-6% faster on one thread and 4-10% on two, docs/measurements).
  s.bwd_rows = 128;
  s.bwd_cols = 256;
  // T5's bias sums its gradient per thread: a fixed hand-out of (b, h) keeps the sum's order.
  s.static_schedule = p.bias.kind == PositionBiasKind::t5;
  return s;
}

class Flash final : public Attention {
 public:
  explicit Flash(const AttnProblem& p)
      : problem_(p),
        qk_(p.shape.D, p.strides.sn, p.strides.sn, 1.0f / std::sqrt(static_cast<float>(p.shape.D))),
        core_(shape_of(p)),
        bias_(p.bias, p.shape, p.causal, 1.0f / std::sqrt(static_cast<float>(p.shape.D)), p.threads),
        biased_(&qk_, &bias_, TilePositions{}),
        qk16_(p.shape.D, p.shape.D, p.shape.D, 1.0f / std::sqrt(static_cast<float>(p.shape.D)), false, true) {}

  void validate() const override {
    if (problem_.dtype == Dtype::bf16 && !TiledSoftmax::dense_bf16_kernel(problem_.shape.D))
      throw InvalidInput(fmt::format("flash --dtype bf16 needs D of 16, 32, 64 or 128 and a build for AVX512-BF16; got D={}",
                                     problem_.shape.D));
    if (problem_.bias.active() && problem_.dtype == Dtype::bf16) throw InvalidInput("flash adds a position encoding in float32 only (no --dtype bf16)");
  }

  double flops(Mode mode) const override {
    if (mode == Mode::decode) return softmax_decode_flops(problem_.shape, problem_.shape.N + 1);
    return with_backward(dense_attention_flops(problem_), mode);
  }

  // Causal: the diagonal tiles are scored whole and masked.
  std::optional<double> admissible_fraction() const override { return core_.pairs() / core_.scored_pairs(); }

  size_t working_bytes(Mode mode) const override {
    if (mode == Mode::decode)
      return KvCache::bytes(problem_.shape, problem_.shape.N + 1) +
             static_cast<size_t>(problem_.threads) * kDecodeTile * sizeof(float);
    plan(mode);
    return core_.working_bytes(mode) + bias_.working_bytes(mode) + bf16_copies_bytes(mode);
  }

  void setup(Mode mode, Rng& rng) override {
    if (mode == Mode::decode) {
      if (bias_.active()) throw InvalidInput("flash decodes without a position encoding (the model adds it in its forward pass only)");
      cache_.allocate(problem_.shape, problem_.shape.N + 1);
      decode_tiles_ = Buffer<float>(static_cast<size_t>(problem_.threads) * kDecodeTile);
      return;
    }
    plan(mode);
    core_.setup(mode);
    bias_.setup(mode, rng);
    if (bf16_copies_bytes(mode)) {
      const size_t n = static_cast<size_t>(problem_.shape.numel());
      q16_ = Buffer<uint16_t>(n);
      k16_ = Buffer<uint16_t>(n);
      v16_ = Buffer<uint16_t>(n);
      if (mode == Mode::fwdbwd) dout16_ = Buffer<uint16_t>(n);
    }
  }

  // With a position encoding, the engine's tiled path with the encoding added to each tile
  // (the dense kernel takes plain s Q K^T only).
  void forward(const AttnArgs& a) override {
    if (tiles16()) return forward_tiles16(a);
    qk_.bind(a.q, a.k);
    bias_.prepare(a.q);
    core_.forward(source(), a.v, a.o);
  }
  void backward(const AttnArgs& a) override {
    if (problem_.dtype == Dtype::bf16) return backward_bf16(a);
    qk_.bind(a.q, a.k);
    qk_.bind_grads(a.dq, a.dk);
    bias_.begin_backward();
    core_.backward(source(), a.v, a.o, a.dout, a.dv);
    if (bias_.active()) bias_.finish_backward(a.q, a.dq, problem_.param_grads);
  }
  std::vector<LearnedTensor> learned() override { return bias_.learned(); }
  std::vector<DumpTensor> dump_tensors() const override { return bias_.dump_tensors(); }

  void set_dropout(const Dropout& d) override { core_.set_dropout(d); }
  void decode_prefill(const AttnArgs& a, int64_t n) override { cache_.prefill(a, n); }
  void decode_step(const AttnArgs& t, int64_t pos) override;

 private:
  // bf16 backward: Q, K, V and dO rounded once per call into contiguous copies; the engine's
  // tiles multiply them (the source qk16_ reads Q and K), dQ, dK, dV come out in float.
  // Under attention dropout in bf16 (tiles16) the forward rounded Q, K, V already.
  void backward_bf16(const AttnArgs& a) {
    require_contiguous(a, "backward");
    const int64_t n = problem_.shape.numel();
    if (!tiles16()) round_inputs(a);
    to_bf16_parallel(a.dout.data, dout16_.data(), n);
    qk16_.bind(pairs_view(q16_), pairs_view(k16_));
    qk16_.bind_grads(a.dq, a.dk);
    core_.bind_bf16(pairs_view(v16_), pairs_view(dout16_));
    core_.backward(qk16_, a.v, a.o, a.dout, a.dv);
  }
  // bf16 under attention dropout: the engine's bf16 tiles over the rounded copies.
  void forward_tiles16(const AttnArgs& a) {
    require_contiguous(a, "forward");
    round_inputs(a);
    qk16_.bind(pairs_view(q16_), pairs_view(k16_));
    core_.forward(qk16_, pairs_view(v16_), a.o);
  }
  void require_contiguous(const AttnArgs& a, const char* pass) const {
    const Strides3 c = Strides3::contiguous(problem_.shape);
    for (const TensorView* t : {&a.q, &a.k, &a.v, &a.o, &a.dout, &a.dq, &a.dk, &a.dv})
      if (t->data && !(t->strides == c))
        throw InvalidInput(fmt::format("flash's bf16 {} pass takes contiguous (B, H, N, D) tensors", pass));
  }
  void round_inputs(const AttnArgs& a) {
    const int64_t n = problem_.shape.numel();
    to_bf16_parallel(a.q.data, q16_.data(), n);
    to_bf16_parallel(a.k.data, k16_.data(), n);
    to_bf16_parallel(a.v.data, v16_.data(), n);
  }
  // A (B, H, N, D) bf16 copy as the engine's views take it: two bf16 numbers to a float.
  TensorView pairs_view(const Buffer<uint16_t>& b) const {
    const Shape4& s = problem_.shape;
    const Shape4 pairs{s.B, s.H, s.N, s.D / 2};
    return TensorView{reinterpret_cast<float*>(b.data()), pairs, Strides3::contiguous(pairs)};
  }
  bool tiles16() const { return bf16_tiles_for_dropout(problem_); }
  // Q, K, V (and dO with a backward pass) rounded: with a backward pass, or (tiles16) every call.
  size_t bf16_copies_bytes(Mode mode) const {
    if (problem_.dtype != Dtype::bf16 || mode == Mode::decode) return 0;
    const int64_t copies = mode == Mode::fwdbwd ? 4 : tiles16() ? 3 : 0;
    return static_cast<size_t>(copies * problem_.shape.numel()) * sizeof(uint16_t);
  }

  void plan(Mode mode) const {
    if (planned_ && planned_mode_ == mode) return;
    // bf16 with a backward pass: the tiles are planned for the bf16 source (the forward's dense
    // kernel packs the float Q, K, V itself and plans no tile).
    if (problem_.dtype == Dtype::bf16 && (mode == Mode::fwdbwd || tiles16())) core_.plan(mode, qk16_);
    else core_.plan(mode, source());
    planned_ = true;
    planned_mode_ = mode;
  }

  const LogitsSource& source() const {
    return bias_.active() ? static_cast<const LogitsSource&>(biased_) : static_cast<const LogitsSource&>(qk_);
  }

  AttnProblem problem_;
  QKLogits qk_;
  mutable TiledSoftmax core_;
  PositionBias bias_;
  BiasedLogits biased_;
  QKLogits qk16_;  // bf16 backward: over the bf16 copies
  Buffer<uint16_t> q16_, k16_, v16_, dout16_;
  mutable bool planned_ = false;
  mutable Mode planned_mode_ = Mode::fwd;
  KvCache cache_;
  Buffer<float> decode_tiles_;
};

// Decode: the new token against the key-value cache, tile by tile with the online softmax, so
// only one tile of scores exists per thread.
void Flash::decode_step(const AttnArgs& t, int64_t pos) {
  const auto& s = problem_.shape;
  const int64_t D = s.D, BH = s.B * s.H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    cache_.store(b, h, pos, t.k.head(b, h), t.v.head(b, h));
    const float* q = t.q.head(b, h);
    float* sc = decode_tiles_.data() + static_cast<size_t>(omp_get_thread_num()) * kDecodeTile;
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

}  // namespace

MechanismInfo flash_info() {
  MechanismInfo m;
  m.name = "flash";
  m.family = "exact";
  m.summary = "softmax attention, tiled with an online softmax; scores never materialised";
  m.complexity = "O(N^2 D) time, O(N D) memory";
  m.caps = Capabilities{.exact = true, .causal = true, .backward = true, .decode = true,
                        .constraints = "", .attn_dropout = true, .no_attn_dropout = ""};
  m.caps.additive_bias = true;
  m.caps.no_additive_bias = "";
  m.bf16 = Bf16Support{.available = true,
                       .constraints = "forward and backward, with attention dropout (then in bf16 tiles, not the dense kernel); "
                                      "D of 16, 32, 64 or 128; backward and dropout: contiguous tensors",
                       .backward = true,
                       .attn_dropout = true};
  m.make = [](const AttnProblem& p, const ParamValues&) { return std::make_unique<Flash>(p); };
  // Every pair (with causal, every earlier key and itself): exact attention, tiled.
  m.reference_mask = [](const ParamValues&, int64_t, bool causal) { return ref::dense_mask(causal); };
  return m;
}

}  // namespace ab
