#include "model/transformer.hpp"

#include <fmt/format.h>

#include <omp.h>

#include <chrono>
#include <cmath>

#include "attention_impls/registry.hpp"
#include "core/rng.hpp"
#include "core/rope.hpp"
#include "core/vecmath.hpp"

namespace ab {

const std::array<const char*, kLayerTypes>& layer_type_names() {
  static const std::array<const char*, kLayerTypes> names = {"embedding", "layernorm", "projections", "attention",
                                                             "feedforward", "head", "optimizer"};
  return names;
}

const char* to_string(ModelMode m) {
  switch (m) {
    case ModelMode::fwd: return "fwd";
    case ModelMode::fwdbwd: return "fwdbwd";
    case ModelMode::train: return "train";
  }
  return "?";
}

const char* to_string(Positions p) {
  switch (p) {
    case Positions::sinusoidal: return "sinusoidal";
    case Positions::learned: return "learned";
    case Positions::none: return "none";
    case Positions::rope: return "rope";
    case Positions::alibi: return "alibi";
    case Positions::bias: return "bias";
    case Positions::shaw: return "shaw";
  }
  return "?";
}

PositionEncoding parse_position_encoding(const std::string& text) {
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  std::vector<std::string> args;
  for (size_t at = colon; at != std::string::npos;) {
    const size_t next = text.find(':', at + 1);
    args.push_back(text.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1));
    at = next;
  }
  PositionEncoding e;
  std::vector<std::string> names;
  bool found = false;
  for (Positions p : kAllPositions) {
    names.emplace_back(to_string(p));
    if (name == to_string(p)) {
      e.kind = p;
      found = true;
    }
  }
  if (!found) throw unknown_name("positions", name, names, "positions");
  const size_t takes = e.kind == Positions::bias ? 2 : e.kind == Positions::shaw ? 1 : 0;
  if (args.size() > takes)
    throw InvalidInput(fmt::format("--positions {} takes {}; got '{}'", name,
                                   takes == 2 ? "bias:BUCKETS:MAX_DISTANCE" : takes == 1 ? "shaw:CLIP" : "no parameters", text));
  auto count = [&](size_t k, int64_t def, const char* what) {
    if (k >= args.size()) return def;
    const std::string& a = args[k];
    int64_t v = 0;
    size_t used = 0;
    try {
      v = std::stoll(a, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (a.empty() || used != a.size() || v < 1 || v > (int64_t{1} << 20))
      throw InvalidInput(fmt::format("--positions {}: {} must be a whole number from 1 to 2^20, got '{}'", name, what, a));
    return v;
  };
  if (e.kind == Positions::alibi) e.bias.kind = PositionBiasKind::alibi;
  if (e.kind == Positions::bias) {
    e.bias.kind = PositionBiasKind::t5;
    e.bias.buckets = count(0, 32, "the bucket count");
    e.bias.max_distance = count(1, 128, "the maximum distance");
  }
  if (e.kind == Positions::shaw) {
    e.bias.kind = PositionBiasKind::shaw;
    e.bias.clip = count(0, 16, "the clip distance");
  }
  return e;
}

Positions parse_positions(const std::string& text) { return parse_position_encoding(text).kind; }

std::string canonical_positions(const std::string& text) { return to_string(parse_position_encoding(text)); }

std::string to_string(const PositionEncoding& e) {
  if (e.kind == Positions::bias) return fmt::format("bias:{}:{}", e.bias.buckets, e.bias.max_distance);
  if (e.kind == Positions::shaw) return fmt::format("shaw:{}", e.bias.clip);
  return to_string(e.kind);
}

ModelConfig model_config_for_task(const TaskInfo& task, const TaskOptions& options) {
  ModelConfig c;
  TaskOptions o = options;
  o.seq = o.seq > 0 ? o.seq : task.default_seq;
  c.vocab = o.vocab > 0 ? o.vocab : task.vocab;
  c.loss_positions = task.loss_positions ? task.loss_positions(o) : 0;
  c.classes = task.classes;
  c.seq = o.seq;
  c.batch = task.model.batch;
  c.layers = task.model.layers;
  c.dmodel = task.model.dmodel;
  c.heads = task.model.heads;
  c.mlp = task.model.mlp;
  c.pooling = task.model.pooling;
  c.two_tower = task.two_tower;
  c.causal = task.next_token;
  return c;
}

namespace {
// Random streams of the model's own draws (the mechanisms get one stream per layer).
constexpr uint64_t kStreamModelInit = 200, kStreamLayerMechanism = 300;
constexpr int64_t kAlign = 16;  // floats: every arena slice starts on a 64-byte line
int64_t aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

int64_t TransformerModel::param(const std::string& name, int64_t count, float stddev, float value) {
  const int64_t off = n_params_;
  slices_.push_back({name, off, count, stddev, value});
  n_params_ += aligned(count);
  return off;
}

int64_t TransformerModel::act(int64_t count) {
  const int64_t off = n_act_;
  n_act_ += aligned(count);
  return off;
}

namespace {
// Why a bf16 model's attention runs in float32 ("" when it runs in bf16).
std::string attention_in_f32_because(const ModelConfig& c, const MechanismInfo& info, ModelMode mode) {
  if (!info.bf16.available) return "no bf16 path";
  if (c.position_bias.active() || c.positions == Positions::alibi || c.positions == Positions::bias || c.positions == Positions::shaw)
    return "a position encoding inside the kernel is float32";
  if (mode == ModelMode::fwd) return "";
  if (!info.bf16.backward) return "its bf16 path is forward only";
  if (mode == ModelMode::train && c.attn_dropout > 0 && info.caps.attn_dropout && !info.bf16.attn_dropout)
    return "attention dropout is float32";
  return "";
}
}  // namespace

Dtype attention_dtype(const ModelConfig& c, const MechanismInfo& info, ModelMode mode) {
  if (c.dtype != Dtype::bf16) return Dtype::f32;
  return attention_in_f32_because(c, info, mode).empty() ? Dtype::bf16 : Dtype::f32;
}

std::string TransformerModel::precision() const {
  if (!bf16()) return "";
  const MechanismInfo& info = find_mechanism(config_.mechanism);
  const std::string why = attention_f32_because_.empty() ? attention_in_f32_because(config_, info, mode_) : attention_f32_because_;
  return fmt::format("bf16 step: the linear layers' products in bf16 with float accumulation{}; {} in {}", backward_ ? ", forward and backward" : "",
                     config_.mechanism, why.empty() ? "bf16" : fmt::format("f32 ({})", why));
}

TransformerModel::TransformerModel(const ModelConfig& c, ModelMode mode) : config_(c), mode_(mode) {
  backward_ = mode != ModelMode::fwd;
  // The mechanisms and primitives are planned for this many threads (one execution slot each).
  if (c.threads < 1) throw InvalidInput(fmt::format("--threads must be positive, got {}", c.threads));
  omp_set_num_threads(c.threads);
  const int64_t L = c.layers, d = c.dmodel, H = c.heads, F = c.mlp, N = c.seq;
  if (L < 1 || d < 1 || H < 1 || F < 0 || N < 2 || c.batch < 1)
    throw InvalidInput(fmt::format("model sizes must be positive (layers={} dmodel={} heads={} batch={}; mlp={}: 0 for blocks "
                                   "without one) and seq at least 2 (got {})",
                                   L, d, H, c.batch, F, N));
  if (d % H) throw InvalidInput(fmt::format("--dmodel {} is not a multiple of --heads {}", d, H));
  if (c.vocab < 2) throw InvalidInput("the vocabulary needs at least 2 tokens");
  if (c.pooling != Pooling::lm && c.classes < 2) throw InvalidInput("a classifier needs at least 2 classes");
  head_dim_ = d / H;
  enc_batch_ = c.two_tower ? 2 * c.batch : c.batch;
  // ETC's global tokens: learned rows before each sequence's tokens (seq_rows_ rows an encoder sequence).
  const MechanismInfo& info = find_mechanism(c.mechanism);
  global_rows_ = info.prepended_tokens ? info.prepended_tokens(c.params) : 0;
  if (global_rows_ < 0) throw std::logic_error(fmt::format("{} prepends {} tokens", c.mechanism, global_rows_));
  seq_rows_ = N + global_rows_;
  enc_rows_ = enc_batch_ * seq_rows_;
  const bool lm = c.pooling == Pooling::lm;
  if (c.loss_positions < 0 || c.loss_positions > N || (c.loss_positions > 0 && !lm))
    throw std::logic_error(fmt::format("loss_positions {} for a model of N {}{}", c.loss_positions, N, lm ? "" : " (not a language model)"));
  if (c.tie_embeddings && !lm)
    throw InvalidInput("--tie-embeddings ties a language model's output layer to its embedding; a classifier has none");
  compact_ = lm && c.loss_positions > 0;
  rows_ = lm ? (compact_ ? c.batch * c.loss_positions : enc_rows_) : c.batch;
  out_width_ = lm ? c.vocab : c.classes;
  feat_ = c.two_tower ? 4 * d : d;

  // 1. Mechanisms: one per layer, validated now (no allocation until setup).
  AttnProblem p;
  p.shape = Shape4{enc_batch_, H, seq_rows_, head_dim_};
  p.causal = c.causal;
  p.strides = Strides3::contiguous(p.shape);
  p.threads = c.threads;
  // bf16: the mechanism's own bf16 path where it has one for this mode; else it runs in float32
  // inside the bf16 step (training, or no bf16 path at all), and precision() says so.
  p.dtype = attention_dtype(c, info, mode);
  if (c.dtype == Dtype::bf16 && mode == ModelMode::fwd && !info.bf16.available)
    throw InvalidInput(fmt::format("{} has no bf16 path", c.mechanism));
  if (c.dtype == Dtype::bf16 && !cpu_has_bf16()) throw InvalidInput("--dtype bf16 needs a CPU with AVX512-BF16 (vdpbf16ps); this one has none");
  // Training: the mechanism's own tensors learn with the model, and it drops attention
  // probabilities where it can (a mechanism without the capability runs without: `list` says
  // which, and the trainer records it).
  p.param_grads = backward_;
  p.attn_dropout = mode == ModelMode::train && c.attn_dropout > 0 && info.caps.attn_dropout;
  if (!(c.dropout >= 0 && c.dropout < 1) || !(c.attn_dropout >= 0 && c.attn_dropout < 1))
    throw InvalidInput(fmt::format("dropout rates must be in [0, 1), got --dropout {} --attn-dropout {}", c.dropout, c.attn_dropout));
  attn_dropout_planned_ = p.attn_dropout;
  if (c.positions == Positions::rope && !info.caps.rope)
    throw InvalidInput(fmt::format("--positions rope with {}: {}", c.mechanism, info.caps.no_rope));
  // The additive encodings' spec: as given, or their defaults when only the kind was set.
  p.bias = c.position_bias;
  if (const PositionBiasSpec kind_default = parse_position_encoding(to_string(c.positions)).bias; kind_default.kind != p.bias.kind)
    p.bias = kind_default;
  if (p.bias.active() && !info.caps.additive_bias)
    throw InvalidInput(fmt::format("--positions {} with {}: {}", to_string(c.positions), c.mechanism, info.caps.no_additive_bias));
  // RoPE rotates q and k before the mechanism, or, for the kernel family, the mechanism's own
  // feature maps inside it (RoFormer section 3.3).
  p.rope = c.positions == Positions::rope && info.caps.rope_feature_maps;
  const bool rotate_qk = c.positions == Positions::rope && !p.rope;
  if (rotate_qk && head_dim_ % 2)
    throw InvalidInput(fmt::format("--positions rope rotates pairs of a head's dimensions; the head size {} is odd", head_dim_));
  // A bf16 training step whose mechanism refuses this shape in bf16 (flash's kernel and a head
  // size it lacks) runs the attention in float32 and says why; inference refuses it.
  if (p.dtype == Dtype::bf16 && backward_) try {
      info.make(p, c.params)->validate();
    } catch (const InvalidInput& e) {
      p.dtype = Dtype::f32;
      attention_f32_because_ = e.what();
    }
  for (int64_t l = 0; l < L; ++l) {
    attn_.push_back(info.make(p, c.params));
    attn_.back()->validate();
  }

  // 2. Parameters. Weights N(0, 1/fan_in), the embedding N(0, 1) (the scale of the positions).
  const float sd = 1.0f / std::sqrt(static_cast<float>(d)), sf = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(F, 1)));
  const int64_t Fh = head_hidden();
  const float sh = 1.0f / std::sqrt(static_cast<float>(Fh));
  emb_ = param("embedding", c.vocab * d, c.tie_embeddings ? 0.02f : 1.0f);
  if (c.pooling == Pooling::cls) cls_ = param("cls", d, 0.02f);
  if (global_rows_ > 0) globals_ = param("globals", global_rows_ * d, c.tie_embeddings ? 0.02f : 1.0f);  // at the tokens' scale
  // Learned absolute positions, N(0, 0.02) as the PyTorch LRA ports initialise them.
  if (c.positions == Positions::learned) positions_ = param("positions", N * d, 0.02f);
  for (int64_t l = 0; l < L; ++l) {
    auto n = [&](const char* s) { return fmt::format("layer{}.{}", l, s); };
    LayerParams q;
    q.ln1_g = param(n("ln1.scale"), d, 0, 1);
    q.ln1_b = param(n("ln1.shift"), d, 0);
    q.wqkv = param(n("attn.wqkv"), d * 3 * d, sd);
    q.bqkv = param(n("attn.bqkv"), 3 * d, 0);
    q.wo = param(n("attn.wo"), d * d, sd);
    q.bo = param(n("attn.bo"), d, 0);
    if (F > 0) {  // --mlp 0: blocks of attention alone (Zoology's MQAR models)
      q.ln2_g = param(n("ln2.scale"), d, 0, 1);
      q.ln2_b = param(n("ln2.shift"), d, 0);
      q.w1 = param(n("ffn.w1"), d * F, sd);
      q.b1 = param(n("ffn.b1"), F, 0);
      q.w2 = param(n("ffn.w2"), F * d, sf);
      q.b2 = param(n("ffn.b2"), d, 0);
    }
    lp_.push_back(q);
  }
  lnf_g_ = param("lnf.scale", d, 0, 1);
  lnf_b_ = param("lnf.shift", d, 0);
  if (lm && !c.tie_embeddings) {
    wc1_ = param("head.wout", d * out_width_, sd);
    bc1_ = param("head.bout", out_width_, 0);
  } else if (!lm) {
    wc1_ = param("head.w1", feat_ * Fh, 1.0f / std::sqrt(static_cast<float>(feat_)));
    bc1_ = param("head.b1", Fh, 0);
    wc2_ = param("head.w2", Fh * out_width_, sh);
    bc2_ = param("head.b2", out_width_, 0);
  }

  // 3. The arena. The residual stream has L + 1 slots; the per-layer activations have L slots
  // when a backward pass reads them, else one shared slot.
  if (c.positions == Positions::sinusoidal) pos_ = act(N * d);
  if (rotate_qk) rope_ = act(seq_rows_ * head_dim_);  // every row the mechanism sees
  for (int64_t l = 0; l <= L; ++l) x_.push_back(act(enc_rows_ * d));
  const int64_t slots = backward_ ? L : 1;
  for (int64_t s = 0; s < slots; ++s) {
    LayerActs a;
    a.h1 = act(enc_rows_ * d);
    a.mean1 = act(enc_rows_);
    a.var1 = act(enc_rows_);
    a.q = act(enc_rows_ * d);
    a.k = act(enc_rows_ * d);
    a.v = act(enc_rows_ * d);
    a.o = act(enc_rows_ * d);
    a.a = act(enc_rows_ * d);
    a.xm = act(enc_rows_ * d);
    if (F > 0) {
      a.h2 = act(enc_rows_ * d);
      a.mean2 = act(enc_rows_);
      a.var2 = act(enc_rows_);
      a.u = act(enc_rows_ * F);
      a.g = act(enc_rows_ * F);
    }
    la_.push_back(a);
  }
  qkv_ = act(enc_rows_ * 3 * d);  // the projection's output before the head split (backward: dqkv)
  hf_ = act(enc_rows_ * d);
  meanf_ = act(enc_rows_);
  varf_ = act(enc_rows_);
  if (!lm) {
    feat_buf_ = act(c.batch * feat_);
    z_ = act(c.batch * Fh);
    gz_ = act(c.batch * Fh);
  }
  if (compact_) hg_ = act(rows_ * d);
  logits_ = act(rows_ * out_width_);
  if (backward_) {
    dres_ = act(enc_rows_ * d);
    dtmp_ = act(enc_rows_ * d);
    dtmp2_ = act(enc_rows_ * d);
    do_ = act(enc_rows_ * d);
    dq_ = act(enc_rows_ * d);
    dk_ = act(enc_rows_ * d);
    dv_ = act(enc_rows_ * d);
    if (F > 0) dff_ = act(enc_rows_ * F);
    if (!lm) {
      dfeat_ = act(c.batch * feat_);
      dz_ = act(c.batch * Fh);
    }
    if (compact_) dhg_ = act(rows_ * d);
  }
  create_primitives();
}

TransformerModel::~TransformerModel() = default;

// Every primitive, created once; their scratchpads size the one scratch region. Made in the
// constructor, untracked and without touching data, so working_bytes() is exact before setup.
void TransformerModel::create_primitives() {
  const int64_t d = config_.dmodel, F = config_.mlp, B = config_.batch, Fh = head_hidden();
  const bool lm = config_.pooling == Pooling::lm;
  const bool b16 = bf16();
  qkv_lin_ = Linear(enc_rows_, d, 3 * d, backward_, b16);
  o_lin_ = Linear(enc_rows_, d, d, backward_, b16);
  if (F > 0) {
    ff1_lin_ = Linear(enc_rows_, d, F, backward_, b16);
    ff2_lin_ = Linear(enc_rows_, F, d, backward_, b16);
    ff_gelu_ = Gelu(enc_rows_ * F, backward_);
  }
  xb_floats_ = b16 ? enc_rows_ * std::max(d, F) : 0;
  // Training in bf16: each block's linear inputs (h1, the merged heads, h2, gelu(u)) rounded once
  // in the forward pass and read again by the backward products.
  kept_floats_ = b16 && backward_ ? config_.layers * enc_rows_ * (F > 0 ? 3 * d + F : 2 * d) : 0;
  // The backward products read dY rounded: the widest layer output (qkv, the MLP, the head).
  gb_floats_ = b16 && backward_ ? enc_rows_ * std::max(3 * d, F) : 0;
  if (lm) {
    // Tied: the weights are the embedding table (V, d), read transposed.
    head1_lin_ = Linear(rows_, d, out_width_, backward_, b16, config_.tie_embeddings, !config_.tie_embeddings);
    if (b16 && backward_) gb_floats_ = std::max(gb_floats_, rows_ * out_width_);
  } else {
    head1_lin_ = Linear(B, feat_, Fh, backward_, b16);
    head2_lin_ = Linear(B, Fh, out_width_, backward_, b16);
    if (b16) xb_floats_ = std::max({xb_floats_, B * feat_, B * Fh});
    if (b16 && backward_) gb_floats_ = std::max({gb_floats_, B * Fh, B * out_width_});
    head_gelu_ = Gelu(B * Fh, backward_);
  }
  ln_ = LayerNorm(enc_rows_, d, backward_);
  softmax_ = RowSoftmax(rows_, out_width_);
  scratch_bytes_ = std::max({qkv_lin_.scratchpad_bytes(), o_lin_.scratchpad_bytes(),
                             F > 0 ? ff1_lin_.scratchpad_bytes() : size_t{0}, F > 0 ? ff2_lin_.scratchpad_bytes() : size_t{0},
                             head1_lin_.scratchpad_bytes(), lm ? size_t{0} : head2_lin_.scratchpad_bytes(),
                             lm ? size_t{0} : head_gelu_.scratchpad_bytes(), ln_.scratchpad_bytes(),
                             F > 0 ? ff_gelu_.scratchpad_bytes() : size_t{0}, softmax_.scratchpad_bytes()});
  scratch_bytes_ = (scratch_bytes_ + 63) / 64 * 64;
}


double TransformerModel::flops() const {
  const double T = static_cast<double>(enc_rows_), d = static_cast<double>(config_.dmodel), F = static_cast<double>(config_.mlp);
  const double Fh = static_cast<double>(head_hidden());
  double products = static_cast<double>(config_.layers) * (2 * T * d * 3 * d + 2 * T * d * d + 2 * 2 * T * d * F);
  if (config_.pooling == Pooling::lm) products += 2 * static_cast<double>(rows_) * d * static_cast<double>(out_width_);
  else products += 2.0 * static_cast<double>(config_.batch) * (static_cast<double>(feat_) * Fh + Fh * static_cast<double>(out_width_));
  double attention = 0;
  for (const auto& a : attn_) attention += a->flops(backward_ ? Mode::fwdbwd : Mode::fwd);
  // Backward of a product: dX and dW, each as large as the forward product.
  return (backward_ ? 3 : 1) * products + attention;
}

std::vector<std::pair<std::string, size_t>> TransformerModel::memory_parts() const {
  const size_t pbytes = static_cast<size_t>(n_params_) * sizeof(float);
  size_t attention = 0;
  for (const auto& a : attn_) attention += a->working_bytes(backward_ ? Mode::fwdbwd : Mode::fwd);
  return {{"parameters", pbytes},
          {"gradients", backward_ ? pbytes : 0},
          {"optimizer", mode_ == ModelMode::train ? 2 * pbytes + 2 * learned_bytes() : 0},
          {"activations", static_cast<size_t>(n_act_) * sizeof(float)},
          {"tokens", static_cast<size_t>(enc_rows_ + rows_ + (compact_ ? rows_ : 0)) * sizeof(int32_t)},
          {"scratchpad", scratch_bytes_},
          {"attention", attention},
          {"bf16 copies", bf16_bytes()}};
}

size_t TransformerModel::bf16_bytes() const {
  return bf16() ? static_cast<size_t>(n_params_ + xb_floats_ + gb_floats_ + kept_floats_) * sizeof(uint16_t) : 0;
}

uint16_t* TransformerModel::grad_bf16() const { return bf16() ? gb_.data() : nullptr; }

const void* TransformerModel::product_input(const float* x, int64_t n) const {
  if (!bf16()) return x;
  to_bf16_parallel(x, xb_.data(), n);
  return xb_.data();
}

uint16_t* TransformerModel::kept_slot(int64_t l, KeptInput slot) const {
  return kept_.data() + l * (kept_floats_ / config_.layers) + enc_rows_ * config_.dmodel * static_cast<int64_t>(slot);
}

const void* TransformerModel::kept_input(const float* x, int64_t l, KeptInput slot, bool round) const {
  const int64_t n = enc_rows_ * (slot == kFf2In ? config_.mlp : config_.dmodel);
  if (!kept_floats_) return product_input(x, n);
  uint16_t* copy = kept_slot(l, slot);
  if (round) to_bf16_parallel(x, copy, n);
  return copy;
}

const void* TransformerModel::merged_heads(const float* o, float* a, int64_t l) const {
  const int64_t B = enc_batch_, S = seq_rows_, H = config_.heads;
  if (!bf16()) {
    merge_heads(o, B, S, H, head_dim_, a);
    return a;
  }
  uint16_t* to = kept_floats_ ? kept_slot(l, kOutIn) : xb_.data();
  merge_heads(o, B, S, H, head_dim_, to);
  return to;
}

const void* TransformerModel::product_weights(int64_t off) const {
  return bf16() ? static_cast<const void*>(wb_.data() + off) : static_cast<const void*>(W(off));
}

// The mechanisms' learned tensors (known before setup: each mechanism's declared tensors).
size_t TransformerModel::learned_bytes() const {
  if (!backward_) return 0;
  size_t n = 0;
  for (const auto& a : attn_)
    for (const auto& t : a->learned()) n += static_cast<size_t>(t.count);  // counts are known before setup
  return n * sizeof(float);
}

size_t TransformerModel::working_bytes() const {
  size_t s = 0;
  for (const auto& [k, v] : memory_parts()) s += v;
  return s;
}

AttnArgs TransformerModel::attention_args(int64_t layer) const {
  const Shape4 s{enc_batch_, config_.heads, seq_rows_, head_dim_};
  const Strides3 st = Strides3::contiguous(s);
  const LayerActs& a = la_[static_cast<size_t>(backward_ ? layer : 0)];
  auto view = [&](int64_t off) { return TensorView{A(off), s, st}; };
  AttnArgs r{view(a.q), view(a.k), view(a.v), view(a.o), {}, {}, {}, {}};
  if (backward_) {
    r.dout = view(do_);
    r.dq = view(dq_);
    r.dk = view(dk_);
    r.dv = view(dv_);
  }
  return r;
}

void TransformerModel::setup(uint64_t seed) {
  const int64_t d = config_.dmodel;
  const bool lm = config_.pooling == Pooling::lm;
  // Tracked storage.
  weights_ = Buffer<float>(static_cast<size_t>(n_params_));
  if (backward_) grads_ = Buffer<float>(static_cast<size_t>(n_params_));
  if (mode_ == ModelMode::train) {
    adam_m_ = Buffer<float>(static_cast<size_t>(n_params_));
    adam_v_ = Buffer<float>(static_cast<size_t>(n_params_));
    adam_m_.zero();
    adam_v_.zero();
  }
  arena_ = Buffer<float>(static_cast<size_t>(n_act_));
  arena_.zero();
  tokens_ = Buffer<int32_t>(static_cast<size_t>(enc_rows_));
  targets_ = Buffer<int32_t>(static_cast<size_t>(rows_));
  if (compact_) gather_ = Buffer<int32_t>(static_cast<size_t>(rows_));
  scratch_ = Buffer<std::byte>(scratch_bytes_);
  if (bf16()) {
    wb_ = Buffer<uint16_t>(static_cast<size_t>(n_params_));
    xb_ = Buffer<uint16_t>(static_cast<size_t>(xb_floats_));
    if (gb_floats_) gb_ = Buffer<uint16_t>(static_cast<size_t>(gb_floats_));
    if (kept_floats_) kept_ = Buffer<uint16_t>(static_cast<size_t>(kept_floats_));
  }
  for (Linear* l : {&qkv_lin_, &o_lin_, &head1_lin_}) l->bind(scratch_.data());
  if (has_mlp()) {
    ff1_lin_.bind(scratch_.data());
    ff2_lin_.bind(scratch_.data());
    ff_gelu_.bind(scratch_.data());
  }
  ln_.bind(scratch_.data());
  if (!lm) {
    head2_lin_.bind(scratch_.data());
    head_gelu_.bind(scratch_.data());
  }
  softmax_.bind(scratch_.data());

  // Initial values.
  weights_.zero();
  if (backward_) grads_.zero();
  Rng rng(seed, kStreamModelInit);
  for (const Slice& p : slices_) {
    if (p.init_stddev > 0) rng.fill_normal(W(p.offset), p.count, p.init_stddev);
    else std::fill_n(W(p.offset), p.count, p.init_value);
  }
  if (config_.positions == Positions::sinusoidal) sinusoidal_positions(config_.seq, d, A(pos_));
  if (rope_ >= 0) rope_table(seq_rows_, head_dim_, A(rope_));
  for (size_t l = 0; l < attn_.size(); ++l) {
    Rng r(seed, kStreamLayerMechanism + l);
    attn_[l]->setup(backward_ ? Mode::fwdbwd : Mode::fwd, r);
  }
  // The mechanisms' learned tensors train beside the model's (their moments are declared under
  // "optimizer").
  learned_.clear();
  learned_floats_ = 0;
  if (backward_)
    for (auto& a : attn_)
      for (auto& t : a->learned()) {
        learned_.push_back(t);
        learned_floats_ += t.count;
      }
  if (mode_ == ModelMode::train) {
    learned_m_ = Buffer<float>(static_cast<size_t>(learned_floats_));
    learned_v_ = Buffer<float>(static_cast<size_t>(learned_floats_));
    learned_m_.zero();
    learned_v_.zero();
  }
  tensor_norms_.assign(slices_.size() + learned_.size(), 0.0);
  seed_ = seed;
  steps_ = 0;
  reset_timers();
}

Dropout TransformerModel::dropout_at(int64_t layer, int site) const {
  if (!dropping_ || (config_.dropout <= 0 && site != 3)) return Dropout{};
  const uint64_t where = (static_cast<uint64_t>(layer + 1) << 2) | static_cast<uint64_t>(site);
  return Dropout{config_.dropout, mix64(mix64(seed_ ^ 0x44524f504f5554ull) ^ mix64((static_cast<uint64_t>(steps_) << 16) ^ where))};
}

// x (T, d) *= the mask of site d, row by row (token rows of the encoder's batch).
void TransformerModel::drop_rows(float* x, const Dropout& d) const {
  if (!d.active()) return;
  const int64_t dm = config_.dmodel;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < enc_rows_; ++t) d.apply(x + t * dm, dm, static_cast<uint64_t>(t), 0);
}

// src, or (with dropout) a copy of it in dst with the mask applied: a branch's gradient.
const float* TransformerModel::dropped_copy(const float* src, float* dst, const Dropout& d) const {
  if (!d.active()) return src;
  std::copy_n(src, enc_rows_ * config_.dmodel, dst);
  drop_rows(dst, d);
  return dst;
}

template <class F>
void TransformerModel::timed(LayerType t, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  seconds_[static_cast<size_t>(t)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The encoder's token rows (retrieval: first documents, then second documents) and the loss
// targets: the label per example, or for the language model the next token where the task's
// loss mask is set on the current position (-1 elsewhere).
void TransformerModel::load(const Batch& b) {
  const int64_t N = config_.seq, B = config_.batch;
  if (b.size != B || b.seq != N)
    throw std::logic_error(fmt::format("batch of {}x{} given to a model of {}x{}", b.size, b.seq, B, N));
  // Encoder row of the batch's token r (first documents, then second documents); the rows of
  // prepended global tokens hold token 0, which the embedding does not read.
  auto row_of = [&](int64_t r) { return r / N * seq_rows_ + global_rows_ + r % N; };
  std::fill_n(tokens_.data(), enc_rows_, 0);
  for (int64_t r = 0; r < B * N; ++r) tokens_[static_cast<size_t>(row_of(r))] = b.tokens[static_cast<size_t>(r)];
  if (config_.two_tower)
    for (int64_t r = 0; r < B * N; ++r) tokens_[static_cast<size_t>(row_of(B * N + r))] = b.tokens2[static_cast<size_t>(r)];
  for (int64_t t = 0; t < enc_rows_; ++t)
    if (tokens_[static_cast<size_t>(t)] < 0 || tokens_[static_cast<size_t>(t)] >= config_.vocab)
      throw std::logic_error(fmt::format("token {} outside the vocabulary of {}", tokens_[static_cast<size_t>(t)], config_.vocab));
  if (config_.pooling == Pooling::lm) {
    // A row's target: the task's own (mqar, induction), or the next token where the loss mask is
    // set (copy); -1 where nothing is predicted.
    auto target_of = [&](int64_t r) -> int32_t {
      if (!b.targets.empty()) return b.targets[static_cast<size_t>(r)];
      const bool last = r % N == N - 1;
      const bool counted = !last && (b.loss_mask.empty() || b.loss_mask[static_cast<size_t>(r)]);
      return counted ? b.tokens[static_cast<size_t>(r + 1)] : -1;
    };
    for (int64_t r = 0; r < B * N; ++r)
      if (const int32_t t = target_of(r); t >= config_.vocab) throw std::logic_error(fmt::format("target {} outside the vocabulary", t));
    if (!compact_) {  // global rows predict nothing
      std::fill_n(targets_.data(), enc_rows_, -1);
      for (int64_t r = 0; r < B * N; ++r) targets_[static_cast<size_t>(row_of(r))] = target_of(r);
    } else {
      // Example e's counted rows go to e·P, e·P + 1, ... in position order; the rest of its P
      // slots point at its first row with no target (their gradient is zero).
      const int64_t P = config_.loss_positions;
      for (int64_t e = 0; e < B; ++e) {
        int64_t k = 0;
        for (int64_t n = 0; n < N; ++n) {
          const int64_t r = e * N + n;
          const int32_t t = target_of(r);
          if (t < 0) continue;
          if (k == P) throw std::logic_error(fmt::format("an example with more than the {} loss positions declared", P));
          gather_[static_cast<size_t>(e * P + k)] = static_cast<int32_t>(row_of(r));
          targets_[static_cast<size_t>(e * P + k)] = t;
          ++k;
        }
        for (; k < P; ++k) {
          gather_[static_cast<size_t>(e * P + k)] = static_cast<int32_t>(row_of(e * N));
          targets_[static_cast<size_t>(e * P + k)] = -1;
        }
      }
    }
  } else {
    for (int64_t r = 0; r < B; ++r) targets_[static_cast<size_t>(r)] = b.labels[static_cast<size_t>(r)];
  }
}

double TransformerModel::forward_and_loss(bool with_grad) {
  // S rows an encoder sequence: its N tokens after the global_rows_ prepended global rows (none but ETC).
  const int64_t N = config_.seq, S = seq_rows_, d = config_.dmodel, H = config_.heads, B = config_.batch, L = config_.layers;
  // 1. Embedding and positions.
  const float* positions = config_.positions == Positions::sinusoidal ? A(pos_) : positions_ >= 0 ? W(positions_) : nullptr;
  timed(LayerType::embedding, [&] {
    embedding_forward(tokens_.data(), enc_rows_, S, global_rows_, d, W(emb_), positions, cls_ >= 0 ? W(cls_) : nullptr,
                      globals_ >= 0 ? W(globals_) : nullptr, A(x_[0]));
    drop_rows(A(x_[0]), dropout_at(-1, 0));
  });
  // 1b. bf16: the parameters rounded, once per step (they are the same all step).
  if (bf16()) timed(LayerType::projections, [&] { to_bf16_parallel(weights_.data(), wb_.data(), n_params_); });
  // 2. The blocks.
  for (int64_t l = 0; l < L; ++l) {
    const LayerParams& p = lp_[static_cast<size_t>(l)];
    const LayerActs& a = la_[static_cast<size_t>(backward_ ? l : 0)];
    timed(LayerType::layernorm, [&] { ln_.forward(A(x_[l]), W(p.ln1_g), W(p.ln1_b), A(a.h1), A(a.mean1), A(a.var1)); });
    timed(LayerType::projections, [&] {
      qkv_lin_.forward(kept_input(A(a.h1), l, kQkvIn, true), product_weights(p.wqkv), W(p.bqkv), A(qkv_));
      split_heads(A(qkv_), enc_batch_, S, H, head_dim_, A(a.q), A(a.k), A(a.v));
      if (rope_ >= 0) {  // the mechanism sees rotated queries and keys (and keeps them for its backward)
        rope_rotate(A(a.q), enc_batch_, H, S, head_dim_, A(rope_), false);
        rope_rotate(A(a.k), enc_batch_, H, S, head_dim_, A(rope_), false);
      }
    });
    timed(LayerType::attention, [&] {
      Attention& mech = *attn_[static_cast<size_t>(l)];
      if (attn_dropout_planned_) mech.set_dropout(dropping_ ? dropout_at(l, 3).with_rate(config_.attn_dropout) : Dropout{});
      mech.forward(attention_args(l));
    });
    timed(LayerType::projections, [&] {
      o_lin_.forward(merged_heads(A(a.o), A(a.a), l), product_weights(p.wo), W(p.bo), A(a.xm));
      drop_rows(A(a.xm), dropout_at(l, 1));
      add_inplace(A(a.xm), A(x_[l]), enc_rows_ * d);
    });
    if (!has_mlp()) {  // the block is attention alone: its output is the stream after it
      std::copy_n(A(a.xm), enc_rows_ * d, A(x_[l + 1]));
      continue;
    }
    timed(LayerType::layernorm, [&] { ln_.forward(A(a.xm), W(p.ln2_g), W(p.ln2_b), A(a.h2), A(a.mean2), A(a.var2)); });
    timed(LayerType::feedforward, [&] {
      ff1_lin_.forward(kept_input(A(a.h2), l, kFf1In, true), product_weights(p.w1), W(p.b1), A(a.u));
      ff_gelu_.forward(A(a.u), A(a.g));
      ff2_lin_.forward(kept_input(A(a.g), l, kFf2In, true), product_weights(p.w2), W(p.b2), A(x_[l + 1]));
      drop_rows(A(x_[l + 1]), dropout_at(l, 2));
      add_inplace(A(x_[l + 1]), A(a.xm), enc_rows_ * d);
    });
  }
  timed(LayerType::layernorm, [&] { ln_.forward(A(x_[L]), W(lnf_g_), W(lnf_b_), A(hf_), A(meanf_), A(varf_)); });
  // 3. Pooling, head and loss.
  double loss = 0;
  timed(LayerType::head, [&] {
    if (config_.pooling == Pooling::lm) {
      if (compact_) {  // the rows that carry a loss, gathered
        const float* hf = A(hf_);
        float* hg = A(hg_);
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows_; ++r) std::copy_n(hf + static_cast<int64_t>(gather_[static_cast<size_t>(r)]) * d, d, hg + r * d);
      }
      const bool tied = config_.tie_embeddings;
      head1_lin_.forward(product_input(head_input(), rows_ * d), product_weights(tied ? emb_ : wc1_), tied ? nullptr : W(bc1_),
                         A(logits_));
    } else {
      float* feat = A(feat_buf_);
      const float* hf = A(hf_);
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < B; ++b) {  // over the token rows (after the global rows)
        float* f = feat + b * feat_;
        if (config_.pooling == Pooling::mean) {
          std::fill_n(f, d, 0.0f);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t j = 0; j < d; ++j) f[j] += hf[(b * S + global_rows_ + n) * d + j];
          for (int64_t j = 0; j < d; ++j) f[j] /= static_cast<float>(N);
        } else {
          std::copy_n(hf + (b * S + global_rows_) * d, d, f);
        }
        if (config_.two_tower) {
          const float* e2 = hf + ((B + b) * S + global_rows_) * d;
          for (int64_t j = 0; j < d; ++j) {
            f[d + j] = e2[j];
            f[2 * d + j] = f[j] * e2[j];
            f[3 * d + j] = f[j] - e2[j];
          }
        }
      }
      head1_lin_.forward(product_input(feat, B * feat_), product_weights(wc1_), W(bc1_), A(z_));
      head_gelu_.forward(A(z_), A(gz_));
      head2_lin_.forward(product_input(A(gz_), B * head_hidden()), product_weights(wc2_), W(bc2_), A(logits_));
    }
    softmax_.forward(A(logits_));
    loss = cross_entropy(A(logits_), targets_.data(), rows_, out_width_, with_grad);
  });
  return loss;
}

void TransformerModel::backward() {
  const int64_t N = config_.seq, S = seq_rows_, d = config_.dmodel, H = config_.heads, B = config_.batch, L = config_.layers;
  // 3'. Head and pooling: dlogits (in the logits buffer) -> d(final hidden) in dtmp.
  float* dhf = A(dtmp_);
  timed(LayerType::head, [&] {
    if (config_.pooling == Pooling::lm) {
      // Tied: dW is the embedding's gradient, written here first; the embedding's scatter below
      // adds to it.
      const bool tied = config_.tie_embeddings;
      float* dh = compact_ ? A(dhg_) : dhf;
      head1_lin_.backward(product_input(head_input(), rows_ * d), product_weights(tied ? emb_ : wc1_), A(logits_),
                          grad_bf16(), dh, G(tied ? emb_ : wc1_), tied ? nullptr : G(bc1_));
      if (compact_) {  // scattered back to the token rows (in order: a row may take several adds)
        std::fill_n(dhf, enc_rows_ * d, 0.0f);
        for (int64_t r = 0; r < rows_; ++r) {
          float* to = dhf + static_cast<int64_t>(gather_[static_cast<size_t>(r)]) * d;
          const float* from = dh + r * d;
          for (int64_t j = 0; j < d; ++j) to[j] += from[j];
        }
      }
      return;
    }
    head2_lin_.backward(product_input(A(gz_), B * head_hidden()), product_weights(wc2_), A(logits_), grad_bf16(),
                        A(dz_), G(wc2_), G(bc2_));
    head_gelu_.backward(A(z_), A(dz_), A(dz_));
    head1_lin_.backward(product_input(A(feat_buf_), B * feat_), product_weights(wc1_), A(dz_), grad_bf16(),
                        A(dfeat_), G(wc1_), G(bc1_));
    std::fill_n(dhf, enc_rows_ * d, 0.0f);
    const float* hf = A(hf_);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      const float* df = A(dfeat_) + b * feat_;
      if (config_.pooling == Pooling::mean) {
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < d; ++j) dhf[(b * S + global_rows_ + n) * d + j] = df[j] / static_cast<float>(N);
        continue;
      }
      float* d1 = dhf + (b * S + global_rows_) * d;
      if (!config_.two_tower) {
        std::copy_n(df, d, d1);
        continue;
      }
      // f = [e1, e2, e1*e2, e1-e2]
      float* d2 = dhf + ((B + b) * S + global_rows_) * d;
      const float *e1 = hf + (b * S + global_rows_) * d, *e2 = hf + ((B + b) * S + global_rows_) * d;
      for (int64_t j = 0; j < d; ++j) {
        d1[j] = df[j] + df[2 * d + j] * e2[j] + df[3 * d + j];
        d2[j] = df[d + j] + df[2 * d + j] * e1[j] - df[3 * d + j];
      }
    }
  });
  timed(LayerType::layernorm, [&] {
    ln_.backward(A(x_[L]), A(meanf_), A(varf_), dhf, W(lnf_g_), W(lnf_b_), A(dres_), G(lnf_g_), G(lnf_b_));
  });
  // 2'. The blocks in reverse; dres carries the residual stream's gradient.
  for (int64_t l = L - 1; l >= 0; --l) {
    const LayerParams& p = lp_[static_cast<size_t>(l)];
    const LayerActs& a = la_[static_cast<size_t>(l)];
    if (has_mlp()) {
    timed(LayerType::feedforward, [&] {
      // Through the branch's dropout: the same mask on the gradient (a copy: dres goes on).
      const float* dbranch = dropped_copy(A(dres_), A(dtmp2_), dropout_at(l, 2));
      ff2_lin_.backward(kept_input(A(a.g), l, kFf2In, false), product_weights(p.w2), dbranch, grad_bf16(), A(dff_),
                        G(p.w2), G(p.b2));
      ff_gelu_.backward(A(a.u), A(dff_), A(dff_));
      ff1_lin_.backward(kept_input(A(a.h2), l, kFf1In, false), product_weights(p.w1), A(dff_), grad_bf16(), A(dtmp_),
                        G(p.w1), G(p.b1));
    });
    timed(LayerType::layernorm, [&] {
      ln_.backward(A(a.xm), A(a.mean2), A(a.var2), A(dtmp_), W(p.ln2_g), W(p.ln2_b), A(dtmp2_), G(p.ln2_g), G(p.ln2_b));
      add_inplace(A(dres_), A(dtmp2_), enc_rows_ * d);
    });
    }  // without an MLP the stream's gradient reaches the attention branch as it is
    timed(LayerType::projections, [&] {
      const float* dbranch = dropped_copy(A(dres_), A(dtmp2_), dropout_at(l, 1));
      o_lin_.backward(kept_input(A(a.a), l, kOutIn, false), product_weights(p.wo), dbranch, grad_bf16(), A(dtmp_), G(p.wo),
                      G(p.bo));
      split_single(A(dtmp_), enc_batch_, S, H, head_dim_, A(do_));
    });
    timed(LayerType::attention, [&] { attn_[static_cast<size_t>(l)]->backward(attention_args(l)); });
    timed(LayerType::projections, [&] {
      if (rope_ >= 0) {  // the rotation's backward: its transpose, the inverse rotation
        rope_rotate(A(dq_), enc_batch_, H, S, head_dim_, A(rope_), true);
        rope_rotate(A(dk_), enc_batch_, H, S, head_dim_, A(rope_), true);
      }
      merge_qkv(A(dq_), A(dk_), A(dv_), enc_batch_, S, H, head_dim_, A(qkv_));
      qkv_lin_.backward(kept_input(A(a.h1), l, kQkvIn, false), product_weights(p.wqkv), A(qkv_), grad_bf16(),
                        A(dtmp_), G(p.wqkv), G(p.bqkv));
    });
    timed(LayerType::layernorm, [&] {
      ln_.backward(A(x_[l]), A(a.mean1), A(a.var1), A(dtmp_), W(p.ln1_g), W(p.ln1_b), A(dtmp2_), G(p.ln1_g), G(p.ln1_b));
      add_inplace(A(dres_), A(dtmp2_), enc_rows_ * d);
    });
  }
  // 1'. Embedding: a scatter-add into a zeroed table.
  timed(LayerType::embedding, [&] {
    if (!config_.tie_embeddings) std::fill_n(G(emb_), config_.vocab * d, 0.0f);  // tied: it holds the head's part
    drop_rows(A(dres_), dropout_at(-1, 0));
    embedding_backward(tokens_.data(), enc_rows_, S, global_rows_, d, A(dres_), G(emb_), cls_ >= 0 ? G(cls_) : nullptr,
                       globals_ >= 0 ? G(globals_) : nullptr,
                       positions_ >= 0 ? G(positions_) : nullptr);
  });
}

double TransformerModel::step(const Batch& batch) {
  if (mode_ == ModelMode::train) return train_step(batch, steps_ + 1, config_.optimizer.lr).loss;
  omp_set_num_threads(config_.threads);
  load(batch);
  const double loss = forward_and_loss(backward_);
  if (backward_) backward();
  return loss;
}

// 1. The mechanisms' redraws for this step. 2. Forward with dropout. 3. Backward. 4. Clipping.
// 5. AdamW on the model's parameters and the mechanisms' learned tensors.
TransformerModel::StepOutcome TransformerModel::train_step(const Batch& batch, int64_t step, float lr) {
  if (mode_ != ModelMode::train) throw std::logic_error("train_step needs a model in train mode");
  omp_set_num_threads(config_.threads);
  steps_ = step;
  for (size_t l = 0; l < attn_.size(); ++l) {
    Rng r(seed_ ^ mix64(static_cast<uint64_t>(step)), kStreamLayerMechanism + l);
    attn_[l]->begin_train_step(step, r);
  }
  load(batch);
  StepOutcome out;
  dropping_ = true;
  for (auto& a : attn_) a->set_training(true);
  out.loss = forward_and_loss(true);
  for (auto& a : attn_) a->set_training(false);
  backward();
  dropping_ = false;
  timed(LayerType::optimizer, [&] {
    out.grad_norm = clip_gradients();
    config_.optimizer.lr = lr;
    config_.optimizer.update(weights_.data(), grads_.data(), adam_m_.data(), adam_v_.data(), n_params_, step);
    int64_t at = 0;
    for (const auto& t : learned_) {
      config_.optimizer.update(t.value, t.grad, learned_m_.data() + at, learned_v_.data() + at, t.count, step);
      at += t.count;
    }
  });
  return out;
}

namespace {
// Sum of squares in a fixed order: a static share per thread, the shares added in thread order
// (an OpenMP reduction adds them in whatever order the threads finish).
double squared_norm(const float* g, int64_t n) {
  constexpr int kMaxThreads = 1024;
  double part[kMaxThreads] = {};
  int used = 1;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t lo = n * t / T, hi = n * (t + 1) / T;
    double s = 0;
    for (int64_t i = lo; i < hi; ++i) s += static_cast<double>(g[i]) * g[i];
    if (t < kMaxThreads) part[t] = s;
#pragma omp single
    used = std::min(T, kMaxThreads);
  }
  double s = 0;
  for (int t = 0; t < used; ++t) s += part[t];
  return s;
}
void scale_by(float* g, int64_t n, float f) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] *= f;
}
}  // namespace

// The global norm of every gradient; with clipping, the gradients scaled so that the global norm
// (or each tensor's own norm) is at most config_.clip. Sums run in a fixed order per thread count.
double TransformerModel::clip_gradients() {
  double total = 0;
  std::vector<double>& norms = tensor_norms_;  // per tensor (sized in setup: no allocation here)
  size_t k = 0;
  for (const Slice& s : slices_) norms[k++] = squared_norm(G(s.offset), s.count);
  for (const auto& t : learned_) norms[k++] = squared_norm(t.grad, t.count);
  for (double n : norms) total += n;
  const double global = std::sqrt(total);
  if (config_.clip <= 0) return global;
  auto clip = [&](float* g, int64_t n, double norm) {
    if (norm > config_.clip) scale_by(g, n, static_cast<float>(config_.clip / norm));
  };
  size_t i = 0;
  for (const Slice& s : slices_) clip(G(s.offset), s.count, config_.clip_mode == ClipMode::global ? global : std::sqrt(norms[i++]));
  for (const auto& t : learned_) clip(t.grad, t.count, config_.clip_mode == ClipMode::global ? global : std::sqrt(norms[i++]));
  return global;
}

TransformerModel::Evaluation TransformerModel::evaluate(const Batch& batch, int64_t valid) {
  omp_set_num_threads(config_.threads);
  load(batch);
  dropping_ = false;
  forward_and_loss(false);  // the logits buffer now holds the probabilities
  const int64_t examples = std::min(valid, config_.batch);
  const int64_t per = config_.pooling != Pooling::lm ? 1 : compact_ ? config_.loss_positions : seq_rows_;  // an example's rows
  return count_predictions(A(logits_), targets_.data(), examples, per, out_width_);
}

TransformerModel::Evaluation TransformerModel::count_predictions(const float* probs, const int32_t* targets, int64_t examples,
                                                                 int64_t rows_per_example, int64_t C) {
  Evaluation e;
  for (int64_t b = 0; b < examples; ++b) {
    ++e.sequences;
    bool all = true;
    int64_t counted = 0, right_here = 0;
    for (int64_t n = 0; n < rows_per_example; ++n) {
      const int64_t r = b * rows_per_example + n;
      const int32_t t = targets[r];
      if (t < 0) continue;  // a row that carries no prediction
      const float* p = probs + r * C;
      e.loss_sum -= std::log(std::max(static_cast<double>(p[t]), static_cast<double>(std::numeric_limits<float>::min())));
      ++e.predictions;
      const bool right = std::max_element(p, p + C) - p == t;  // argmax over every class
      e.correct += right ? 1 : 0;
      all = all && right;
      ++counted;
      right_here += right ? 1 : 0;
    }
    e.exact += all && counted ? 1 : 0;
    if (counted) {
      e.query_share_sum += static_cast<double>(right_here) / static_cast<double>(counted);
      ++e.query_examples;
    }
  }
  return e;
}

std::vector<TransformerModel::StateTensor> TransformerModel::trained_tensors() const {
  std::vector<StateTensor> out;
  for (const Slice& s : slices_) out.push_back({s.name, W(s.offset), s.count});
  for (size_t l = 0; l < attn_.size(); ++l)
    for (const auto& t : attn_[l]->learned()) out.push_back({fmt::format("layer{}.mechanism.{}", l, t.name), t.value, t.count});
  // Last: the state training updates without gradients (routing's centroids), which the
  // best-validation copy must hold too.
  for (size_t l = 0; l < attn_.size(); ++l)
    for (const auto& t : attn_[l]->updated_state())
      out.push_back({fmt::format("layer{}.mechanism.{}", l, t.name), t.value, t.count});
  return out;
}

std::vector<TransformerModel::StateTensor> TransformerModel::state() {
  if (mode_ != ModelMode::train) throw std::logic_error("state() needs a model in train mode");
  std::vector<StateTensor> out = trained_tensors();
  const size_t n = slices_.size() + learned_.size();  // the optimised ones: updated state has no moments
  for (size_t i = 0; i < n; ++i) {
    // The moments live beside each tensor: the model's at the same offset in adam_m_, adam_v_; the
    // mechanisms' in learned_m_, learned_v_ in learned_ order.
    float *m = nullptr, *v = nullptr;
    if (i < slices_.size()) {
      m = adam_m_.data() + slices_[i].offset;
      v = adam_v_.data() + slices_[i].offset;
    } else {
      int64_t at = 0;
      for (size_t k = 0; k < i - slices_.size(); ++k) at += learned_[k].count;
      m = learned_m_.data() + at;
      v = learned_v_.data() + at;
    }
    out.push_back({out[i].name + ".adam_m", m, out[i].count});
    out.push_back({out[i].name + ".adam_v", v, out[i].count});
  }
  return out;
}

double TransformerModel::loss(const Batch& batch) {
  omp_set_num_threads(config_.threads);
  load(batch);
  return forward_and_loss(false);
}

}  // namespace ab
