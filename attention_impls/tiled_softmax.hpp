// Default tile sizes: a forward score tile of 128 x 256 floats (128 KiB) plus the K and V tiles
// (64 KiB each at D = 64) stay in a 1 MiB L2; the backward pass keeps two score-sized tiles, so
// it uses smaller ones. Sparse patterns use smaller tiles still, to waste less at range edges.
//
// The tiled online-softmax engine (FlashAttention's forward and FlashAttention-2's backward),
// shared by every mechanism whose output is softmax(logits) V over an explicit key range:
// `flash` (logits s Q K^T), `linformer` and `memory_compressed` (s Q K'^T over projected or
// compressed keys, Nk != Nq), `synthesizer` (logits from Q alone, or fixed).
//
// The engine owns the softmax, the value products and the bookkeeping (running max and sum,
// the saved log-sum-exp, the dO.O row sums); a LogitsSource fills each score tile and, in the
// backward pass, takes the tile's score gradient dS to its own inputs.
#pragma once
#include <functional>
#include <utility>
#include <vector>

#include "attention_impls/attention.hpp"
#include "core/matmul.hpp"

namespace ab {

class LogitsSource {
 public:
  virtual ~LogitsSource() = default;
  // Adds the products a (rows x cols) tile needs, its scores having row stride ldS.
  virtual void plan_tile(MatmulCache& mm, int64_t rows, int64_t cols, int64_t ldS, bool backward) const = 0;
  // Before the first plan_tile of a plan (the engine's products are planned afresh each time).
  virtual void plan_begin() const {}
  // S (rows x cols, row stride ldS) = the logits of queries r0.. against keys c0.. of (b, h).
  virtual void logits(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows,
                      int64_t c0, int64_t cols, float* S, int64_t ldS) const = 0;
  // Backward: dS (rows x cols) = dL/dlogits of the tile; accumulate into the inputs' gradients.
  virtual void logits_backward(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0,
                               int64_t rows, int64_t c0, int64_t cols, const float* dS,
                               int64_t ldS) const = 0;
  // Around the backward pass of one (b, h), on the thread that runs it.
  virtual void backward_begin(const MatmulCache&, int, int64_t, int64_t) const {}
  virtual void backward_end(const MatmulCache&, int, int64_t, int64_t) const {}
  // Whether one (b, h)'s key tiles may be split over threads in the backward pass: the source
  // writes only its keys' gradient rows per key tile, and the queries' gradient of a tile can
  // go to a partial buffer (logits_backward_partial) that reduce_partial adds in afterwards.
  virtual bool key_split() const { return false; }
  // logits_backward with the queries' gradient added into dq_rows (rows x D, contiguous).
  virtual void logits_backward_partial(const MatmulCache&, int, int64_t, int64_t, int64_t, int64_t, int64_t,
                                       int64_t, const float*, int64_t, float*) const {}
  // Adds a partial queries' gradient (Nq x D, contiguous) of (b, h) into the bound gradient.
  virtual void reduce_partial(int64_t, int64_t, const float*) const {}
};

// logits = s Q K^T; backward dQ += s dS K, dK += s dS^T Q. The views are bound per call.
// keys_major: each tile is computed as S^T = s K Q^T into a scratch tile and transposed into S.
// For a strip of a few queries against many keys (Longformer's global queries) oneDNN's
// product with the keys as its long side runs about twice as fast as Q K^T with K transposed,
// whose packing of K per call dominates when the tile has few rows.
class QKLogits final : public LogitsSource {
 public:
  QKLogits() = default;
  // bf16_inputs: Q and K are bf16 numbers two to a float (the bound views hold D/2 floats a
  // row, the strides ld_q, ld_k count bf16 numbers), multiplied by oneDNN's bf16 matmul into
  // float logits; backward: dS arrives in bf16 too, dQ and dK are float (set_grad_strides).
  QKLogits(int64_t D, int64_t ld_q, int64_t ld_k, float scale, bool keys_major = false, bool bf16_inputs = false)
      : D_(D), ld_q_(ld_q), ld_k_(ld_k), scale_(scale), keys_major_(keys_major), bf16_inputs_(bf16_inputs) {}
  void bind(const TensorView& q, const TensorView& k) {
    q_ = q;
    k_ = k;
  }
  // Keys every query also uses, before its own range (TiledSoftmaxShape::prefix_keys).
  void bind_prefix(const TensorView& k) { prefix_k_ = k; }
  const TensorView& q() const { return q_; }
  const TensorView& k() const { return k_; }
  const TensorView& prefix_k() const { return prefix_k_; }
  float scale() const { return scale_; }
  bool keys_major() const { return keys_major_; }
  // bf16 inputs: the float dQ's and dK's row strides, where they differ from the bf16 copies'
  // (set before planning).
  void set_grad_strides(int64_t ld_dq, int64_t ld_dk) {
    ld_dq_ = ld_dq;
    ld_dk_ = ld_dk;
  }
  // accumulate: add to dq, dk instead of starting them at zero.
  void bind_grads(const TensorView& dq, const TensorView& dk, bool accumulate = false) {
    dq_ = dq;
    dk_ = dk;
    accumulate_ = accumulate;
  }
  void plan_begin() const override { scratch_floats_ = 0; }
  void plan_tile(MatmulCache& mm, int64_t rows, int64_t cols, int64_t ldS, bool backward) const override;
  void logits(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows, int64_t c0,
              int64_t cols, float* S, int64_t ldS) const override;
  void logits_backward(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows,
                       int64_t c0, int64_t cols, const float* dS, int64_t ldS) const override;
  // Zeroes the (b, h) rows of dQ and dK before they accumulate.
  void backward_begin(const MatmulCache& mm, int tid, int64_t b, int64_t h) const override;
  bool key_split() const override { return !keys_major_ && !bf16_inputs_; }
  void logits_backward_partial(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows,
                               int64_t c0, int64_t cols, const float* dS, int64_t ldS, float* dq_rows) const override;
  void reduce_partial(int64_t b, int64_t h, const float* dq_part) const override;
  // keys_major: the transposed tiles of `threads` threads, sized by the last plan's tiles.
  size_t working_bytes(int threads) const { return static_cast<size_t>(threads) * scratch_floats_ * sizeof(float); }
  void setup(int threads) { scratch_ = Buffer<float>(static_cast<size_t>(threads) * scratch_floats_); }

 private:
  MatmulSpec spec_qk(int64_t rows, int64_t cols, int64_t ldS) const;
  MatmulSpec spec_kq(int64_t rows, int64_t cols) const;
  MatmulSpec spec_dq(int64_t rows, int64_t cols, int64_t ldS) const;
  MatmulSpec spec_dq_partial(int64_t rows, int64_t cols, int64_t ldS) const;  // into rows of D floats
  MatmulSpec spec_dk(int64_t rows, int64_t cols, int64_t ldS) const;
  int64_t D_ = 0, ld_q_ = 0, ld_k_ = 0, ld_dq_ = 0, ld_dk_ = 0;  // ld_dq_, ld_dk_ 0: ld_q_, ld_k_
  float scale_ = 1.0f;
  bool keys_major_ = false;
  bool bf16_inputs_ = false;
  mutable size_t scratch_floats_ = 0;  // per thread: the last plan's largest tile (keys_major)
  Buffer<float> scratch_;
  bool accumulate_ = false;
  TensorView q_, k_, dq_, dk_, prefix_k_;
};

// The keys query row i may use: [first, second), never decreasing with i (both ends).
using KeyRangeFn = std::function<std::pair<int64_t, int64_t>(int64_t)>;

// A mechanism whose bf16 forward is the engine's dense kernel (flash, linformer,
// memory_compressed) takes the engine's bf16 tiles instead when planned for attention dropout:
// the dense kernel applies no dropout mask.
inline bool bf16_tiles_for_dropout(const AttnProblem& p) { return p.dtype == Dtype::bf16 && p.attn_dropout; }

struct TiledSoftmaxShape {
  int64_t B = 1, H = 1, Nq = 1, Nk = 1, D = 1;
  bool causal = false;  // only with Nq == Nk: query i sees keys j <= i
  int64_t ld_v = 0;     // row stride of V and dV
  int64_t ld_o = 0;     // row stride of O and dO
  // bf16 backward: the row strides of the float dV (0: ld_v) and of the bf16 dO the products
  // read (0: ld_o), where the bf16 copies and the float tensors differ (the sparse patterns).
  int64_t ld_dv = 0, ld_dout = 0;
  int threads = 1;
  // Sparse patterns: each query's admissible keys as one contiguous range (null: all keys).
  // Tiles outside every row's range are skipped, tiles across a range's edge are masked.
  KeyRangeFn keys;
  // Tile sizes (score tiles: forward rows x cols, backward rows x cols).
  int64_t fwd_rows = 128, fwd_cols = 256, bwd_rows = 64, bwd_cols = 128;
  // The dense kernel's key tile (its query blocks are fwd_rows): its scores stay in L1 a strip
  // at a time, so it takes longer tiles than a oneDNN product does (2-4% faster than 256 at
  // N = 512 ... 8192 on a Zen 5; 1024 no better).
  int64_t dense_cols = 512;
  // Forward in bf16 (the dense kernel only): Q, K, V rounded to bf16, both products in bf16 with
  // float accumulation (vdpbf16ps), the softmax and its statistics in float, P rounded to bf16
  // for its product with V. Needs dense_bf16_kernel(D). Backward in bf16 (FlashAttention-2's
  // passes over oneDNN bf16 tiles): the source a QKLogits with bf16 inputs over contiguous bf16
  // copies of Q and K, V and dO rounded by the caller (bind_bf16), P and dS rounded per tile, dV,
  // dQ, dK, the row statistics and dS itself in float; contiguous tensors, no dropout.
  bool bf16 = false;
  // Forward in bf16 over oneDNN tiles (the sparse patterns' bands, strips and gathered keys,
  // which the dense kernel does not take): Q, K (the source, a QKLogits with bf16_inputs) and V
  // arrive rounded to bf16 by the caller, two to a float (views of D/2 floats a row, ld_v
  // counting bf16 numbers); both tile products oneDNN bf16 matmuls with float output, the
  // softmax and its statistics in float, each tile's P rounded to bf16 for its product with V.
  // The dense kernel does not run (it packs floats itself); a band's diagonal kernel has a bf16
  // variant (vdpbf16ps). No backward pass.
  // Backward in bf16 likewise (the caller's bf16 copies of V and dO: bind_bf16), no dropout.
  bool bf16_tiles = false;
  // Keep the row log-sum-exp after forward also without backward (for merging segments).
  bool keep_lse = false;
  // With ranges: key tiles start at each query block's first key (forward), query tiles at
  // each key block's first query (backward), instead of on a fixed grid: a band of width W
  // is then one fwd_rows x W tile per block.
  bool tight = false;
  // With tight ranges that move along the diagonal (a band: row i's keys about i - w .. i + w),
  // the AVX-512 build scores the logits and values of each 16 query rows with its own kernel
  // (see diagonal_rows in tiled_softmax.cpp), which computes only the keys of those 16 rows
  // instead of a rectangular tile's: ~10% of the scores wasted at window 64 instead of 27%.
  bool diagonal = false;
  // With the diagonal kernel: every query also uses these many keys given apart (the source's
  // prefix_k and forward's prefix_v: Longformer's global keys), in the same softmax. The
  // backward pass leaves them to a segment of their own.
  int64_t prefix_keys = 0;
  // Query i never uses key i (needs Nq == Nk, queries and keys the same rows): a pattern that
  // splits its keys into disjoint parts keeps the query itself in one part only, and this
  // lets another part keep its one contiguous range (the Sparse Transformer's residue class).
  bool exclude_self = false;
  // The heads are interleaved rows of one sequence (a folded residue view, see RowSet): the
  // forward pass takes the heads of one block of rows together, so the rows they share in
  // memory are read while they are in cache.
  bool heads_inner = false;
  // The backward pass hands (b, h) pairs to threads in a fixed order (pair bh to thread
  // bh mod threads, in increasing bh) instead of on demand: a source that sums its parameters'
  // gradients per thread (synthesizer) then sums in the same order at every run. Never splits
  // a pair's key tiles (key_parts() is 1).
  bool static_schedule = false;

  // Dense (or causal) attention of Nq queries over Nk keys with the default tiles.
  static TiledSoftmaxShape dense(int64_t B, int64_t H, int64_t Nq, int64_t Nk, int64_t D, bool causal,
                                 int64_t ld_v, int64_t ld_o, int threads) {
    TiledSoftmaxShape s;
    s.B = B;
    s.H = H;
    s.Nq = Nq;
    s.Nk = Nk;
    s.D = D;
    s.causal = causal;
    s.ld_v = ld_v;
    s.ld_o = ld_o;
    s.threads = threads;
    return s;
  }
};

// A row log-sum-exp kept outside the engine (the merged one of a union of key sets): row t of
// (b, h) is at base[b * b_stride + h * h_stride + t * row_stride]. The forward pass can write
// it (and, resuming, read it first); the backward pass reads it.
struct LseView {
  float* base = nullptr;
  int64_t b_stride = 0, h_stride = 0, row_stride = 1;
  float* row(int64_t b, int64_t h, int64_t t) const { return base + b * b_stride + h * h_stride + t * row_stride; }
};

class TiledSoftmax {
 public:
  TiledSoftmax() = default;
  explicit TiledSoftmax(const TiledSoftmaxShape& s) : shape_(s) {}
  // Creates the primitives (value products here, logits products through `src`).
  void plan(Mode mode, const LogitsSource& src);
  // Everything setup() will allocate: tiles, scratchpads, the saved log-sum-exp and row sums.
  size_t working_bytes(Mode mode) const;
  void setup(Mode mode);
  // O = softmax(logits) V, per (b, h) and block of query rows. With `lse`, each row's
  // log-sum-exp is written there. With `resume` as well, O and lse already hold the softmax
  // of an earlier, disjoint key set (lse -inf and O 0 where it had none), and the result is
  // the softmax over the union: the online softmax starts from (m = lse, l = 1, O) instead of
  // from nothing, so segments of a pattern merge without a second output buffer or pass.
  void forward(const LogitsSource& src, const TensorView& v, const TensorView& o, const LseView* lse = nullptr,
               bool resume = false, const TensorView* prefix_v = nullptr);
  // Whether this build has the diagonal kernel for head size D (AVX-512; D of 16, 32 or 64),
  // and whether 16 rows over `keys` keys of their own and `prefix` prefix keys fit a score tile
  // of `area` floats.
  static constexpr int64_t kDiagonalRows = 16;  // query rows per call of the diagonal kernel
  static bool diagonal_kernel(int64_t D);
  // The same for bf16 tiles (a build for AVX512-BF16).
  static bool diagonal_bf16_kernel(int64_t D);
  static bool diagonal_fits(int64_t D, int64_t keys, int64_t prefix, int64_t area);
  // Whether this build has the dense kernel for head size D (AVX-512; D of 16, 32, 64 or 128):
  // dense or causal s Q K^T logits, scored and multiplied by V without a oneDNN call per tile.
  static bool dense_kernel(int64_t D);
  // The same in bf16: a build for AVX512-BF16 (the CPU must have it too: cpu_has_bf16 in core/dtype.hpp).
  static bool dense_bf16_kernel(int64_t D);
  // Whether forward() takes every block through the dense kernel: the source is plain s Q K^T,
  // no pattern, no prefix keys, no excluded self, no dropout, and the build has the kernel.
  bool dense_block_kernel(const LogitsSource& src) const;
  // The same but for dropout (which a later call may have off).
  bool dense_source(const LogitsSource& src) const;
  // dV, and through src the logits' inputs; dv is overwritten, or accumulated into when
  // `accumulate`. `lse`, when given, replaces the forward's own (see LseView).
  void backward(const LogitsSource& src, const TensorView& v, const TensorView& o,
                const TensorView& dout, const TensorView& dv, bool accumulate = false,
                const LseView* lse = nullptr);
  // bf16 backward: V and dO rounded to bf16, two to a float (views of D/2 floats a row), which
  // the tile products read; backward's v and dout stay the float tensors (dO·O in float).
  bool bf16_backward() const { return shape_.bf16 || shape_.bf16_tiles; }
  void bind_bf16(const TensorView& v, const TensorView& dout) {
    bf16_v_ = v;
    bf16_dout_ = dout;
  }
  // The forward's row log-sum-exp of (b, h) (needs keep_lse or backward mode).
  const float* lse(int64_t b, int64_t h) const { return lse_.data() + (b * shape_.H + h) * shape_.Nq; }
  // Admissible keys of query row i (pattern and causality).
  std::pair<int64_t, int64_t> keys_of(int64_t i) const;
  // Admissible keys of row i within the tile of keys [c0, c0 + cols), as tile columns [a, e).
  std::pair<int64_t, int64_t> admissible(int64_t i, int64_t c0, int64_t cols) const;
  // With exclude_self: sets the logit of row i's own key to -inf when that key is in the
  // row's admissible tile columns [a, e) (tile starting at key c0).
  void drop_self(float* row, int64_t i, int64_t c0, int64_t a, int64_t e) const;
  // The run of query rows that use some key of [c0, c1).
  std::pair<int64_t, int64_t> queries_using(int64_t c0, int64_t c1) const;
  const MatmulCache& mm() const { return mm_; }
  // Attention dropout for the calls that follow (core/dropout.hpp): the mask of element (i, j)
  // of (b, h) hashes row (b H + h) Nq + i and column j of this engine's coordinates. The
  // diagonal kernel does not apply it: a shape planned for dropout sets diagonal = false.
  void set_dropout(const Dropout& d) { dropout_ = d; }
  // Useful (query, key) pairs: the sum over rows of their admissible keys.
  double pairs() const;
  // (query, key) pairs the forward pass scores: the area of every score tile it visits, per
  // (b, h). pairs() over this is the fraction of the logits products that is not wasted.
  double scored_pairs() const;
  const TiledSoftmaxShape& shape() const { return shape_; }
  // Parts of one (b, h)'s key tiles in the backward pass as planned: 1 (whole pairs), or, when
  // B H does not divide over the threads and the source can write a partial dQ
  // (LogitsSource::key_split) and the schedule is not static, threads / gcd(B H, threads) (at
  // most the key tiles), so that the parts divide evenly: FlashAttention-2 over key blocks.
  int64_t key_parts() const { return key_parts_; }

 private:
  // Floats of the forward score tile, or of the dense kernel's key tile and strip if larger.
  int64_t score_area() const;
  // The dense kernel's transposed keys of one (b, h): every key tile, D x (fwd_cols padded to 16).
  int64_t dense_keys_floats() const;
  size_t tile_floats(Mode mode) const;
  // The backward pass's key tiles of one (b, h).
  int64_t bwd_key_tiles() const { return (shape_.Nk + shape_.bwd_cols - 1) / shape_.bwd_cols; }
  size_t dq_parts_floats() const { return static_cast<size_t>((key_parts_ - 1) * shape_.B * shape_.H * shape_.Nq * shape_.D); }
  // Whether forward() scores the block of rows [r0, r0 + rows) with the diagonal kernel (see
  // TiledSoftmaxShape::diagonal): an AVX-512 build, a band, D of 16, 32 or 64, and each 16 rows'
  // transposed queries and logits fit in the score tile. (The source must also be s Q K^T.)
  bool diagonal_block(int64_t r0, int64_t rows) const;
  MatmulSpec spec_pv(int64_t rows, int64_t cols, bool accumulate) const;
  int64_t ld_dout() const { return shape_.ld_dout ? shape_.ld_dout : shape_.ld_o; }
  MatmulSpec spec_dv(int64_t rows, int64_t cols) const;
  MatmulSpec spec_dp(int64_t rows, int64_t cols) const;

  TiledSoftmaxShape shape_;
  Mode mode_ = Mode::fwd;
  Dropout dropout_;
  TensorView bf16_v_, bf16_dout_;  // bind_bf16
  MatmulCache mm_;
  Buffer<std::byte> scratch_;
  Buffer<float> tiles_, lse_, delta_;
  bool dense_planned_ = false;  // plan() saw a source the dense kernel takes: setup() allocates keys_t_
  int64_t key_parts_ = 1;       // backward: see key_parts(); parts past the first need dq_parts_
  Buffer<float> dq_parts_;      // (key_parts - 1) partial dQ (Nq x D) per (b, h)
  Buffer<int64_t> key_part_of_tile_;  // backward, split pairs: the part of each key tile
  Buffer<float> keys_t_;        // the dense kernel's transposed keys, every (b, h)
  Buffer<float> q_b_, v_b_;     // bf16: the queries and values in pairs (dense_pack_bf16)
  Buffer<int64_t> ranges_;  // (lo, hi) per query row, filled by setup when there is a pattern
};

}  // namespace ab
