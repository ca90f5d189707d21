#include "model/transformer.hpp"

#include <fmt/format.h>

#include <omp.h>

#include <chrono>
#include <cmath>

#include "attention_impls/registry.hpp"
#include "core/rng.hpp"

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

ModelConfig model_config_for_task(const TaskInfo& task, int64_t seq) {
  ModelConfig c;
  c.vocab = task.vocab;
  c.classes = task.classes;
  c.seq = seq > 0 ? seq : task.default_seq;
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

TransformerModel::TransformerModel(const ModelConfig& c, ModelMode mode) : c_(c), mode_(mode) {
  backward_ = mode != ModelMode::fwd;
  // The mechanisms and primitives are planned for this many threads (one execution slot each).
  if (c.threads < 1) throw InvalidInput(fmt::format("--threads must be positive, got {}", c.threads));
  omp_set_num_threads(c.threads);
  const int64_t L = c.layers, d = c.dmodel, H = c.heads, F = c.mlp, N = c.seq;
  if (L < 1 || d < 1 || H < 1 || F < 1 || N < 2 || c.batch < 1)
    throw InvalidInput(fmt::format("model sizes must be positive (layers={} dmodel={} heads={} mlp={} batch={}) and seq at least 2 (got {})",
                                   L, d, H, F, c.batch, N));
  if (d % H) throw InvalidInput(fmt::format("--dmodel {} is not a multiple of --heads {}", d, H));
  if (c.vocab < 2) throw InvalidInput("the vocabulary needs at least 2 tokens");
  if (c.pooling != Pooling::lm && c.classes < 2) throw InvalidInput("a classifier needs at least 2 classes");
  Dh_ = d / H;
  Benc_ = c.two_tower ? 2 * c.batch : c.batch;
  T_ = Benc_ * N;
  const bool lm = c.pooling == Pooling::lm;
  rows_ = lm ? T_ : c.batch;
  C_ = lm ? c.vocab : c.classes;
  feat_ = c.two_tower ? 4 * d : d;

  // 1. Mechanisms: one per layer, validated now (no allocation until setup).
  const MechanismInfo& info = find_mechanism(c.mechanism);
  AttnProblem p;
  p.shape = Shape4{Benc_, H, N, Dh_};
  p.causal = c.causal;
  p.strides = Strides3::contiguous(p.shape);
  p.threads = c.threads;
  for (int64_t l = 0; l < L; ++l) {
    attn_.push_back(info.make(p, c.params));
    attn_.back()->validate();
  }

  // 2. Parameters. Weights N(0, 1/fan_in), the embedding N(0, 1) (the scale of the positions).
  const float sd = 1.0f / std::sqrt(static_cast<float>(d)), sf = 1.0f / std::sqrt(static_cast<float>(F));
  emb_ = param("embedding", c.vocab * d, 1.0f);
  if (c.pooling == Pooling::cls) cls_ = param("cls", d, 0.02f);
  for (int64_t l = 0; l < L; ++l) {
    auto n = [&](const char* s) { return fmt::format("layer{}.{}", l, s); };
    LayerParams q;
    q.ln1_g = param(n("ln1.scale"), d, 0, 1);
    q.ln1_b = param(n("ln1.shift"), d, 0);
    q.wqkv = param(n("attn.wqkv"), d * 3 * d, sd);
    q.bqkv = param(n("attn.bqkv"), 3 * d, 0);
    q.wo = param(n("attn.wo"), d * d, sd);
    q.bo = param(n("attn.bo"), d, 0);
    q.ln2_g = param(n("ln2.scale"), d, 0, 1);
    q.ln2_b = param(n("ln2.shift"), d, 0);
    q.w1 = param(n("ffn.w1"), d * F, sd);
    q.b1 = param(n("ffn.b1"), F, 0);
    q.w2 = param(n("ffn.w2"), F * d, sf);
    q.b2 = param(n("ffn.b2"), d, 0);
    lp_.push_back(q);
  }
  lnf_g_ = param("lnf.scale", d, 0, 1);
  lnf_b_ = param("lnf.shift", d, 0);
  if (lm) {
    wc1_ = param("head.wout", d * C_, sd);
    bc1_ = param("head.bout", C_, 0);
  } else {
    wc1_ = param("head.w1", feat_ * F, 1.0f / std::sqrt(static_cast<float>(feat_)));
    bc1_ = param("head.b1", F, 0);
    wc2_ = param("head.w2", F * C_, sf);
    bc2_ = param("head.b2", C_, 0);
  }

  // 3. The arena. The residual stream has L + 1 slots; the per-layer activations have L slots
  // when a backward pass reads them, else one shared slot.
  pos_ = act(N * d);
  for (int64_t l = 0; l <= L; ++l) x_.push_back(act(T_ * d));
  const int64_t slots = backward_ ? L : 1;
  for (int64_t s = 0; s < slots; ++s) {
    LayerActs a;
    a.h1 = act(T_ * d);
    a.mean1 = act(T_);
    a.var1 = act(T_);
    a.q = act(T_ * d);
    a.k = act(T_ * d);
    a.v = act(T_ * d);
    a.o = act(T_ * d);
    a.a = act(T_ * d);
    a.xm = act(T_ * d);
    a.h2 = act(T_ * d);
    a.mean2 = act(T_);
    a.var2 = act(T_);
    a.u = act(T_ * F);
    a.g = act(T_ * F);
    la_.push_back(a);
  }
  qkv_ = act(T_ * 3 * d);  // the projection's output before the head split (backward: dqkv)
  hf_ = act(T_ * d);
  meanf_ = act(T_);
  varf_ = act(T_);
  if (!lm) {
    feat_buf_ = act(c.batch * feat_);
    z_ = act(c.batch * F);
    gz_ = act(c.batch * F);
  }
  logits_ = act(rows_ * C_);
  if (backward_) {
    dres_ = act(T_ * d);
    dtmp_ = act(T_ * d);
    dtmp2_ = act(T_ * d);
    do_ = act(T_ * d);
    dq_ = act(T_ * d);
    dk_ = act(T_ * d);
    dv_ = act(T_ * d);
    dff_ = act(T_ * F);
    if (!lm) {
      dfeat_ = act(c.batch * feat_);
      dz_ = act(c.batch * F);
    }
  }
  create_primitives();
}

TransformerModel::~TransformerModel() = default;

// Every primitive, created once; their scratchpads size the one scratch region. Made in the
// constructor, untracked and without touching data, so working_bytes() is exact before setup.
void TransformerModel::create_primitives() {
  const int64_t d = c_.dmodel, F = c_.mlp, B = c_.batch;
  const bool lm = c_.pooling == Pooling::lm;
  qkv_lin_ = Linear(T_, d, 3 * d, backward_);
  o_lin_ = Linear(T_, d, d, backward_);
  ff1_lin_ = Linear(T_, d, F, backward_);
  ff2_lin_ = Linear(T_, F, d, backward_);
  if (lm) {
    head1_lin_ = Linear(T_, d, C_, backward_);
  } else {
    head1_lin_ = Linear(B, feat_, F, backward_);
    head2_lin_ = Linear(B, F, C_, backward_);
    head_gelu_ = Gelu(B * F, backward_);
  }
  ln_ = LayerNorm(T_, d, backward_);
  ff_gelu_ = Gelu(T_ * F, backward_);
  softmax_ = RowSoftmax(rows_, C_, false);
  scratch_bytes_ = std::max({qkv_lin_.scratchpad_bytes(), o_lin_.scratchpad_bytes(), ff1_lin_.scratchpad_bytes(),
                             ff2_lin_.scratchpad_bytes(), head1_lin_.scratchpad_bytes(),
                             lm ? size_t{0} : head2_lin_.scratchpad_bytes(), lm ? size_t{0} : head_gelu_.scratchpad_bytes(),
                             ln_.scratchpad_bytes(), ff_gelu_.scratchpad_bytes(), softmax_.scratchpad_bytes()});
  scratch_bytes_ = (scratch_bytes_ + 63) / 64 * 64;
}


double TransformerModel::flops() const {
  const double T = static_cast<double>(T_), d = static_cast<double>(c_.dmodel), F = static_cast<double>(c_.mlp);
  double products = static_cast<double>(c_.layers) * (2 * T * d * 3 * d + 2 * T * d * d + 2 * 2 * T * d * F);
  if (c_.pooling == Pooling::lm) products += 2 * T * d * static_cast<double>(C_);
  else products += 2.0 * static_cast<double>(c_.batch) * (static_cast<double>(feat_) * F + F * static_cast<double>(C_));
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
          {"optimizer", mode_ == ModelMode::train ? 2 * pbytes : 0},
          {"activations", static_cast<size_t>(n_act_) * sizeof(float)},
          {"tokens", static_cast<size_t>(T_ + rows_) * sizeof(int32_t)},
          {"scratchpad", scratch_bytes_},
          {"attention", attention}};
}

size_t TransformerModel::working_bytes() const {
  size_t s = 0;
  for (const auto& [k, v] : memory_parts()) s += v;
  return s;
}

AttnArgs TransformerModel::attention_args(int64_t layer) const {
  const Shape4 s{Benc_, c_.heads, c_.seq, Dh_};
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
  const int64_t d = c_.dmodel;
  const bool lm = c_.pooling == Pooling::lm;
  // Tracked storage.
  w_ = Buffer<float>(static_cast<size_t>(n_params_));
  if (backward_) g_ = Buffer<float>(static_cast<size_t>(n_params_));
  if (mode_ == ModelMode::train) {
    m_ = Buffer<float>(static_cast<size_t>(n_params_));
    v_ = Buffer<float>(static_cast<size_t>(n_params_));
    m_.zero();
    v_.zero();
  }
  arena_ = Buffer<float>(static_cast<size_t>(n_act_));
  arena_.zero();
  tokens_ = Buffer<int32_t>(static_cast<size_t>(T_));
  targets_ = Buffer<int32_t>(static_cast<size_t>(rows_));
  scratch_ = Buffer<std::byte>(scratch_bytes_);
  for (Linear* l : {&qkv_lin_, &o_lin_, &ff1_lin_, &ff2_lin_, &head1_lin_}) l->bind(scratch_.data());
  ln_.bind(scratch_.data());
  ff_gelu_.bind(scratch_.data());
  if (!lm) {
    head2_lin_.bind(scratch_.data());
    head_gelu_.bind(scratch_.data());
  }
  softmax_.bind(scratch_.data());

  // Initial values.
  w_.zero();
  if (backward_) g_.zero();
  Rng rng(seed, kStreamModelInit);
  for (const Slice& p : slices_) {
    if (p.init_stddev > 0) rng.fill_normal(W(p.offset), p.count, p.init_stddev);
    else std::fill_n(W(p.offset), p.count, p.init_value);
  }
  sinusoidal_positions(c_.seq, d, A(pos_));
  for (size_t l = 0; l < attn_.size(); ++l) {
    Rng r(seed, kStreamLayerMechanism + l);
    attn_[l]->setup(backward_ ? Mode::fwdbwd : Mode::fwd, r);
  }
  steps_ = 0;
  reset_timers();
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
  const int64_t N = c_.seq, B = c_.batch;
  if (b.size != B || b.seq != N)
    throw std::logic_error(fmt::format("batch of {}x{} given to a model of {}x{}", b.size, b.seq, B, N));
  std::copy(b.tokens.begin(), b.tokens.end(), tokens_.data());
  if (c_.two_tower) std::copy(b.tokens2.begin(), b.tokens2.end(), tokens_.data() + B * N);
  for (int64_t t = 0; t < T_; ++t)
    if (tokens_[static_cast<size_t>(t)] < 0 || tokens_[static_cast<size_t>(t)] >= c_.vocab)
      throw std::logic_error(fmt::format("token {} outside the vocabulary of {}", tokens_[static_cast<size_t>(t)], c_.vocab));
  if (c_.pooling == Pooling::lm) {
    for (int64_t r = 0; r < T_; ++r) {
      const bool last = r % N == N - 1;
      const bool counted = !last && (b.loss_mask.empty() || b.loss_mask[static_cast<size_t>(r)]);
      targets_[static_cast<size_t>(r)] = counted ? tokens_[static_cast<size_t>(r + 1)] : -1;
    }
  } else {
    for (int64_t r = 0; r < B; ++r) targets_[static_cast<size_t>(r)] = b.labels[static_cast<size_t>(r)];
  }
}

double TransformerModel::forward_and_loss(bool with_grad) {
  const int64_t N = c_.seq, d = c_.dmodel, H = c_.heads, B = c_.batch, L = c_.layers;
  // 1. Embedding and positions.
  timed(LayerType::embedding, [&] {
    embedding_forward(tokens_.data(), T_, N, d, W(emb_), A(pos_), cls_ >= 0 ? W(cls_) : nullptr, A(x_[0]));
  });
  // 2. The blocks.
  for (int64_t l = 0; l < L; ++l) {
    const LayerParams& p = lp_[static_cast<size_t>(l)];
    const LayerActs& a = la_[static_cast<size_t>(backward_ ? l : 0)];
    timed(LayerType::layernorm, [&] { ln_.forward(A(x_[l]), W(p.ln1_g), W(p.ln1_b), A(a.h1), A(a.mean1), A(a.var1)); });
    timed(LayerType::projections, [&] {
      qkv_lin_.forward(A(a.h1), W(p.wqkv), W(p.bqkv), A(qkv_));
      split_heads(A(qkv_), Benc_, N, H, Dh_, A(a.q), A(a.k), A(a.v));
    });
    timed(LayerType::attention, [&] { attn_[static_cast<size_t>(l)]->forward(attention_args(l)); });
    timed(LayerType::projections, [&] {
      merge_heads(A(a.o), Benc_, N, H, Dh_, A(a.a));
      o_lin_.forward(A(a.a), W(p.wo), W(p.bo), A(a.xm));
      add_inplace(A(a.xm), A(x_[l]), T_ * d);
    });
    timed(LayerType::layernorm, [&] { ln_.forward(A(a.xm), W(p.ln2_g), W(p.ln2_b), A(a.h2), A(a.mean2), A(a.var2)); });
    timed(LayerType::feedforward, [&] {
      ff1_lin_.forward(A(a.h2), W(p.w1), W(p.b1), A(a.u));
      ff_gelu_.forward(A(a.u), A(a.g));
      ff2_lin_.forward(A(a.g), W(p.w2), W(p.b2), A(x_[l + 1]));
      add_inplace(A(x_[l + 1]), A(a.xm), T_ * d);
    });
  }
  timed(LayerType::layernorm, [&] { ln_.forward(A(x_[L]), W(lnf_g_), W(lnf_b_), A(hf_), A(meanf_), A(varf_)); });
  // 3. Pooling, head and loss.
  double loss = 0;
  timed(LayerType::head, [&] {
    if (c_.pooling == Pooling::lm) {
      head1_lin_.forward(A(hf_), W(wc1_), W(bc1_), A(logits_));
    } else {
      float* feat = A(feat_buf_);
      const float* hf = A(hf_);
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < B; ++b) {
        float* f = feat + b * feat_;
        if (c_.pooling == Pooling::mean) {
          std::fill_n(f, d, 0.0f);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t j = 0; j < d; ++j) f[j] += hf[(b * N + n) * d + j];
          for (int64_t j = 0; j < d; ++j) f[j] /= static_cast<float>(N);
        } else {
          std::copy_n(hf + b * N * d, d, f);
        }
        if (c_.two_tower) {
          const float* e2 = hf + (B + b) * N * d;
          for (int64_t j = 0; j < d; ++j) {
            f[d + j] = e2[j];
            f[2 * d + j] = f[j] * e2[j];
            f[3 * d + j] = f[j] - e2[j];
          }
        }
      }
      head1_lin_.forward(feat, W(wc1_), W(bc1_), A(z_));
      head_gelu_.forward(A(z_), A(gz_));
      head2_lin_.forward(A(gz_), W(wc2_), W(bc2_), A(logits_));
    }
    softmax_.forward(A(logits_));
    loss = cross_entropy(A(logits_), targets_.data(), rows_, C_, with_grad);
  });
  return loss;
}

void TransformerModel::backward() {
  const int64_t N = c_.seq, d = c_.dmodel, H = c_.heads, B = c_.batch, L = c_.layers;
  // 3'. Head and pooling: dlogits (in the logits buffer) -> d(final hidden) in dtmp.
  float* dhf = A(dtmp_);
  timed(LayerType::head, [&] {
    if (c_.pooling == Pooling::lm) {
      head1_lin_.backward(A(hf_), W(wc1_), A(logits_), dhf, G(wc1_), G(bc1_));
      return;
    }
    head2_lin_.backward(A(gz_), W(wc2_), A(logits_), A(dz_), G(wc2_), G(bc2_));
    head_gelu_.backward(A(z_), A(dz_), A(dz_));
    head1_lin_.backward(A(feat_buf_), W(wc1_), A(dz_), A(dfeat_), G(wc1_), G(bc1_));
    std::fill_n(dhf, T_ * d, 0.0f);
    const float* hf = A(hf_);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      const float* df = A(dfeat_) + b * feat_;
      if (c_.pooling == Pooling::mean) {
        for (int64_t n = 0; n < N; ++n)
          for (int64_t j = 0; j < d; ++j) dhf[(b * N + n) * d + j] = df[j] / static_cast<float>(N);
        continue;
      }
      float* d1 = dhf + b * N * d;
      if (!c_.two_tower) {
        std::copy_n(df, d, d1);
        continue;
      }
      // f = [e1, e2, e1*e2, e1-e2]
      float* d2 = dhf + (B + b) * N * d;
      const float *e1 = hf + b * N * d, *e2 = hf + (B + b) * N * d;
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
    timed(LayerType::feedforward, [&] {
      ff2_lin_.backward(A(a.g), W(p.w2), A(dres_), A(dff_), G(p.w2), G(p.b2));
      ff_gelu_.backward(A(a.u), A(dff_), A(dff_));
      ff1_lin_.backward(A(a.h2), W(p.w1), A(dff_), A(dtmp_), G(p.w1), G(p.b1));
    });
    timed(LayerType::layernorm, [&] {
      ln_.backward(A(a.xm), A(a.mean2), A(a.var2), A(dtmp_), W(p.ln2_g), W(p.ln2_b), A(dtmp2_), G(p.ln2_g), G(p.ln2_b));
      add_inplace(A(dres_), A(dtmp2_), T_ * d);
    });
    timed(LayerType::projections, [&] {
      o_lin_.backward(A(a.a), W(p.wo), A(dres_), A(dtmp_), G(p.wo), G(p.bo));
      split_single(A(dtmp_), Benc_, N, H, Dh_, A(do_));
    });
    timed(LayerType::attention, [&] { attn_[static_cast<size_t>(l)]->backward(attention_args(l)); });
    timed(LayerType::projections, [&] {
      merge_qkv(A(dq_), A(dk_), A(dv_), Benc_, N, H, Dh_, A(qkv_));
      qkv_lin_.backward(A(a.h1), W(p.wqkv), A(qkv_), A(dtmp_), G(p.wqkv), G(p.bqkv));
    });
    timed(LayerType::layernorm, [&] {
      ln_.backward(A(x_[l]), A(a.mean1), A(a.var1), A(dtmp_), W(p.ln1_g), W(p.ln1_b), A(dtmp2_), G(p.ln1_g), G(p.ln1_b));
      add_inplace(A(dres_), A(dtmp2_), T_ * d);
    });
  }
  // 1'. Embedding: a scatter-add into a zeroed table.
  timed(LayerType::embedding, [&] {
    std::fill_n(G(emb_), c_.vocab * d, 0.0f);
    embedding_backward(tokens_.data(), T_, N, d, A(dres_), G(emb_), cls_ >= 0 ? G(cls_) : nullptr);
  });
}

double TransformerModel::step(const Batch& batch) {
  omp_set_num_threads(c_.threads);
  load(batch);
  const double loss = forward_and_loss(backward_);
  if (!backward_) return loss;
  backward();
  if (mode_ == ModelMode::train)
    timed(LayerType::optimizer, [&] { c_.optimizer.update(w_.data(), g_.data(), m_.data(), v_.data(), n_params_, ++steps_); });
  return loss;
}

double TransformerModel::loss(const Batch& batch) {
  omp_set_num_threads(c_.threads);
  load(batch);
  return forward_and_loss(false);
}

}  // namespace ab
