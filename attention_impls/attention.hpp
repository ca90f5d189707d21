// The one interface every attention mechanism implements, and the description each registers.
//
// Life of a benchmark point (benchdnn style: validate, then time):
//   1. info.make(problem, params) constructs the mechanism: no allocation, no randomness.
//   2. validate() names a shape or parameter it cannot take (the CLI exits 2 with the message);
//      capabilities (causal, backward) are checked by the runner from the declared Capabilities
//      and reported as SKIPPED.
//   3. working_bytes(mode) and flops(mode) are analytic: known before anything is allocated, so
//      a point too large for memory is refused up front, and GFLOP/s has a fixed numerator.
//   4. setup(mode, rng): untimed. Allocation (tracked), primitive creation, random draws.
//   5. forward / backward: timed. No buffer allocation, no randomness.
//
// Decode mode (capability `decode`): the problem's N is the context length. setup(decode)
// allocates the key-value cache or recurrent state for N + 1 tokens, decode_prefill (untimed)
// fills it from the first tokens of K and V, and decode_step (timed) produces one new token's
// output and stores that token; flops(decode) and working_bytes(decode) describe one step after
// a context of N tokens.
#pragma once
#include <omp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "core/dtype.hpp"
#include "core/dropout.hpp"
#include "core/params.hpp"
#include "core/rng.hpp"
#include "attention_impls/reference.hpp"
#include "core/tensor.hpp"

namespace ab {

// What a mechanism is set up for: the forward call, forward and backward, or decoding one token.
enum class Mode { fwd, fwdbwd, decode };
const char* to_string(Mode m);

// An additive position encoding the mechanism adds to its logits inside its kernels, from the
// true (query, key) positions of each pair it scores (the model's --positions alibi|bias|shaw;
// attention_impls/position_bias.hpp computes it). none: the logits are the mechanism's own.
//   alibi: -m_h |i - j|, m_h ALiBi's geometric slopes per head (Press et al. 2022).
//   t5:    a learned scalar per head and per bucket of the signed offset j - i, T5's log-spaced
//          buckets (`buckets` of them, distances past `max_distance` sharing the last).
//   shaw:  s q_i . a_{clip(j - i, -clip, clip)}, learned key embeddings of the clipped offset
//          shared by the heads (Shaw et al. 2018, the key-side term).
enum class PositionBiasKind { none, alibi, t5, shaw };
struct PositionBiasSpec {
  PositionBiasKind kind = PositionBiasKind::none;
  int64_t buckets = 32, max_distance = 128;  // t5
  int64_t clip = 16;                         // shaw
  bool active() const { return kind != PositionBiasKind::none; }
};

// The attention call being benchmarked: shapes, causality and the layout shared by Q, K, V, O
// and their gradients.
struct AttnProblem {
  Shape4 shape;
  bool causal = false;
  Strides3 strides;  // defaults to contiguous (B, H, N, D)
  int threads = 1;   // OpenMP threads the call may use
  // Training (the model level). attn_dropout: plan for set_dropout with a positive rate (a
  // mechanism may then take a slower path, e.g. no diagonal kernel). param_grads: backward also
  // writes the gradients of the mechanism's own learned tensors (learned()); the attention-level
  // benchmarks leave both off, so their figures are the mechanism's alone.
  bool attn_dropout = false;
  bool param_grads = false;
  // bf16 inputs and products (forward, mechanisms with MechanismInfo::bf16; the runner refuses it
  // on a CPU without AVX512-BF16).
  Dtype dtype = Dtype::f32;
  // An additive position encoding inside the kernels (Capabilities::additive_bias).
  PositionBiasSpec bias = {};
  // RoPE inside the mechanism (Capabilities::rope_feature_maps): the model's --positions rope for
  // a mechanism that rotates its own feature maps rather than taking rotated queries and keys.
  bool rope = false;
};

// Inputs and outputs of one call. Gradients are only set for backward.
struct AttnArgs {
  TensorView q, k, v, o;
  TensorView dout, dq, dk, dv;
  // Token `pos` of q, k, v and o alone (N = 1): what decode_step takes.
  AttnArgs token(int64_t pos) const {
    AttnArgs t = *this;
    for (TensorView* x : {&t.q, &t.k, &t.v, &t.o}) *x = x->token(pos);
    return t;
  }
};

struct Capabilities {
  bool exact = true;     // equals vanilla under the dense mask of its pattern
  bool causal = true;    // supports causal masking
  bool backward = true;  // has a backward pass
  bool decode = false;   // has an autoregressive decode step
  std::string constraints;  // shape constraints in words, e.g. "N multiple of block"
  // Applies dropout to its attention probabilities (set_dropout); where not, why not.
  bool attn_dropout = false;
  std::string no_attn_dropout;
  // Takes queries and keys rotated by their positions (RoPE, the model's --positions rope): its
  // logits are q·k of the rows at their own positions, so the rotation makes them depend on the
  // offset; where not, why not.
  bool rope = true;
  std::string no_rope = "";
  // RoPE in RoFormer's form for kernelised attention (its section 3.3): the mechanism rotates its
  // feature maps phi(q), phi(k) in the numerator only (AttnProblem::rope), because rotating q and
  // k before a non-linear feature map would not make phi(q)·phi(k) a function of the offset.
  bool rope_feature_maps = false;
  // Adds an additive position encoding (AttnProblem::bias: ALiBi, T5's bias, Shaw's key
  // embeddings) to each logit it computes, from the pair's true positions; where not, why not.
  bool additive_bias = false;
  std::string no_additive_bias = "not implemented";
};

// A mechanism's bf16 path (AttnProblem::dtype): whether it has one, and within what ("forward;
// D of 16, 32, 64 or 128").
struct Bf16Support {
  bool available = false;
  std::string constraints;
  // Its backward pass runs in bf16 too. Without it a bf16 training step runs this mechanism in
  // float32 (the model's linear layers stay bf16) and the result says so.
  bool backward = false;
  // Its bf16 path applies attention dropout too (forward and backward). Without it a bf16
  // training step under attention dropout runs this mechanism in float32, and says so.
  bool attn_dropout = false;
};

// A tensor the model's optimiser trains: the mechanism's own parameter and its gradient, which a
// backward pass with AttnProblem::param_grads overwrites (summed over the batch).
struct LearnedTensor {
  std::string name;
  float* value = nullptr;
  float* grad = nullptr;
  int64_t count = 0;
};

// A mechanism's random or learned tensors, by the names and shapes of mechanisms.md: written by
// `attnbench dump`, and writable by tests (after setup) to set known values.
struct DumpTensor {
  std::string name;
  std::vector<int64_t> shape;
  float* f32 = nullptr;
  int64_t* i64 = nullptr;
};

class Attention {
 public:
  virtual ~Attention() = default;
  virtual void validate() const {}
  virtual double flops(Mode mode) const = 0;
  virtual size_t working_bytes(Mode mode) const = 0;
  virtual void setup(Mode mode, Rng& rng) = 0;
  virtual void forward(const AttnArgs& a) = 0;
  virtual void backward(const AttnArgs& a) {
    (void)a;
    throw std::logic_error("backward not supported");
  }
  // Untimed: the cache or state after tokens [0, n) of a.k and a.v.
  virtual void decode_prefill(const AttnArgs& a, int64_t n) {
    (void)a;
    (void)n;
    throw std::logic_error("decode not supported");
  }
  // Timed: the output of token `pos` (views with N = 1 in t.q, t.k, t.v, t.o) given tokens
  // [0, pos), storing token pos. Calling again with the same pos recomputes the same step;
  // pos + 1 moves on.
  virtual void decode_step(const AttnArgs& t, int64_t pos) {
    (void)t;
    (void)pos;
    throw std::logic_error("decode not supported");
  }
  virtual std::vector<DumpTensor> dump_tensors() const { return {}; }
  // ---- training (the model level) ----
  // Attention dropout for the calls that follow (rate 0: none, as in evaluation): each attention
  // probability is kept with probability 1 - rate and scaled by 1 / (1 - rate), the mask a
  // function of d.key and the element's position (core/dropout.hpp). Needs the capability and a
  // problem planned with attn_dropout.
  virtual void set_dropout(const Dropout& d) {
    if (d.active()) throw std::logic_error("this mechanism applies no attention dropout");
  }
  // The learned tensors (empty for a mechanism with none), valid after setup.
  virtual std::vector<LearnedTensor> learned() { return {}; }
  // Whether the forward calls that follow belong to a training step (the model's train_step
  // switches it on around its forward and off after). A mechanism whose state training updates
  // by a rule of its own rather than by gradients (routing's k-means centroids, an exponential
  // moving average) updates it in a training forward only: evaluation and the attention-level
  // benchmarks leave it fixed.
  virtual void set_training(bool on) { (void)on; }
  // That state (empty for most mechanisms; `grad` is null): what a checkpoint saves and restores
  // bit for bit and the best-validation copy keeps, which the optimiser does not touch. Valid
  // after setup.
  virtual std::vector<LearnedTensor> updated_state() { return {}; }
  // Training step `step` (from 1) begins: a mechanism whose random tensors are drawn afresh
  // during training (reformer's rotations, performer's features) draws them here. No allocation.
  virtual void begin_train_step(int64_t step, Rng& rng) {
    (void)step;
    (void)rng;
  }
  // Of the (query, key) logits one forward call computes, the fraction that are admissible:
  // 1 when no score is wasted; below 1 when tiles cross a pattern's edge or, as in `vanilla`
  // causal, a dense product is masked afterwards. nullopt for mechanisms that score no explicit
  // pairs (kernel, low-rank) or do not count them.
  virtual std::optional<double> admissible_fraction() const { return std::nullopt; }
  // A remark `attnbench dump` writes into config.json as "note", e.g. an input that is not used.
  virtual std::string dump_note() const { return {}; }
};

struct MechanismInfo {
  std::string name;
  std::string family;      // exact, sparse, low-rank, routing, kernel, synthetic
  std::string summary;     // one line
  std::string complexity;  // e.g. "O(N^2 D) time, O(N^2) memory"
  Capabilities caps;
  Bf16Support bf16;
  std::vector<ParamSpec> params;
  std::function<std::unique_ptr<Attention>(const AttnProblem&, const ParamValues&)> make;
  // Extra tokens a model prepends to every sequence for this mechanism, at its parameters: ETC's
  // global tokens, learned embeddings that are not input tokens. The mechanism sees them as the
  // first rows of Q, K, V; the model's loss and pooling read the rows after them. Empty: none.
  std::function<int64_t(const ParamValues&)> prepended_tokens;
  // The plain formula of an exact mechanism, beside its kernel: which (query, key) pairs it
  // computes at these parameters, length N and causality. Softmax over those pairs in double
  // precision (ref::forward, attention_impls/reference.hpp) is what its kernel must equal; the
  // tests hold every mechanism that sets it to that. Empty where the pairs depend on a draw
  // (bigbird: per head, from its dumped random blocks) or the mechanism is not masked softmax.
  std::function<ref::Mask(const ParamValues&, int64_t N, bool causal)> reference_mask;
  // The plain formula of every other mechanism, beside its kernel (ref:: functions defined in its
  // file): O (B, H, N, D) in double from the call's inputs and the mechanism's drawn or learned
  // state as it dumps it (impl.dump_tensors()), for the problem it was made for (without a
  // position bias). Its kernel must equal it; the tests hold every mechanism that sets it to that.
  // Every mechanism sets exactly one of reference_mask and reference.
  std::function<std::vector<double>(const Attention& impl, const AttnArgs& a, const AttnProblem& p,
                                    const ParamValues& v)>
      reference;
};

// The tensor called `name` among impl's dump tensors; std::logic_error when it has none.
DumpTensor dump_tensor(const Attention& impl, const std::string& name);

// Parses "name=value" assignments against a mechanism's declared parameters; unknown names and
// out-of-range or ill-typed values throw InvalidInput listing what is valid.
inline ParamValues resolve_params(const MechanismInfo& info, const std::vector<std::string>& assignments) {
  return resolve_params(info.name, info.params, assignments);
}

// FLOPs of softmax attention restricted to `pairs` (query, key) pairs: QK^T and PV, two
// multiply-adds per pair per head dimension each.
inline double attention_pair_flops(double pairs, int64_t D) { return 4.0 * pairs * D; }
// Number of (query, key) pairs of full or causal attention over N tokens.
inline double dense_pairs(int64_t N, bool causal) {
  return causal ? 0.5 * static_cast<double>(N) * static_cast<double>(N + 1)
                : static_cast<double>(N) * static_cast<double>(N);
}

// Forward FLOPs of full (or causal) softmax attention over the problem's shape.
inline double dense_attention_flops(const AttnProblem& p) {
  return attention_pair_flops(dense_pairs(p.shape.N, p.causal), p.shape.D) *
         static_cast<double>(p.shape.B * p.shape.H);
}
// Runs f(thread, b, h) for every (batch, head) pair, the pairs shared out over the OpenMP threads
// one at a time (heads can differ in cost, so dynamically).
template <class F>
void for_each_head(const Shape4& s, F&& f) {
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) f(omp_get_thread_num(), bh / s.H, bh % s.H);
}

// Forward+backward counts 3.5x the forward, FlashAttention's convention: the backward pass
// recomputes QK^T and does four more products of the same size.
inline double with_backward(double forward_flops, Mode mode) {
  return mode == Mode::fwd ? forward_flops : 3.5 * forward_flops;
}

}  // namespace ab
