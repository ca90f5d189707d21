// The softmax-normalised depthwise convolution behind lightconv and dynamicconv (the formulas are
// in softmax_conv.hpp). One (batch, head) pair runs whole on one thread (PerHeadAttention).
//
// Shapes, per (b, h):  V, O, dV, Q, dQ (N, D);  kernel weights w (K) shared by every row
// (lightconv) or (N, K), one row per position (dynamicconv);  taps = softmax_conv_taps(N, K).
//
// Forward
//   1. (dynamicconv) logits L = Q W_h + b_h (N, K), a oneDNN product; w = softmax of each row.
//      (lightconv) w = softmax(theta_h), once per call for every head.
//   2. O_i = sum_t w_{i,t} V_{i-pad+t}: per output row, one axpy of D per tap inside [0, N).
// Backward
//   1. dV_{i-pad+t} += w_{i,t} dO_i, and g_{i,t} = dO_i . V_{i-pad+t} (the gradient of the tap
//      weight; 0 for padding taps). lightconv without parameter gradients needs no g.
//   2. (lightconv) G_t = sum over rows and batch of g_{i,t}, into this thread's partial sums;
//      after every head: dtheta_h = w * (G - sum(w G)), the softmax's backward.
//   3. (dynamicconv) dL_{i,t} = w_{i,t} (g_{i,t} - sum_t' w_{i,t'} g_{i,t'}); dQ = dL W_h^T;
//      with parameter gradients dW_h += Q^T dL, db_h += the column sums of dL.
//   dK = 0 (keys are not used); the parameter gradients are summed per thread in a fixed order
//   (PerHeadAttention), so they are the same at every run with a given thread count.
// Decode (causal): a ring of the last K rows of V per (b, h), slot pos % K; the step writes the
//   new row, then O = sum_t w_t ring[pos - K + 1 + t] over the positions >= 0. Its state is
//   K D floats per head whatever the context: the "fixed state" end of the recall frontier.
#include "attention_impls/softmax_conv.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention_impls/per_head_attention.hpp"
#include "core/vecmath.hpp"

namespace ab {
namespace {

// x (n) <- softmax(x), in place.
void softmax_row(float* x, int64_t n) {
  const float sum = exp_shift_sum(x, x, n, max_of(x, n));
  scale_inplace(x, n, 1.0f / sum);
}

// dx (n) <- y * (dx - y . dx), in place: the softmax's backward for one row, y its output (the
// same step as core's RowSoftmax::backward, here on one thread inside a head's work).
void softmax_backward_row(const float* y, float* dx, int64_t n) {
  const float s = dot(y, dx, n);
#pragma omp simd
  for (int64_t t = 0; t < n; ++t) dx[t] = y[t] * (dx[t] - s);
}

// y += a x over n floats.
inline void axpy(float* y, float a, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += a * x[d];
}

// y[0, W) = sum over k < n of a[k a_step] * x[k x_step .. + W), accumulated in registers and
// stored once. W / 8 independent vector accumulators: 64 columns keep eight FMA chains in
// flight, enough to hide the FMA latency that four chains (32 columns) leave exposed.
template <int64_t W>
inline void weighted_block(float* y, int64_t n, const float* x, int64_t x_step, const float* a, int64_t a_step) {
  float acc[W] = {};
  for (int64_t k = 0; k < n; ++k) {
    const float w = a[k * a_step];
    const float* r = x + k * x_step;
#pragma omp simd
    for (int64_t c = 0; c < W; ++c) acc[c] += w * r[c];
  }
  std::memcpy(y, acc, sizeof acc);
}

// y (D) = sum over k < n of a[k a_step] * x[k x_step .. + D): the weighted sum of n rows (steps in
// floats, either sign), 64 columns at a time, then 32, then the rest.
inline void weighted_rows(float* y, int64_t D, int64_t n, const float* x, int64_t x_step, const float* a, int64_t a_step) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) weighted_block<64>(y + d0, n, x + d0, x_step, a, a_step);
  for (; d0 + 32 <= D; d0 += 32) weighted_block<32>(y + d0, n, x + d0, x_step, a, a_step);
  if (d0 == D) return;
  fill(y + d0, D - d0, 0.0f);
  for (int64_t k = 0; k < n; ++k) axpy(y + d0, a[k * a_step], x + k * x_step + d0, D - d0);
}

class SoftmaxConv final : public PerHeadAttention {
 public:
  SoftmaxConv(const AttnProblem& p, int64_t kernel, bool dynamic)
      : PerHeadAttention(p), K_(kernel), pad_(p.causal ? kernel - 1 : (kernel - 1) / 2), dynamic_(dynamic) {}

  double flops(Mode mode) const override {
    const auto& s = problem_.shape;
    const double D = static_cast<double>(s.D), K = static_cast<double>(K_), N = static_cast<double>(s.N);
    const double BH = static_cast<double>(s.B * s.H);
    if (mode == Mode::decode) return BH * (2.0 * K * D + (dynamic_ ? 2.0 * D * K : 0.0));  // one new row
    const double taps = softmax_conv_taps(s.N, K_, problem_.causal);
    const double predictor = dynamic_ ? 2.0 * N * D * K : 0.0;  // L = Q W_h
    if (mode == Mode::fwd) return BH * (2.0 * taps * D + predictor);
    // Forward, then dV and g (2 taps D each; lightconv forms g only for its parameter gradients),
    // dQ = dL W^T, and with parameter gradients dW = Q^T dL.
    const bool g = dynamic_ || problem_.param_grads;
    double per_head = 2.0 * taps * D + predictor + 2.0 * taps * D + (g ? 2.0 * taps * D : 0.0);
    if (dynamic_) per_head += predictor + (problem_.param_grads ? predictor : 0.0);
    return BH * per_head;
  }

  size_t working_bytes(Mode mode) const override {
    plan(mode);
    const auto& s = problem_.shape;
    const size_t T = static_cast<size_t>(problem_.threads), f = sizeof(float);
    size_t floats = param_floats() + (dynamic_ ? 0 : kernel_floats());  // lightconv: w beside theta
    if (learning(mode)) floats += (1 + T) * param_floats();              // gradients, per-thread partials
    if (mode == Mode::decode) {
      floats += ring_floats() + (dynamic_ ? T * static_cast<size_t>(K_) : 0);
    } else if (dynamic_) {
      floats += static_cast<size_t>(s.B * s.H * s.N * K_);                          // w (B, H, N, K)
      if (mode == Mode::fwdbwd) floats += T * static_cast<size_t>(s.N * K_);         // dL per thread
    }
    return floats * f + scratchpad_bytes();
  }

  void setup(Mode mode, Rng& rng) override {
    plan(mode);
    const auto& s = problem_.shape;
    const int64_t T = problem_.threads;
    if (dynamic_) {
      // fairseq's weight_linear: Xavier-uniform weights (here per head, D -> K), zero bias.
      W_ = Buffer<float>(static_cast<size_t>(s.H * s.D * K_));
      bias_ = Buffer<float>(static_cast<size_t>(s.H * K_));
      const double l = std::sqrt(6.0 / static_cast<double>(s.D + K_));
      rng.fill_uniform(W_.data(), static_cast<int64_t>(W_.size()), -l, l);
      bias_.zero();
    } else {
      // fairseq's lightconv weight (H, 1, K), Xavier-uniform: fan in K, fan out H K.
      theta_ = Buffer<float>(kernel_floats());
      w_ = Buffer<float>(kernel_floats());
      const double l = std::sqrt(6.0 / static_cast<double>(K_ + s.H * K_));
      rng.fill_uniform(theta_.data(), static_cast<int64_t>(theta_.size()), -l, l);
    }
    if (learning(mode)) {
      grads_ = Buffer<float>(param_floats());
      partials_ = Buffer<float>(static_cast<size_t>(T) * param_floats());
    }
    if (mode == Mode::decode) {
      ring_ = Buffer<float>(ring_floats());
      if (dynamic_) step_w_ = Buffer<float>(static_cast<size_t>(T * K_));
    } else if (dynamic_) {
      weights_ = Buffer<float>(static_cast<size_t>(s.B * s.H * s.N * K_));
      if (mode == Mode::fwdbwd) dlogits_ = Buffer<float>(static_cast<size_t>(T * s.N * K_));
    }
    bind_products(mode);
  }

  void forward(const AttnArgs& a) override {
    if (!dynamic_) normalise_kernels();
    PerHeadAttention::forward(a);
  }

  std::vector<LearnedTensor> learned() override {
    const auto& s = problem_.shape;
    float* g = grads_.data();
    if (!dynamic_) return {{"theta", theta_.data(), g, s.H * K_}};
    return {{"W", W_.data(), g, s.H * s.D * K_}, {"b", bias_.data(), g ? g + s.H * s.D * K_ : nullptr, s.H * K_}};
  }

  std::vector<DumpTensor> dump_tensors() const override {
    const auto& s = problem_.shape;
    if (!dynamic_) return {DumpTensor{"theta", {s.H, K_}, theta_.data(), nullptr}};
    return {DumpTensor{"W", {s.H, s.D, K_}, W_.data(), nullptr}, DumpTensor{"b", {s.H, K_}, bias_.data(), nullptr}};
  }

  std::string dump_note() const override {
    return dynamic_ ? "K is not used: the convolution mixes V with kernels predicted from Q"
                    : "Q and K are not used: the convolution mixes V with one learned kernel per head";
  }

  // ---- decode ----
  void decode_prefill(const AttnArgs& a, int64_t n) override {
    if (!dynamic_) normalise_kernels();
    const auto& s = problem_.shape;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t i = std::max<int64_t>(0, n - K_); i < n; ++i)
          std::memcpy(ring_row(b, h, i), a.v.row(b, h, i), static_cast<size_t>(s.D) * sizeof(float));
  }

  void decode_step(const AttnArgs& t, int64_t pos) override {
    const int64_t D = problem_.shape.D;
    for_each_head(problem_.shape, [&](int tid, int64_t b, int64_t h) {
      std::memcpy(ring_row(b, h, pos), t.v.row(b, h, 0), static_cast<size_t>(D) * sizeof(float));
      const float* w = w_.data() + h * K_;
      if (dynamic_) {
        float* x = step_w_.data() + tid * K_;
        const float* q = t.q.row(b, h, 0);
        const float* W = W_.data() + h * D * K_;
        for (int64_t k = 0; k < K_; ++k) x[k] = bias_.data()[h * K_ + k];
        for (int64_t d = 0; d < D; ++d) axpy(x, q[d], W + d * K_, K_);
        softmax_row(x, K_);
        w = x;
      }
      float* o = t.o.row(b, h, 0);
      fill(o, D, 0.0f);
      for (int64_t k = std::max<int64_t>(0, K_ - 1 - pos); k < K_; ++k) axpy(o, w[k], ring_row(b, h, pos - K_ + 1 + k), D);
    });
  }

 protected:
  std::vector<MatmulSpec> products(Mode mode) const override {
    if (!dynamic_ || mode == Mode::decode) return {};
    std::vector<MatmulSpec> out = {spec_logits()};
    if (mode == Mode::fwdbwd) out.push_back(spec_dq());
    if (learning(mode)) out.push_back(spec_dw());
    return out;
  }

  void forward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const override {
    const int64_t N = problem_.shape.N, D = problem_.shape.D, sn = problem_.strides.sn;
    const float* w = w_.data() + h * K_;
    int64_t ldw = 0;
    if (dynamic_) {
      float* L = weights_row(b, h, 0);
      mm_.run(tid, spec_logits(), a.q.head(b, h), W_.data() + h * D * K_, L);
      const float* bias = bias_.data() + h * K_;
      for (int64_t i = 0; i < N; ++i) {
        float* x = L + i * K_;
#pragma omp simd
        for (int64_t k = 0; k < K_; ++k) x[k] += bias[k];
        softmax_row(x, K_);
      }
      w = L;
      ldw = K_;
    }
    const float* V = a.v.head(b, h);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t0 = first_tap(i);
      weighted_rows(a.o.row(b, h, i), D, end_tap(i) - t0, V + (i - pad_ + t0) * sn, sn, w + i * ldw + t0, 1);
    }
  }

  void backward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const override {
    const int64_t N = problem_.shape.N, D = problem_.shape.D, sn = problem_.strides.sn;
    for (int64_t i = 0; i < N; ++i) {
      fill(a.dk.row(b, h, i), D, 0.0f);
      if (!dynamic_) fill(a.dq.row(b, h, i), D, 0.0f);
    }
    const float* w = dynamic_ ? weights_row(b, h, 0) : w_.data() + h * K_;
    const int64_t ldw = dynamic_ ? K_ : 0;
    const float* V = a.v.head(b, h);
    const float* dO = a.dout.head(b, h);
    // 1a. dV_j = sum_t w_{i,t} dO_i over i = j + pad - t inside [0, N): a weighted sum of rows of
    // dO (going back one row per tap) with the weights w_{i,t} (ldw - 1 floats apart).
    for (int64_t j = 0; j < N; ++j) {
      const int64_t t0 = std::max<int64_t>(0, j + pad_ - (N - 1)), t1 = std::min<int64_t>(K_, j + pad_ + 1);
      const int64_t i0 = j + pad_ - t0;
      weighted_rows(a.dv.row(b, h, j), D, t1 - t0, dO + i0 * sn, -sn, w + i0 * ldw + t0, 1 - ldw);
    }
    // 1b. g_{i,t} = dO_i . V_{i-pad+t}: per row (dynamicconv, into G) or summed over the rows into
    // this thread's partial sums (lightconv with parameter gradients; without them, not needed).
    if (!dynamic_ && !grads_.data()) return;
    float* G = dynamic_ ? dlogits_.data() + tid * N * K_ : nullptr;  // g, then dL, per row
    float* Gsum = dynamic_ ? nullptr : partial(tid) + h * K_;
    for (int64_t i = 0; i < N; ++i) {
      const float* dOi = dO + i * sn;
      float* gi = G ? G + i * K_ : nullptr;
      if (gi) fill(gi, K_, 0.0f);
      for (int64_t t = first_tap(i); t < end_tap(i); ++t) {
        const float g = dot(dOi, V + (i - pad_ + t) * sn, D);
        if (gi) gi[t] = g;
        else Gsum[t] += g;
      }
    }
    if (!dynamic_) return;  // 2. lightconv: the softmax's backward once all heads are summed
    // 3. dL = w * (g - sum(w g)) per row; dQ = dL W^T; dW += Q^T dL, db += column sums.
    for (int64_t i = 0; i < N; ++i) softmax_backward_row(w + i * K_, G + i * K_, K_);
    mm_.run(tid, spec_dq(), G, W_.data() + h * D * K_, a.dq.head(b, h));
    if (!grads_.data()) return;
    mm_.run(tid, spec_dw(), a.q.head(b, h), G, partial(tid) + h * D * K_);
    float* db = partial(tid) + problem_.shape.H * D * K_ + h * K_;
    for (int64_t i = 0; i < N; ++i) axpy(db, 1.0f, G + i * K_, K_);
  }

  void begin_param_grads() override { partials_.zero(); }

  // The threads' partial sums in thread order; lightconv then applies the softmax's backward
  // to G, head by head: dtheta = w * (G - w . G).
  void end_param_grads() override {
    const size_t n = param_floats();
    float* g = grads_.data();
    std::memcpy(g, partials_.data(), n * sizeof(float));
    for (int t = 1; t < problem_.threads; ++t) axpy(g, 1.0f, partials_.data() + static_cast<size_t>(t) * n, static_cast<int64_t>(n));
    if (dynamic_) return;
    for (int64_t h = 0; h < problem_.shape.H; ++h) softmax_backward_row(w_.data() + h * K_, g + h * K_, K_);
  }

 private:
  bool learning(Mode mode) const { return problem_.param_grads && mode == Mode::fwdbwd; }
  size_t kernel_floats() const { return static_cast<size_t>(problem_.shape.H * K_); }
  size_t param_floats() const {
    return dynamic_ ? static_cast<size_t>(problem_.shape.H * (problem_.shape.D + 1) * K_) : kernel_floats();
  }
  size_t ring_floats() const { return static_cast<size_t>(problem_.shape.B * problem_.shape.H * K_ * problem_.shape.D); }

  // The taps of output row i that land inside [0, N): t in [first_tap(i), end_tap(i)).
  int64_t first_tap(int64_t i) const { return std::max<int64_t>(0, pad_ - i); }
  int64_t end_tap(int64_t i) const { return std::min<int64_t>(K_, problem_.shape.N + pad_ - i); }

  void normalise_kernels() {
    std::memcpy(w_.data(), theta_.data(), kernel_floats() * sizeof(float));
    for (int64_t h = 0; h < problem_.shape.H; ++h) softmax_row(w_.data() + h * K_, K_);
  }

  float* weights_row(int64_t b, int64_t h, int64_t i) const {
    return weights_.data() + ((b * problem_.shape.H + h) * problem_.shape.N + i) * K_;
  }
  float* ring_row(int64_t b, int64_t h, int64_t pos) const {
    return ring_.data() + ((b * problem_.shape.H + h) * K_ + pos % K_) * problem_.shape.D;
  }
  float* partial(int tid) const { return partials_.data() + static_cast<size_t>(tid) * param_floats(); }

  // L (N, K) = Q (N, D) W_h (D, K)
  MatmulSpec spec_logits() const {
    return MatmulSpec::tile(problem_.shape.N, K_, problem_.shape.D, problem_.strides.sn, false, K_, false, K_);
  }
  // dQ (N, D) = dL (N, K) W_h^T
  MatmulSpec spec_dq() const {
    return MatmulSpec::tile(problem_.shape.N, problem_.shape.D, K_, K_, false, K_, true, problem_.strides.sn);
  }
  // dW_h (D, K) += Q^T (D, N) dL (N, K)
  MatmulSpec spec_dw() const {
    return MatmulSpec::tile(problem_.shape.D, K_, problem_.shape.N, problem_.strides.sn, true, K_, false, K_, 1.0f, true);
  }

  int64_t K_, pad_;
  bool dynamic_;
  Buffer<float> theta_, w_;            // lightconv: logits of the kernel (H, K), its softmax
  Buffer<float> W_, bias_;             // dynamicconv: the kernel predictor (H, D, K), (H, K)
  Buffer<float> weights_, dlogits_;    // dynamicconv: w (B, H, N, K); g then dL per thread (N, K)
  Buffer<float> grads_, partials_;     // param_grads: the gradients, each thread's partial sums
  Buffer<float> ring_, step_w_;        // decode: the last K rows of V; a step's kernel per thread
};

}  // namespace

double softmax_conv_taps(int64_t N, int64_t kernel, bool causal) {
  const int64_t pad = causal ? kernel - 1 : (kernel - 1) / 2;
  double taps = 0;
  for (int64_t t = 0; t < kernel; ++t) taps += static_cast<double>(std::max<int64_t>(0, N - std::abs(t - pad)));
  return taps;
}

std::unique_ptr<Attention> make_softmax_conv(const AttnProblem& p, int64_t kernel, bool dynamic) {
  return std::make_unique<SoftmaxConv>(p, kernel, dynamic);
}

MechanismInfo softmax_conv_info(const std::string& name, const std::string& summary, const std::string& complexity,
                                bool dynamic) {
  MechanismInfo m;
  m.name = name;
  m.family = "convolution";
  m.summary = summary;
  m.complexity = complexity;
  m.caps = Capabilities{.exact = false, .causal = true, .backward = true, .decode = true,
                        .constraints = "", .attn_dropout = false,
                        .no_attn_dropout = "it forms no attention probabilities; fairseq's DropConnect on the kernel is not implemented",
                        .rope = false,
                        .no_rope = "it takes no q·k products: its weights depend on the offset alone (lightconv) or on the query alone (dynamicconv), so a rotation has nothing to act on",
                        .additive_bias = false,
                        .no_additive_bias = "it forms no logit per (query, key) pair; its kernel already weights each offset"};
  m.params = {ParamSpec{"kernel", ParamType::Int, int64_t{31}, 1, 4095, {}, "kernel width K (taps)"}};
  m.make = [dynamic](const AttnProblem& p, const ParamValues& v) { return make_softmax_conv(p, v.get_int("kernel"), dynamic); };
  m.reference = [dynamic](const Attention& impl, const AttnArgs& a, const AttnProblem& p, const ParamValues& v) {
    const int64_t K = v.get_int("kernel");
    if (!dynamic) return ref::lightconv(a.v, dump_tensor(impl, "theta").f32, K, p.causal);
    return ref::dynamicconv(a.q, a.v, dump_tensor(impl, "W").f32, dump_tensor(impl, "b").f32, K, p.causal);
  };
  return m;
}

std::vector<double> ref::softmax_conv(const TensorView& v, int64_t K, bool causal,
                                      const std::function<std::vector<double>(int64_t b, int64_t h)>& kernels) {
  const Shape4& s = v.shape;
  const int64_t pad = causal ? K - 1 : (K - 1) / 2;
  std::vector<double> out(static_cast<size_t>(s.numel()), 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const auto w = kernels(b, h);  // (N, K)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t t = 0; t < K; ++t) {
          const int64_t j = i - pad + t;
          if (j < 0 || j >= s.N) continue;  // zero padding
          for (int64_t d = 0; d < s.D; ++d) out[idx(s, b, h, i, d)] += w[i * K + t] * v.at(b, h, j, d);
        }
    }
  return out;
}

// softmax over each row of (rows, K) logits, in place.
static std::vector<double> softmax_rows(std::vector<double> w, int64_t K) {
  for (size_t r = 0; r < w.size(); r += static_cast<size_t>(K)) {
    double mx = -1e300, sum = 0;
    for (int64_t t = 0; t < K; ++t) mx = std::max(mx, w[r + t]);
    for (int64_t t = 0; t < K; ++t) sum += (w[r + t] = std::exp(w[r + t] - mx));
    for (int64_t t = 0; t < K; ++t) w[r + t] /= sum;
  }
  return w;
}

std::vector<double> ref::lightconv(const TensorView& v, const float* theta, int64_t K, bool causal) {
  return softmax_conv(v, K, causal, [&](int64_t, int64_t h) {
    std::vector<double> logits;  // theta_h at every position, (N, K)
    for (int64_t i = 0; i < v.shape.N; ++i) logits.insert(logits.end(), theta + h * K, theta + (h + 1) * K);
    return softmax_rows(std::move(logits), K);
  });
}

std::vector<double> ref::dynamicconv(const TensorView& q, const TensorView& v, const float* W, const float* bias,
                                     int64_t K, bool causal) {
  const int64_t N = q.shape.N, D = q.shape.D;
  return softmax_conv(v, K, causal, [&](int64_t b, int64_t h) {
    std::vector<double> logits(static_cast<size_t>(N * K));  // q_i W_h + b_h, (N, K)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t t = 0; t < K; ++t) {
        double x = bias[h * K + t];
        for (int64_t d = 0; d < D; ++d) x += double(q.at(b, h, i, d)) * W[(h * D + d) * K + t];
        logits[i * K + t] = x;
      }
    return softmax_rows(std::move(logits), K);
  });
}

}  // namespace ab
