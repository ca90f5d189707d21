// The model level: a pre-LayerNorm Transformer encoder (causal decoder for `copy`) on a task's
// tokens, whose attention core is any registered mechanism: the LRA efficiency table measures
// this whole training step, not the attention call alone.
//
//   tokens (B, N) -> embedding + positions (sinusoidal, learned or none; rope rotates each layer's q, k) (+ a learned CLS vector
//   at position 0) -> dropout
//   L x [ x += dropout(Wo · attention(split(LN1(x) · Wqkv))) ;  x += dropout(W2 · gelu(W1 · LN2(x))) ]
//   LN_f -> pooling (CLS: position 0; mean; retrieval: both documents through the same encoder,
//   head on [e1, e2, e1·e2, e1-e2]) -> W_c2 · gelu(W_c1 · ·) -> softmax cross-entropy;
//   copy: next-token logits at every position, loss where the task's loss mask is set.
//
// Life of a model point, as for a mechanism: construct (validates, no allocation) -> flops() and
// working_bytes() analytic -> setup(seed) allocates everything (tracked) and creates every
// primitive -> step() runs forward, loss, and in train mode backward and AdamW, allocating
// nothing. Activations live in one arena laid out in the constructor, so working_bytes() is the
// exact tracked peak of a step. In fwd mode the per-layer activations share one slot, since
// nothing is kept for a backward pass.
//
// Training (model/trainer.hpp drives it): train_step() redraws the mechanisms' random tensors
// (reformer's rotations, performer's features), runs forward with dropout on the embedding and
// the residual branches and, where the mechanism applies it, on the attention probabilities,
// backward (the mechanisms' own learned tensors included: Linformer's E, F, Sinkhorn's W1, W2,
// Synthesizer's logits, the compressed attention's kernels), clips the gradients and takes the
// AdamW step at the given learning rate. Dropout masks are hashes of (seed, step, site, position)
// (core/dropout.hpp): nothing is stored, and a resumed run draws the same masks. evaluate() runs
// the forward pass without dropout and counts correct predictions.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "attention_impls/attention.hpp"
#include "core/matmul.hpp"
#include "model/layers.hpp"
#include "tasks/task.hpp"

namespace ab {

// Where a step's time goes, from the model's own timers (wall clock per layer type).
enum class LayerType { embedding, layernorm, projections, attention, feedforward, head, optimizer };
constexpr int kLayerTypes = 7;
const std::array<const char*, kLayerTypes>& layer_type_names();

// What one step does: forward and loss (inference), and the backward pass, and the AdamW update.
enum class ModelMode { fwd, fwdbwd, train };
const char* to_string(ModelMode m);  // fwd | fwdbwd | train

// The position encoding.
// sinusoidal, learned: a vector added to the token embedding; none: nothing.
// rope: each layer rotates its queries and keys by their positions (RoFormer).
// alibi, bias, shaw: each layer's mechanism adds a bias to its logits from the pair's positions,
//   inside its kernels (AttnProblem::bias): ALiBi's fixed slopes, T5's learned bias per head and
//   offset bucket ("bias:BUCKETS:MAX_DISTANCE", default 32:128), Shaw's learned key embeddings of
//   the offset clipped to +-K ("shaw:K", default 16), one table per layer.
enum class Positions { sinusoidal, learned, none, rope, alibi, bias, shaw };
inline constexpr Positions kAllPositions[] = {Positions::sinusoidal, Positions::learned, Positions::none, Positions::rope,
                                              Positions::alibi,      Positions::bias,    Positions::shaw};
const char* to_string(Positions p);
// An encoding as written ("shaw", "bias:64:256"): its kind and the mechanism-side spec
// (PositionBiasKind::none for the first four). Throws InvalidInput naming what is wrong.
struct PositionEncoding {
  Positions kind = Positions::sinusoidal;
  PositionBiasSpec bias;
};
PositionEncoding parse_position_encoding(const std::string& text);
// The canonical spelling: every parameter written ("bias" -> "bias:32:128").
std::string to_string(const PositionEncoding& e);
// The kind of a written encoding (parse_position_encoding(text).kind).
Positions parse_positions(const std::string& text);
// to_string(parse_position_encoding(text)).
std::string canonical_positions(const std::string& text);

// Gradient clipping before the optimizer step: none, the global norm of every gradient (LRA's
// PyTorch ports), or each tensor's own norm ("Transformers are RNNs").
enum class ClipMode { global, per_tensor };

struct ModelConfig {
  int64_t vocab = 0, classes = 0;  // classes 0: next-token head over the vocabulary (copy)
  int64_t seq = 0, batch = 0, layers = 0, dmodel = 0, heads = 0, mlp = 0;
  Pooling pooling = Pooling::cls;
  bool two_tower = false;  // retrieval: two documents per example, shared encoder
  bool causal = false;
  std::string mechanism = "flash";
  ParamValues params;      // the mechanism's, resolved
  int threads = 1;
  AdamW optimizer;
  Positions positions = Positions::sinusoidal;
  PositionBiasSpec position_bias;  // alibi, bias, shaw: the mechanism's (parse_position_encoding)
  // Training: dropout on the embedding and on both residual branches, and on the attention
  // probabilities (mechanisms with the capability; 0 elsewhere). Evaluation runs without.
  float dropout = 0, attn_dropout = 0;
  float clip = 0;  // 0: no clipping
  ClipMode clip_mode = ClipMode::global;
  // bf16: every product in bf16 with float accumulation (the linear layers' inputs, weights and,
  // backward, output gradients rounded per step; the attention's own bf16 path where it has one
  // for the mode, else float32: attention_dtype); embedding, layer norms, GELU, softmax, the
  // loss, the residual stream, the master weights, the gradients and AdamW's moments in float
  // (PyTorch's CPU autocast). Forward (inference) needs a mechanism with a bf16 path.
  Dtype dtype = Dtype::f32;
  // A language model whose examples predict at few positions (mqar: D queries of N): the output
  // layer runs on those rows only, gathered, at most this many per example (0: every position,
  // the full head). The loss and its gradients are those of the full head (tested).
  int64_t loss_positions = 0;
  // The output layer of a language model is the token embedding transposed (no bias), as Zoology
  // and GPT-2 tie them; the embedding is then initialised N(0, 0.02), GPT-2's scale.
  bool tie_embeddings = false;
};

// The model config of a task (tasks.md shapes) at the task's options (vocabulary, the positions
// that carry a loss); a length of 0 keeps the task's default.
ModelConfig model_config_for_task(const TaskInfo& task, const TaskOptions& options);
inline ModelConfig model_config_for_task(const TaskInfo& task, int64_t seq) {
  TaskOptions o;
  o.seq = seq;
  return model_config_for_task(task, o);
}

// The precision a model's attention runs in: bf16 when the model is bf16 and the mechanism's bf16
// path covers the mode (forward, or forward and backward), else float32.
Dtype attention_dtype(const ModelConfig& c, const MechanismInfo& info, ModelMode mode);

class TransformerModel {
 public:
  // mode: fwd (inference), fwdbwd (forward, loss, backward), train (and the AdamW step).
  // Throws InvalidInput for impossible shapes or mechanism parameters.
  TransformerModel(const ModelConfig& c, ModelMode mode);
  ~TransformerModel();

  double flops() const;           // analytic, per step: products, attention, forward (+ backward)
  size_t working_bytes() const;   // exact tracked bytes after setup (see memory_parts)
  // The declared parts of working_bytes, by name: parameters, gradients, optimizer state,
  // activations (the arena), token buffers, scratchpad, attention (the mechanisms' own).
  std::vector<std::pair<std::string, size_t>> memory_parts() const;

  void setup(uint64_t seed);
  // One step on a batch of the task (batch.size == config batch, batch.seq == seq). Returns the
  // loss of the forward pass (before the optimizer step). In train mode this is train_step at the
  // configured learning rate and the model's own step count: the step `run --mode train` times.
  double step(const Batch& batch);

  // A training step (train mode): step number `step` (from 1: it keys the dropout masks and the
  // redraws, and AdamW's bias correction), the learning rate `lr`.
  struct StepOutcome {
    double loss = 0;       // of the forward pass, with dropout
    double grad_norm = 0;  // the global gradient norm, before clipping
  };
  StepOutcome train_step(const Batch& batch, int64_t step, float lr);

  // Forward without dropout on a batch whose first `valid` examples count (a final partial batch
  // is padded with repeats): the summed loss and the correct predictions. Classifiers count one
  // prediction per example; the language model (copy) one per counted position, and a sequence
  // is exact when all of its counted positions are right.
  struct Evaluation {
    double loss_sum = 0;
    int64_t predictions = 0, correct = 0;
    int64_t sequences = 0, exact = 0;
    // Language models: the sum over examples with a counted position of the share of them
    // answered right (Zoology's accuracy averages it over examples), and those examples.
    double query_share_sum = 0;
    int64_t query_examples = 0;
  };
  Evaluation evaluate(const Batch& batch, int64_t valid);
  // The counting evaluate() does on the probabilities (rows, C): examples of rows_per_example
  // rows each; a row counts when its target is >= 0 (argmax over all C classes). An example is
  // exact when all its counted rows are right (and it has one).
  static Evaluation count_predictions(const float* probs, const int32_t* targets, int64_t examples, int64_t rows_per_example,
                                      int64_t C);

  // Everything a checkpoint must hold to continue bit for bit: every trained tensor (the model's
  // parameters, then each mechanism's learned tensors) and AdamW's two moments of each, by name.
  struct StateTensor {
    std::string name;
    float* data = nullptr;
    int64_t count = 0;
  };
  std::vector<StateTensor> state();
  // The trained tensors alone (for the best-validation copy and tests), in state() order.
  std::vector<StateTensor> trained_tensors() const;
  // Forward and loss only (whatever the mode); for finite differences.
  double loss(const Batch& batch);

  const std::array<double, kLayerTypes>& layer_seconds() const { return seconds_; }
  void reset_timers() { seconds_.fill(0); }

  // Parameters as named slices of one flat vector, with their gradients after a backward pass.
  struct Slice {
    std::string name;
    int64_t offset = 0, count = 0;
    float init_stddev = 0, init_value = 0;  // normal(0, stddev) when stddev > 0, else the value
  };
  const std::vector<Slice>& parameters() const { return slices_; }
  float* weights() const { return weights_.data(); }
  float* gradients() const { return grads_.data(); }
  int64_t parameter_count() const { return n_params_; }
  const ModelConfig& config() const { return config_; }
  // What ran in which precision ("" in float32), for the result's message.
  std::string precision() const;

 private:
  struct LayerParams { int64_t ln1_g, ln1_b, wqkv, bqkv, wo, bo, ln2_g = 0, ln2_b = 0, w1 = 0, b1 = 0, w2 = 0, b2 = 0; };
  struct LayerActs { int64_t h1, mean1, var1, q, k, v, o, a, xm, h2 = 0, mean2 = 0, var2 = 0, u = 0, g = 0; };

  int64_t param(const std::string& name, int64_t count, float stddev, float value = 0);
  int64_t act(int64_t count);
  float* A(int64_t off) const { return arena_.data() + off; }
  float* W(int64_t off) const { return weights_.data() + off; }
  float* G(int64_t off) const { return grads_.data() + off; }
  AttnArgs attention_args(int64_t layer) const;
  void create_primitives();
  void load(const Batch& batch);
  double forward_and_loss(bool with_grad);
  void backward();
  // The dropout of site `site` (0 the embedding, 1 the attention branch, 2 the feed-forward
  // branch, 3 the attention probabilities: its key; the caller sets the rate) of layer `layer`
  // (-1: below the first) at the current step; rate 0 outside train_step.
  Dropout dropout_at(int64_t layer, int site) const;
  void drop_rows(float* x, const Dropout& d) const;
  const float* dropped_copy(const float* src, float* dst, const Dropout& d) const;
  // The squared norm of every gradient, and clipping by config_.clip (global or per tensor).
  double clip_gradients();
  size_t learned_bytes() const;
  template <class F> void timed(LayerType t, F&& f);
  bool bf16() const { return config_.dtype == Dtype::bf16; }
  bool has_mlp() const { return config_.mlp > 0; }
  // The classifier head's hidden width: the feed-forward width, or d_model in a model without one.
  int64_t head_hidden() const { return config_.mlp > 0 ? config_.mlp : config_.dmodel; }
  // The output layer's input rows: the final hidden state, or its gathered loss rows.
  const float* head_input() const { return compact_ ? A(hg_) : A(hf_); }
  // A linear layer's input (n floats) and weight matrix as its product reads them: themselves,
  // or (bf16) rounded: the input into xb_, the weights from wb_ (rounded at the step's start).
  const void* product_input(const float* x, int64_t n) const;
  // A block's linear input that its backward pass reads again: bf16 training rounds it once, in
  // the forward pass, into its own place in kept_ (layer l; slot: kQkvIn, kOutIn, kFf1In, kFf2In)
  // and the backward products read that copy (round: false). Otherwise as product_input.
  enum KeptInput { kQkvIn, kOutIn, kFf1In, kFf2In };
  const void* kept_input(const float* x, int64_t l, KeptInput slot, bool round) const;
  uint16_t* kept_slot(int64_t l, KeptInput slot) const;
  // o_lin's input: the heads merged into a.a, or (bf16) rounded on the way into their kept (or
  // passing) copy, without the float a.
  const void* merged_heads(const float* o, float* a, int64_t l) const;
  const void* product_weights(int64_t off) const;
  // Where a bf16 layer's backward rounds its dY (gb_); null in a float model.
  uint16_t* grad_bf16() const;
  size_t bf16_bytes() const;

  ModelConfig config_;
  ModelMode mode_;
  bool backward_ = false;
  // Sizes. enc_batch_: sequences through the encoder (2 x batch for a two-tower task); seq_rows_:
  // rows of one encoder sequence, global_rows_ prepended global rows (ETC's; 0 otherwise) then
  // the N tokens; enc_rows_ = enc_batch_ x seq_rows_, the rows of every (enc_rows_, d) activation
  // below; head_dim_ = d / H; rows_: the output layer's rows (a language model's loss rows, or
  // the batch); out_width_: its width (the vocabulary, or the classes); feat_: the classifier's
  // input width (d, or 4d for two towers).
  int64_t enc_batch_ = 0, enc_rows_ = 0, head_dim_ = 0, rows_ = 0, out_width_ = 0, feat_ = 0;
  int64_t global_rows_ = 0, seq_rows_ = 0;
  int64_t globals_ = -1;  // the global rows' learned embeddings (global_rows_, d), with global_rows_ > 0
  bool compact_ = false;  // a language model's head on its gathered loss rows (loss_positions > 0)
  // Parameter layout.
  std::vector<Slice> slices_;
  int64_t n_params_ = 0;
  int64_t emb_ = 0, cls_ = -1, positions_ = -1, lnf_g_ = 0, lnf_b_ = 0, wc1_ = 0, bc1_ = 0, wc2_ = 0, bc2_ = 0;
  std::vector<LayerParams> lp_;
  // Arena layout (float offsets; R = enc_rows_, F = mlp, Fh = the classifier's hidden width).
  int64_t n_act_ = 0;
  int64_t rope_ = -1;  // the RoPE table (cos then sin, seq_rows_ x head_dim_/2 each) with --positions rope
  int64_t pos_ = 0;       // (N, d) sinusoidal positions
  int64_t qkv_ = 0;       // (R, 3d) the q, k, v projection before the head split (backward: its gradient)
  int64_t hf_ = 0, meanf_ = 0, varf_ = 0;  // the final layer norm: (R, d) output, (R) mean and variance
  int64_t feat_buf_ = 0, z_ = 0, gz_ = 0;  // classifier: (batch, feat_) pooled features, (batch, Fh) hidden and GELU
  int64_t logits_ = 0;    // (rows_, out_width_)
  int64_t hg_ = 0, dhg_ = 0;  // compact head: the gathered rows (rows_, d) and their gradient
  // Backward: (R, d) gradients of the residual stream (dres_), two scratch (dtmp_, dtmp2_), the
  // attention output and the q, k, v heads (do_, dq_, dk_, dv_); (R, F) the MLP's hidden
  // (dff_); the classifier's (batch, feat_) features and (batch, Fh) hidden (dfeat_, dz_).
  int64_t dres_ = 0, dtmp_ = 0, dtmp2_ = 0, do_ = 0, dq_ = 0, dk_ = 0, dv_ = 0, dff_ = 0, dfeat_ = 0, dz_ = 0;
  std::vector<int64_t> x_;  // residual stream, L + 1 slots of (R, d)
  std::vector<LayerActs> la_;
  // Mechanisms, one per layer (each keeps its own forward state for its backward pass).
  std::vector<std::unique_ptr<Attention>> attn_;
  // Primitives.
  Linear qkv_lin_, o_lin_, ff1_lin_, ff2_lin_, head1_lin_, head2_lin_;
  LayerNorm ln_;
  Gelu ff_gelu_, head_gelu_;
  RowSoftmax softmax_;
  size_t scratch_bytes_ = 0;
  // Tracked storage.
  // The parameters (n_params_ floats each): weights, gradients, AdamW's first and second moments;
  // the activations (n_act_ floats, the offsets above).
  Buffer<float> weights_, grads_, adam_m_, adam_v_, arena_;
  Buffer<std::byte> scratch_;
  Buffer<int32_t> tokens_, targets_;
  Buffer<int32_t> gather_;  // compact head: the token row of each loss row (rows_)
  // bf16: the parameters, the largest linear layer's input and (backward) its output's gradient.
  // bf16 training: the blocks' linear inputs, rounded in the forward pass (kept_input).
  Buffer<uint16_t> wb_, xb_, gb_, kept_;
  int64_t xb_floats_ = 0, gb_floats_ = 0, kept_floats_ = 0;
  int64_t steps_ = 0;
  // Training: the mechanisms' learned tensors and their AdamW moments, the dropout seed, and
  // whether this forward pass drops (train_step) or not (evaluate, loss).
  std::vector<LearnedTensor> learned_;
  Buffer<float> learned_m_, learned_v_;
  int64_t learned_floats_ = 0;
  uint64_t seed_ = 0;
  bool dropping_ = false;
  bool attn_dropout_planned_ = false;
  std::string attention_f32_because_;  // bf16 training: the mechanism refused the shape in bf16
  std::vector<double> tensor_norms_;
  std::array<double, kLayerTypes> seconds_{};
};

}  // namespace ab
