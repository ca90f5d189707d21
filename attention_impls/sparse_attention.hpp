// The shared core of the fixed sparse patterns (`local`, `sliding`, `dilated`, `strided`,
// `longformer`, `bigbird`): each pattern is a union of disjoint *segments*, and each segment is
// softmax attention of a set of query rows over a set of key rows with one contiguous range of
// keys per query, run on the tiled online-softmax engine. A segment whose rows an earlier one
// already has resumes that one's online softmax from O and the row log-sum-exp (exactly the
// softmax over the union), so there is neither a second output buffer nor a merge pass.
// The backward pass runs every segment's
// engine with the merged log-sum-exp and output, accumulating dQ, dK, dV: the softmax gradient
// is additive over disjoint key sets once P is taken from the union's normaliser.
//
// bf16 (--dtype bf16): Q, K and V rounded to bf16 once per call into copies that every segment
// reads (bf16 numbers two to a float, rows padded to an even D), each segment's engine in bf16
// tiles (TiledSoftmaxShape::bf16_tiles): bf16 products, the softmax in float. The diagonal
// kernel runs in its bf16 variant, Longformer's global keys inside it as in float32. Backward:
// the forward's copies and dO rounded into a fourth, every segment's tiles as bf16 products,
// dQ, dK, dV (and a gathered part's gradient buffers) in float. Attention dropout in bf16 as in
// float32 (the tiles' mask on the float probabilities, then P * M rounded for its product; the
// diagonal kernel is not planned with dropout).
//
// Rows are selected by views, never copied, except for scattered key sets (BigBird's random
// blocks, the fixed pattern's summary columns), which are gathered into a buffer per call.
// Work and memory are O(N |S(i)|): only admissible (tiles of) keys are touched.
#pragma once
#include <memory>
#include <vector>

#include "attention_impls/attention.hpp"
#include "attention_impls/tiled_softmax.hpp"

namespace ab {

class PositionBias;

// A set of rows of a (B, H, N, D) tensor: rows first + t * step for t < n of every (b, h); or,
// folded, residues first + r (r < count) of every (b, h) as count separate sequences
// first + r + t * step, t < n (Sparse Transformer's strided part: one segment for all residues).
struct RowSet {
  int64_t first = 0, step = 1, n = 0;
  int64_t fold = 0;  // 0: not folded; else the number of residues (B' = B H, H' = fold)
  TensorView of(const TensorView& t) const;
};

struct Segment {
  RowSet queries, keys;
  // Scattered keys: gather[h * keys.n + u] is the original row of key u of head h; keys.first
  // and step are then unused. The index is filled only when segments are made for setup.
  bool gathered = false;
  Buffer<int64_t> gather;
  bool causal = false;  // in segment indices (queries and keys the same rows)
  bool exclude_self = false;  // query t never uses key t (queries and keys the same rows)
  KeyRangeFn range;     // keys of query t, in segment key indices (null: all)
  // Score tiles: forward rows x cols; backward bwd_rows x bwd_cols, or (0) the forward's
  // transpose. A band's tiles are as wide as the band of a block of rows, so each block is one
  // product (see sparse_segments.hpp).
  int64_t tile_rows = 128, tile_cols = 256, bwd_tile_rows = 0, bwd_tile_cols = 0;
  bool tight = false;
  bool diagonal = false;    // a band: see TiledSoftmaxShape::diagonal
  // A band whose queries also use keys 0 .. prefix_keys - 1 of the sequence in its forward pass
  // (see fuse_prefix_keys); the segment of those keys is then backward_only: skipped by the
  // forward pass, run by the backward pass.
  int64_t prefix_keys = 0;
  bool backward_only = false;
  bool keys_major = false;  // logits tiles as S^T = K Q^T (see QKLogits): a few queries, many keys
};

// The sparse patterns' bf16 path (SparseAttention's bf16 copies and TiledSoftmax's bf16 tiles).
inline Bf16Support sparse_bf16_support() {
  return Bf16Support{.available = true, .constraints = "forward and backward, with attention dropout", .backward = true,
                     .attn_dropout = true};
}

class SparseAttention : public Attention {
 public:
  ~SparseAttention() override;
  double flops(Mode mode) const override;
  size_t working_bytes(Mode mode) const override;
  void setup(Mode mode, Rng& rng) override;
  void forward(const AttnArgs& a) override;
  void backward(const AttnArgs& a) override;
  // Each segment's engine with a salt of its own: segments are disjoint key sets, so every
  // probability gets one mask decision (the diagonal kernel is not planned with dropout).
  void set_dropout(const Dropout& d) override;
  // Admissible (query, key) pairs: the analytic work is 4 D per pair per head.
  double pairs() const;
  // Pairs the forward pass scores, admissible or not (see TiledSoftmax::scored_pairs).
  double scored_pairs() const;
  std::optional<double> admissible_fraction() const override { return pairs() / scored_pairs(); }
  void decode_prefill(const AttnArgs& a, int64_t n) override;
  void decode_step(const AttnArgs& t, int64_t pos) override;
  // The position encoding's learned tensor (AttnProblem::bias), added inside every segment's
  // tiles from the true positions of the pair.
  std::vector<LearnedTensor> learned() override;
  std::vector<DumpTensor> dump_tensors() const override;

 protected:
  explicit SparseAttention(const AttnProblem& p);
  // The pattern as segments. Called with rng == nullptr for planning (structure only: no
  // gather index, no random draw) and once more in setup with the run's generator.
  virtual std::vector<Segment> make_segments(Rng* rng) const = 0;
  // Tracked bytes the derived mechanism allocates in make_segments(rng) besides gather indices.
  virtual size_t pattern_bytes() const { return 0; }
  // Causal decode against a cache of the pattern's window (capability `decode`): the most keys
  // a query may use (the cache is a ring of that many tokens), and the keys of position pos.
  virtual int64_t window_capacity() const { return 0; }
  virtual std::pair<int64_t, int64_t> window_keys(int64_t pos) const { return {pos, pos + 1}; }
  AttnProblem problem_;

 private:
  struct Part;
  void build(Rng* rng) const;
  const LogitsSource& source(const Part& part) const;  // qk, or qk with the position encoding
  template <typename Count>
  double sum_over_parts(Count count) const;
  size_t ring_bytes(int64_t W) const;
  size_t gathered_floats(const Part& part) const;
  AttnArgs round_inputs(const AttnArgs& a);
  TensorView keys_view(const Part& part, const TensorView& t, const Buffer<float>& gathered) const;
  // The keys' gradient rows of a part: the caller's, or a gathered part's float buffer.
  TensorView grads_view(const Part& part, const TensorView& t, const Buffer<float>& gathered) const;
  // f(b, h, row, slot) for every (batch, head) and every key a gathered part holds: `row` the
  // key's position, `slot` the float offset of its copy in the part's buffers.
  template <class F>
  void for_each_gathered(const Part& part, F&& f) const;

  mutable std::vector<std::unique_ptr<Part>> parts_;
  mutable bool built_ = false;
  // O and lse start as 0 and -inf: some row has no segment, or a resuming segment has rows
  // that no earlier segment had.
  mutable bool zero_first_ = true;
  mutable Mode planned_mode_ = Mode::fwd;
  mutable bool planned_ = false;
  Buffer<float> lse_;  // the merged row log-sum-exp, (B, H, N)
  std::unique_ptr<PositionBias> bias_;
  // bf16: Q, K, V rounded, (B, H, N, bf16_row_floats()) floats each holding two bf16 numbers.
  bool bf16() const { return problem_.dtype == Dtype::bf16; }
  int64_t bf16_row_floats() const { return (problem_.shape.D + 1) / 2; }
  size_t bf16_bytes(Mode mode) const;
  size_t gathered_grad_floats(const Part& part) const;
  Buffer<float> q_b_, k_b_, v_b_, do_b_;  // do_b_: backward, dO rounded
  Buffer<float> ring_k_, ring_v_, ring_scores_;  // decode
};

}  // namespace ab
