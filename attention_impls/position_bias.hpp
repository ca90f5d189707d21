// Additive position encodings inside the kernels: ALiBi, T5's bucketed bias, Shaw's relative key
// embeddings (AttnProblem::bias). Never an N x N tensor: each mechanism adds the encoding to the
// logits it computes, row by row, from the true positions of the pair.
//
// All three have one form: logit(i, j) += R_i[clamp(j - i, -K, K)], a row table R_i indexed by
// the signed offset.
//   alibi, t5: R_i is one table per head over every offset (K = N - 1), filled once per forward
//              call: -m_h |o| (ALiBi), or table[h, bucket(o)] (T5). H (2N - 1) floats.
//   shaw:      R_i = s q_i . a_r for the 2 clip + 1 embeddings a_r (K = clip), per query row,
//              computed once per forward call: B H N (2 clip + 1) floats.
// Backward: each row's dS is summed by offset into an accumulator of the same layout (t5: per
// thread and head; shaw: per row), and finish_backward turns the sums into the gradients:
//   t5:   dtable[h, bucket(o)] += sum of dS at offset o (over b, rows, threads)
//   shaw: dq_i += s sum_r G_i[r] a_r;  da_r += s sum_{b, h, i} G_i[r] q_i.
// ALiBi has no parameter and adds nothing to dQ or dK.
#pragma once
#include <string>
#include <vector>

#include "attention_impls/attention.hpp"
#include "attention_impls/tiled_softmax.hpp"

namespace ab {

// "alibi", "bias:32:128" (T5: buckets, max distance), "shaw:16" (clip), as --positions writes them.
std::string to_string(const PositionBiasSpec& s);

// T5's bucket of the signed offset o = j - i (mesh-tensorflow's _relative_position_bucket):
// bidirectional (non-causal) halves the buckets between the two signs; within a sign, offsets
// below half the buckets are exact, longer ones log-spaced up to max_distance, farther ones in
// the last bucket. Causal: positive offsets (the future) fall in bucket 0.
int64_t t5_bucket(int64_t offset, bool bidirectional, int64_t buckets, int64_t max_distance);
// ALiBi's slope of each of H heads: 2^(-8 h / H) for h = 1 .. H when H is a power of two; else
// those of the largest power of two below H, then every other slope of twice that many.
std::vector<float> alibi_slopes(int64_t H);

// Key positions of a tile's columns: first + c * step, or index[c] (gathered keys), or
// index32[c] (a sorted order: reformer's permutation).
struct KeyPositions {
  int64_t first = 0, step = 1;
  const int64_t* index = nullptr;
  const int32_t* index32 = nullptr;
  int64_t at(int64_t c) const { return index ? index[c] : index32 ? index32[c] : first + c * step; }
  bool consecutive() const { return !index && !index32 && step == 1; }
};

class PositionBias {
 public:
  PositionBias() = default;
  // scale: the mechanism's logit scale s (Shaw's term is s q . a); threads: of the calls.
  PositionBias(const PositionBiasSpec& spec, const Shape4& shape, bool causal, float scale, int threads);
  bool active() const { return spec_.active(); }
  const PositionBiasSpec& spec() const { return spec_; }
  // Whether the encoding has a learned tensor whose gradient the backward pass sums over
  // threads (t5): the engine should then hand (b, h) pairs to threads in a fixed order.
  bool sums_per_thread() const { return spec_.kind == PositionBiasKind::t5; }
  // Tracked bytes of setup(mode): the row tables, the backward's accumulators, the parameters.
  size_t working_bytes(Mode mode) const;
  // Allocates; draws the learned tensor N(0, 0.02) (t5, shaw).
  void setup(Mode mode, Rng& rng);
  // The learned tensor and its gradient (empty for none and alibi).
  std::vector<LearnedTensor> learned();
  std::vector<DumpTensor> dump_tensors() const;

  // Before a forward (or backward) call: the row tables from the current parameters and, for
  // shaw, the queries.
  void prepare(const TensorView& q);
  // S[c] += the encoding of query position i against the keys `keys` (cols of them), for the
  // (b, h) of the call.
  void add_row(int64_t b, int64_t h, int64_t i, const KeyPositions& keys, int64_t cols, float* S) const;
  // Backward: before the first accumulate_row of a call (zeroes the accumulators).
  void begin_backward();
  // dS of a row of the tile (dL/dlogit), summed by offset into the accumulators; tid: the calling thread.
  void accumulate_row(int tid, int64_t b, int64_t h, int64_t i, const KeyPositions& keys, int64_t cols,
                      const float* dS);
  // After the mechanism's backward: shaw adds its term to dq (the views of the call); with
  // param_grads, the learned tensor's gradient is overwritten.
  void finish_backward(const TensorView& q, const TensorView& dq, bool param_grads);

 private:
  int64_t reach() const;  // K: the largest |offset| a row table holds
  int64_t row_floats() const { return 2 * reach() + 1; }
  const float* row_table(int64_t b, int64_t h, int64_t i) const;  // R_i at offset 0
  size_t table_floats() const;                                    // every R_i
  size_t accum_floats() const;
  size_t param_floats() const;

  PositionBiasSpec spec_;
  Shape4 shape_;
  bool causal_ = false;
  float scale_ = 1.0f;
  int threads_ = 1;
  std::vector<float> slopes_;
  Buffer<float> tables_, accum_, param_, grad_;
  Buffer<int64_t> buckets_;  // t5: the bucket of each offset o, at o + N - 1
};

// Where the rows and columns of an engine's tiles are in the sequence, for a mechanism whose
// engine runs over row sets (sparse_attention.hpp): query t of engine pair (b', h') is
// position q_first + t q_step, key u is k_first + u k_step (or gather[head nk + u]); folded sets
// have b' = b H + head and h' the residue, added to both firsts.
struct TilePositions {
  int64_t q_first = 0, q_step = 1, k_first = 0, k_step = 1;
  int64_t fold = 0;                  // 0: (b', h') = (b, head)
  int64_t heads = 1;                 // H of the problem (to unfold b')
  const int64_t* gather = nullptr;   // gathered keys: per head, nk of them
  int64_t gather_n = 0;
};

// A logits source that adds the position encoding to an inner s Q K^T source's tiles, and sums
// the tiles' dS into the encoding's accumulators in the backward pass. The engine then runs its
// tiled path (the dense and diagonal kernels take plain QKLogits only).
class BiasedLogits final : public LogitsSource {
 public:
  BiasedLogits() = default;
  BiasedLogits(const QKLogits* inner, PositionBias* bias, const TilePositions& at) : inner_(inner), bias_(bias), at_(at) {}
  void plan_tile(MatmulCache& mm, int64_t rows, int64_t cols, int64_t ldS, bool backward) const override {
    inner_->plan_tile(mm, rows, cols, ldS, backward);
  }
  void plan_begin() const override { inner_->plan_begin(); }
  void logits(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows, int64_t c0,
              int64_t cols, float* S, int64_t ldS) const override;
  void logits_backward(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows,
                       int64_t c0, int64_t cols, const float* dS, int64_t ldS) const override;
  void backward_begin(const MatmulCache& mm, int tid, int64_t b, int64_t h) const override {
    inner_->backward_begin(mm, tid, b, h);
  }
  void backward_end(const MatmulCache& mm, int tid, int64_t b, int64_t h) const override {
    inner_->backward_end(mm, tid, b, h);
  }
  // Whole (b, h) pairs per thread: shaw's accumulators are per row, written by one thread.
  bool key_split() const override { return false; }

 private:
  // The problem's (b, head), the first query position and the key positions of a tile.
  void locate(int64_t b, int64_t h, int64_t r0, int64_t c0, int64_t& pb, int64_t& ph, int64_t& q0,
              KeyPositions& keys) const;
  const QKLogits* inner_ = nullptr;
  PositionBias* bias_ = nullptr;
  TilePositions at_;
};

}  // namespace ab
