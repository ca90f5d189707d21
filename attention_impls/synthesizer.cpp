// synthesizer: attention whose logits do not come from query-key dot products.
// Paper: Tay et al. 2020, "Synthesizer: Rethinking Self-Attention in Transformer Models".
// Complexity: O(N^2 D) time for every variant (the softmax over N keys and the product with V
//   stay quadratic: the mechanism tests whether dot products are needed, not cost); memory
//   O(N D) for dense, O(H N^2) for random (the logits are parameters), O(N k) for factorized.
// Computes: O = softmax(A + M) V, M = -inf above the diagonal when causal, with
//   dense:      A_i = relu(q_i W1 + b1) W2 + b2, first N columns of W2 (D, max_len);
//   random:     A = R (N, N) per head, fixed;
//   factorized: A = R1 R2^T, R1, R2 (N, k).
//   Parameters are seeded (weights Glorot-uniform, biases uniform +-0.1, R, R1, R2 standard
//   normal) and dumped.
// Optimises: the logits are produced tile by tile inside the tiled online-softmax engine (a
//   oneDNN matmul per tile for dense and factorized, a copy for random), never as an N x N
//   matrix beyond random's own parameter.
// Backward: dQ, dK, dV (dK is zero, and so is dQ for random and factorized, whose logits do not
//   depend on the input); for training (param_grads) also the gradients of W1 b1 W2 b2, R, or
//   R1 R2, summed over the batch per thread in a fixed order.
// Leaves out: mixing with dot-product attention (the paper's hybrids).
#include <omp.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <cstring>

#include "attention_impls/registry.hpp"
#include "attention_impls/tiled_softmax.hpp"
#include "core/vecmath.hpp"

namespace ab {
namespace {

enum class Variant { dense, random, factorized };

class Synthesizer final : public Attention, private LogitsSource {
 public:
  Synthesizer(const AttnProblem& p, const ParamValues& v)
      : problem_(p),
        variant_(v.get_choice("variant") == "dense"    ? Variant::dense
                 : v.get_choice("variant") == "random" ? Variant::random
                                                       : Variant::factorized),
        max_len_(v.get_int("max_len") == 0 ? p.shape.N : v.get_int("max_len")),
        k_(v.get_int("k")),
        core_(shape_of(p)) {}

  void validate() const override {
    if (variant_ == Variant::dense && max_len_ < problem_.shape.N)
      throw InvalidInput("synthesizer: max_len=" + std::to_string(max_len_) + " is below N=" +
                         std::to_string(problem_.shape.N) + "; it must be 0 (= N) or at least N");
  }

  // Causal: the diagonal tiles are scored whole and masked.
  std::optional<double> admissible_fraction() const override { return core_.pairs() / core_.scored_pairs(); }

  double flops(Mode mode) const override {
    const auto& s = problem_.shape;
    const double p = core_.pairs(), D = static_cast<double>(s.D), N = static_cast<double>(s.N);
    const bool fwd = mode == Mode::fwd;
    // P V forward; dV and dP backward (2 p D each).
    double per_head = (fwd ? 2.0 : 6.0) * p * D;
    // dense: H1 = relu(Q W1 + b1) (2 N D^2), logits H1 W2 (2 p D); backward recomputes the
    // logits, and adds dH1 = dA W2^T (2 p D) and dQ = dpre W1^T (2 N D^2).
    if (variant_ == Variant::dense) per_head += fwd ? 2.0 * N * D * D + 2.0 * p * D : 4.0 * N * D * D + 6.0 * p * D;
    // factorized: logits R1 R2^T (2 p k), recomputed in the backward pass.
    if (variant_ == Variant::factorized) per_head += (fwd ? 2.0 : 4.0) * p * static_cast<double>(k_);
    // The parameters' gradients: dense dW2 = H1^T dA (2 p D), dW1 = Q^T dpre (2 N D^2);
    // factorized dR1 = dA R2, dR2 = dA^T R1 (2 p k each); random dR = dA (no product).
    if (learning(mode) && variant_ == Variant::dense) per_head += 2.0 * p * D + 2.0 * N * D * D;
    if (learning(mode) && variant_ == Variant::factorized) per_head += 4.0 * p * static_cast<double>(k_);
    return per_head * static_cast<double>(s.B * s.H);
  }

  size_t working_bytes(Mode mode) const override {
    plan(mode);
    // With the parameters' gradients: the gradients and one partial sum of them per thread.
    const size_t copies = learning(mode) ? 2 + static_cast<size_t>(problem_.threads) : 1;
    size_t b = copies * param_floats() * sizeof(float) + core_.working_bytes(mode);
    if (variant_ == Variant::dense)
      b += (mode == Mode::fwdbwd ? 2 : 1) * hidden_floats() * sizeof(float) +
           static_cast<size_t>(problem_.threads) * hidden_mm_.scratch_per_slot();
    return b;
  }

  void setup(Mode mode, Rng& rng) override {
    plan(mode);
    const auto& s = problem_.shape;
    const int64_t D = s.D, N = s.N, H = s.H;
    if (variant_ == Variant::dense) {
      W1_ = Buffer<float>(static_cast<size_t>(H * D * D));
      b1_ = Buffer<float>(static_cast<size_t>(H * D));
      W2_ = Buffer<float>(static_cast<size_t>(H * D * max_len_));
      b2_ = Buffer<float>(static_cast<size_t>(H * max_len_));
      const double l1 = std::sqrt(6.0 / (2.0 * D)), l2 = std::sqrt(6.0 / static_cast<double>(D + max_len_));
      rng.fill_uniform(W1_.data(), static_cast<int64_t>(W1_.size()), -l1, l1);
      rng.fill_uniform(b1_.data(), static_cast<int64_t>(b1_.size()), -0.1, 0.1);
      rng.fill_uniform(W2_.data(), static_cast<int64_t>(W2_.size()), -l2, l2);
      rng.fill_uniform(b2_.data(), static_cast<int64_t>(b2_.size()), -0.1, 0.1);
      hidden_ = Buffer<float>(hidden_floats());
      if (mode == Mode::fwdbwd) dhidden_ = Buffer<float>(hidden_floats());
      h_scratch_ = Buffer<std::byte>(static_cast<size_t>(problem_.threads) * hidden_mm_.scratch_per_slot());
      hidden_mm_.bind(problem_.threads, h_scratch_.data());
    } else if (variant_ == Variant::random) {
      R_ = Buffer<float>(static_cast<size_t>(H * N * N));
      rng.fill_normal(R_.data(), static_cast<int64_t>(R_.size()));
    } else {
      R1_ = Buffer<float>(static_cast<size_t>(H * N * k_));
      R2_ = Buffer<float>(static_cast<size_t>(H * N * k_));
      rng.fill_normal(R1_.data(), static_cast<int64_t>(R1_.size()));
      rng.fill_normal(R2_.data(), static_cast<int64_t>(R2_.size()));
    }
    if (learning(mode)) {
      grads_ = Buffer<float>(param_floats());
      partials_ = Buffer<float>(static_cast<size_t>(problem_.threads) * param_floats());
    }
    core_.setup(mode);
  }

  void forward(const AttnArgs& a) override {
    a_ = a;
    if (variant_ == Variant::dense) compute_hidden(a);
    core_.forward(*this, a.v, a.o);
  }

  void backward(const AttnArgs& a) override {
    a_ = a;
    if (!grads_.data()) {
      core_.backward(*this, a.v, a.o, a.dout, a.dv);
      return;
    }
    partials_.zero();
    core_.backward(*this, a.v, a.o, a.dout, a.dv);
    // The per-thread partial sums, added in thread order.
    const size_t n = param_floats();
    std::memcpy(grads_.data(), partials_.data(), n * sizeof(float));
    for (int t = 1; t < problem_.threads; ++t) {
      const float* part = partials_.data() + static_cast<size_t>(t) * n;
      float* g = grads_.data();
#pragma omp simd
      for (size_t i = 0; i < n; ++i) g[i] += part[i];
    }
  }

  // The parameters in dump order with their sizes: the layout of the gradients and of each
  // thread's partial sums too.
  std::vector<std::tuple<const char*, float*, int64_t>> parameters() const {
    const auto& s = problem_.shape;
    switch (variant_) {
      case Variant::dense:
        return {{"W1", W1_.data(), s.H * s.D * s.D}, {"b1", b1_.data(), s.H * s.D},
                {"W2", W2_.data(), s.H * s.D * max_len_}, {"b2", b2_.data(), s.H * max_len_}};
      case Variant::random: return {{"R", R_.data(), s.H * s.N * s.N}};
      case Variant::factorized: return {{"R1", R1_.data(), s.H * s.N * k_}, {"R2", R2_.data(), s.H * s.N * k_}};
    }
    return {};
  }

  std::vector<LearnedTensor> learned() override {
    std::vector<LearnedTensor> out;
    int64_t at = 0;
    for (const auto& [name, value, count] : parameters()) {
      out.push_back({name, value, grads_.data() ? grads_.data() + at : nullptr, count});
      at += count;
    }
    return out;
  }

  void set_dropout(const Dropout& d) override { core_.set_dropout(d); }

  std::vector<DumpTensor> dump_tensors() const override {
    const auto& s = problem_.shape;
    switch (variant_) {
      case Variant::dense:
        return {DumpTensor{"W1", {s.H, s.D, s.D}, W1_.data(), nullptr},
                DumpTensor{"b1", {s.H, s.D}, b1_.data(), nullptr},
                DumpTensor{"W2", {s.H, s.D, max_len_}, W2_.data(), nullptr},
                DumpTensor{"b2", {s.H, max_len_}, b2_.data(), nullptr}};
      case Variant::random: return {DumpTensor{"R", {s.H, s.N, s.N}, R_.data(), nullptr}};
      case Variant::factorized:
        return {DumpTensor{"R1", {s.H, s.N, k_}, R1_.data(), nullptr},
                DumpTensor{"R2", {s.H, s.N, k_}, R2_.data(), nullptr}};
    }
    return {};
  }

 private:
  static TiledSoftmaxShape shape_of(const AttnProblem& p) {
    TiledSoftmaxShape sh = TiledSoftmaxShape::dense(p.shape.B, p.shape.H, p.shape.N, p.shape.N, p.shape.D, p.causal,
                                                    p.strides.sn, p.strides.sn, p.threads);
    // The parameters' gradients are summed per thread: a fixed order of (b, h) pairs.
    sh.static_schedule = p.param_grads;
    return sh;
  }
  bool learning(Mode mode) const { return problem_.param_grads && mode == Mode::fwdbwd; }

  // ---- the logits source ----
  void plan_tile(MatmulCache& mm, int64_t rows, int64_t cols, int64_t ldS, bool backward) const override {
    const bool learn = backward && problem_.param_grads;
    if (variant_ == Variant::dense) {
      mm.add(spec_hw2(rows, cols, ldS));
      if (backward) mm.add(spec_dhidden(rows, cols, ldS));
      if (learn) mm.add(spec_dw2(rows, cols, ldS));
    } else if (variant_ == Variant::factorized) {
      mm.add(spec_r1r2(rows, cols, ldS));
      if (learn) {
        mm.add(spec_dr1(rows, cols, ldS));
        mm.add(spec_dr2(rows, cols, ldS));
      }
    }
  }

  void logits(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows, int64_t c0,
              int64_t cols, float* S, int64_t ldS) const override {
    const int64_t N = problem_.shape.N;
    switch (variant_) {
      case Variant::dense: {
        mm.run(tid, spec_hw2(rows, cols, ldS), hidden_row(b, h, r0), W2_.data() + h * problem_.shape.D * max_len_ + c0, S);
        const float* bias = b2_.data() + h * max_len_ + c0;
        for (int64_t r = 0; r < rows; ++r) {
          float* Sr = S + r * ldS;
#pragma omp simd
          for (int64_t c = 0; c < cols; ++c) Sr[c] += bias[c];
        }
        break;
      }
      case Variant::random:
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(S + r * ldS, R_.data() + (h * N + r0 + r) * N + c0, static_cast<size_t>(cols) * sizeof(float));
        break;
      case Variant::factorized:
        mm.run(tid, spec_r1r2(rows, cols, ldS), R1_.data() + (h * N + r0) * k_, R2_.data() + (h * N + c0) * k_, S);
        break;
    }
  }

  // Dense: dH1(rows) += dA W2[:, cols]^T; the rest is done per head in backward_end.
  // With the parameters' gradients, into this thread's partial sums: dense dW2[:, cols] +=
  // H1(rows)^T dA, db2[cols] += colsum dA; random dR[rows, cols] += dA; factorized dR1[rows] +=
  // dA R2[cols], dR2[cols] += dA^T R1[rows].
  void logits_backward(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows, int64_t c0,
                       int64_t cols, const float* dS, int64_t ldS) const override {
    const int64_t N = problem_.shape.N, D = problem_.shape.D;
    const bool learn = grads_.data() != nullptr;
    switch (variant_) {
      case Variant::dense:
        mm.run(tid, spec_dhidden(rows, cols, ldS), dS, W2_.data() + h * D * max_len_ + c0,
               dhidden_.data() + ((b * problem_.shape.H + h) * N + r0) * D);
        if (learn) {
          mm.run(tid, spec_dw2(rows, cols, ldS), hidden_row(b, h, r0), dS, partial(tid, 2, h) + c0);
          float* db2 = partial(tid, 3, h) + c0;
          for (int64_t r = 0; r < rows; ++r) {
            const float* d = dS + r * ldS;
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) db2[c] += d[c];
          }
        }
        break;
      case Variant::random:
        if (learn)
          for (int64_t r = 0; r < rows; ++r) {
            float* g = partial(tid, 0, h) + (r0 + r) * N + c0;
            const float* d = dS + r * ldS;
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) g[c] += d[c];
          }
        break;
      case Variant::factorized:
        if (learn) {
          mm.run(tid, spec_dr1(rows, cols, ldS), dS, R2_.data() + (h * N + c0) * k_, partial(tid, 0, h) + r0 * k_);
          mm.run(tid, spec_dr2(rows, cols, ldS), dS, R1_.data() + (h * N + r0) * k_, partial(tid, 1, h) + c0 * k_);
        }
        break;
    }
  }

  void backward_begin(const MatmulCache&, int, int64_t b, int64_t h) const override {
    const int64_t N = problem_.shape.N, D = problem_.shape.D;
    for (int64_t i = 0; i < N; ++i) {
      fill(a_.dq.row(b, h, i), D, 0.0f);
      fill(a_.dk.row(b, h, i), D, 0.0f);
    }
    if (variant_ == Variant::dense) fill(dhidden_.data() + (b * problem_.shape.H + h) * N * D, N * D, 0.0f);
  }

  // Dense: dpre = dH1 * (pre > 0), dQ = dpre W1^T (H1 = relu(pre) > 0 exactly where pre > 0).
  void backward_end(const MatmulCache&, int tid, int64_t b, int64_t h) const override {
    if (variant_ != Variant::dense) return;
    const int64_t N = problem_.shape.N, D = problem_.shape.D;
    float* dH = dhidden_.data() + (b * problem_.shape.H + h) * N * D;
    const float* H1 = hidden_row(b, h, 0);
    for (int64_t i = 0; i < N * D; ++i) dH[i] = H1[i] > 0.0f ? dH[i] : 0.0f;
    hidden_mm_.run(tid, spec_dq(), dH, W1_.data() + h * D * D, a_.dq.head(b, h));
    if (!grads_.data()) return;
    // dW1 += Q^T dpre, db1 += colsum dpre.
    hidden_mm_.run(tid, spec_dw1(), a_.q.head(b, h), dH, partial(tid, 0, h));
    float* db1 = partial(tid, 1, h);
    for (int64_t i = 0; i < N; ++i) {
      const float* d = dH + i * D;
#pragma omp simd
      for (int64_t c = 0; c < D; ++c) db1[c] += d[c];
    }
  }

  // Thread tid's partial gradient of head h's part of parameter `index` (parameters() order:
  // dense W1 b1 W2 b2, random R, factorized R1 R2), each (H, ...) with `per_head` floats a head.
  float* partial(int tid, int index, int64_t h) const {
    const auto& s = problem_.shape;
    int64_t at = 0, per_head = 0;
    switch (variant_) {
      case Variant::dense: {
        const int64_t sizes[] = {s.D * s.D, s.D, s.D * max_len_, max_len_};
        for (int i = 0; i < index; ++i) at += s.H * sizes[i];
        per_head = sizes[index];
        break;
      }
      case Variant::random: per_head = s.N * s.N; break;
      case Variant::factorized:
        per_head = s.N * k_;
        at = index * s.H * per_head;
        break;
    }
    return partials_.data() + static_cast<size_t>(tid) * param_floats() + at + h * per_head;
  }

  // H1 = relu(Q W1 + b1) per (b, h), kept for the tiles and the backward pass.
  void compute_hidden(const AttnArgs& a) const {
    const auto& s = problem_.shape;
    const int64_t BH = s.B * s.H, N = s.N, D = s.D;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int tid = omp_get_thread_num();
      const int64_t b = bh / s.H, h = bh % s.H;
      float* H1 = hidden_.data() + bh * N * D;
      hidden_mm_.run(tid, spec_qw1(), a.q.head(b, h), W1_.data() + h * D * D, H1);
      const float* bias = b1_.data() + h * D;
      for (int64_t i = 0; i < N; ++i) {
        float* x = H1 + i * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) x[d] = std::max(x[d] + bias[d], 0.0f);
      }
    }
  }

  const float* hidden_row(int64_t b, int64_t h, int64_t r) const {
    return hidden_.data() + ((b * problem_.shape.H + h) * problem_.shape.N + r) * problem_.shape.D;
  }
  // S(rows, cols) = H1(rows, D) W2(D, cols)
  MatmulSpec spec_hw2(int64_t rows, int64_t cols, int64_t ldS) const {
    return MatmulSpec::tile(rows, cols, problem_.shape.D, problem_.shape.D, false, max_len_, false, ldS);
  }
  // dH1(rows, D) += dS(rows, cols) W2(D, cols)^T
  MatmulSpec spec_dhidden(int64_t rows, int64_t cols, int64_t ldS) const {
    return MatmulSpec::tile(rows, problem_.shape.D, cols, ldS, false, max_len_, true, problem_.shape.D, 1.0f, true);
  }
  // dW2(D, cols) += H1(rows, D)^T dS(rows, cols), W2 row stride max_len
  MatmulSpec spec_dw2(int64_t rows, int64_t cols, int64_t ldS) const {
    return MatmulSpec::tile(problem_.shape.D, cols, rows, problem_.shape.D, true, ldS, false, max_len_, 1.0f, true);
  }
  // dW1(D, D) += Q(N, D)^T dpre(N, D)
  MatmulSpec spec_dw1() const {
    return MatmulSpec::tile(problem_.shape.D, problem_.shape.D, problem_.shape.N, problem_.strides.sn, true, problem_.shape.D, false, problem_.shape.D, 1.0f, true);
  }
  // dR1(rows, k) += dS(rows, cols) R2(cols, k)
  MatmulSpec spec_dr1(int64_t rows, int64_t cols, int64_t ldS) const {
    return MatmulSpec::tile(rows, k_, cols, ldS, false, k_, false, k_, 1.0f, true);
  }
  // dR2(cols, k) += dS(rows, cols)^T R1(rows, k)
  MatmulSpec spec_dr2(int64_t rows, int64_t cols, int64_t ldS) const {
    return MatmulSpec::tile(cols, k_, rows, ldS, true, k_, false, k_, 1.0f, true);
  }
  // S(rows, cols) = R1(rows, k) R2(cols, k)^T
  MatmulSpec spec_r1r2(int64_t rows, int64_t cols, int64_t ldS) const {
    return MatmulSpec::tile(rows, cols, k_, k_, false, k_, true, ldS);
  }
  // H1(N, D) = Q(N, D) W1(D, D)
  MatmulSpec spec_qw1() const {
    return MatmulSpec::tile(problem_.shape.N, problem_.shape.D, problem_.shape.D, problem_.strides.sn, false, problem_.shape.D, false, problem_.shape.D);
  }
  // dQ(N, D) = dpre(N, D) W1^T
  MatmulSpec spec_dq() const {
    return MatmulSpec::tile(problem_.shape.N, problem_.shape.D, problem_.shape.D, problem_.shape.D, false, problem_.shape.D, true, problem_.strides.sn);
  }

  void plan(Mode mode) const {
    if (planned_ && planned_mode_ == mode) return;
    hidden_mm_.clear();
    if (variant_ == Variant::dense) {
      hidden_mm_.add(spec_qw1());
      if (mode == Mode::fwdbwd) hidden_mm_.add(spec_dq());
      if (learning(mode)) hidden_mm_.add(spec_dw1());
    }
    core_.plan(mode, *this);
    planned_ = true;
    planned_mode_ = mode;
  }
  size_t param_floats() const {
    const auto& s = problem_.shape;
    switch (variant_) {
      case Variant::dense: return static_cast<size_t>(s.H * (s.D * s.D + s.D + s.D * max_len_ + max_len_));
      case Variant::random: return static_cast<size_t>(s.H * s.N * s.N);
      case Variant::factorized: return static_cast<size_t>(2 * s.H * s.N * k_);
    }
    return 0;
  }
  size_t hidden_floats() const { return static_cast<size_t>(problem_.shape.B * problem_.shape.H * problem_.shape.N * problem_.shape.D); }

  AttnProblem problem_;
  Variant variant_;
  int64_t max_len_, k_;
  mutable TiledSoftmax core_;
  mutable MatmulCache hidden_mm_;
  mutable bool planned_ = false;
  mutable Mode planned_mode_ = Mode::fwd;
  AttnArgs a_;
  Buffer<float> W1_, b1_, W2_, b2_, R_, R1_, R2_, hidden_, dhidden_;
  Buffer<float> grads_, partials_;  // param_grads: the gradients, and each thread's partial sums
  Buffer<std::byte> h_scratch_;
};

}  // namespace

MechanismInfo synthesizer_info() {
  MechanismInfo m;
  m.name = "synthesizer";
  m.family = "synthetic";
  m.summary = "softmax of synthesized logits: dense MLP of the query, a random matrix, or R1 R2^T";
  m.complexity = "O(N^2 D) time; memory O(N D) dense, O(H N^2) random, O(N k) factorized";
  m.caps = Capabilities{.exact = false, .causal = true, .backward = true, .decode = false,
                        .constraints = "dense: max_len >= N", .attn_dropout = true, .no_attn_dropout = "", .rope = false,
                        .no_rope = "its logits are not q·k (they come from the query alone or from a learned table), so a rotation of the keys does not reach them"};
  m.params = {ParamSpec{"variant", ParamType::Choice, std::string("dense"), 0, 0, {"dense", "random", "factorized"},
                        "how the logits are made"},
              ParamSpec{"max_len", ParamType::Int, int64_t{0}, 0, 1 << 24, {}, "dense: columns of W2 (0 = N)"},
              ParamSpec{"k", ParamType::Int, int64_t{8}, 1, 4096, {}, "factorized: rank of R1 R2^T"}};
  m.caps.no_additive_bias = "its logits do not come from (query, key) position pairs of the input but from the query alone or a learned table";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Synthesizer>(p, v); };
  m.reference = [](const Attention& impl, const AttnArgs& a, const AttnProblem& p, const ParamValues& v) {
    const std::string& variant = v.get_choice("variant");
    const int64_t N = p.shape.N;
    std::function<std::vector<double>(int64_t, int64_t)> logits;
    if (variant == "dense") {
      const DumpTensor W1 = dump_tensor(impl, "W1"), b1 = dump_tensor(impl, "b1"), W2 = dump_tensor(impl, "W2"),
                       b2 = dump_tensor(impl, "b2");
      logits = [=, q = a.q](int64_t b, int64_t h) {
        return ref::synthesizer_dense_logits(q, b, h, W1.f32, b1.f32, W2.f32, b2.f32, W2.shape[2]);
      };
    } else if (variant == "random") {
      const DumpTensor R = dump_tensor(impl, "R");
      logits = [=](int64_t, int64_t h) { return std::vector<double>(R.f32 + h * N * N, R.f32 + (h + 1) * N * N); };
    } else {
      const DumpTensor R1 = dump_tensor(impl, "R1"), R2 = dump_tensor(impl, "R2");
      logits = [=](int64_t, int64_t h) { return ref::synthesizer_factorized_logits(h, N, R1.f32, R2.f32, R1.shape[2]); };
    }
    return ref::synthesizer(a.v, p.causal, logits);
  };
  return m;
}

std::vector<double> ref::synthesizer_dense_logits(const TensorView& q, int64_t b, int64_t h, const float* W1,
                                                  const float* b1, const float* W2, const float* b2, int64_t L) {
  const int64_t N = q.shape.N, D = q.shape.D;
  std::vector<double> A(static_cast<size_t>(N * N));
  for (int64_t i = 0; i < N; ++i) {
    std::vector<double> hid(static_cast<size_t>(D));  // relu(q_i W1 + b1)
    for (int64_t o = 0; o < D; ++o) {
      double x = b1[h * D + o];
      for (int64_t c = 0; c < D; ++c) x += double(q.at(b, h, i, c)) * W1[(h * D + c) * D + o];
      hid[o] = std::max(x, 0.0);
    }
    for (int64_t j = 0; j < N; ++j) {
      double x = b2[h * L + j];
      for (int64_t o = 0; o < D; ++o) x += hid[o] * W2[(h * D + o) * L + j];
      A[i * N + j] = x;
    }
  }
  return A;
}

std::vector<double> ref::synthesizer_factorized_logits(int64_t h, int64_t N, const float* R1, const float* R2,
                                                       int64_t rank) {
  std::vector<double> A(static_cast<size_t>(N * N), 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t t = 0; t < rank; ++t) A[i * N + j] += double(R1[(h * N + i) * rank + t]) * R2[(h * N + j) * rank + t];
  return A;
}

std::vector<double> ref::synthesizer(const TensorView& v, bool causal,
                                     const std::function<std::vector<double>(int64_t b, int64_t h)>& logits) {
  const Shape4& s = v.shape;
  const int64_t N = s.N;
  std::vector<double> out(static_cast<size_t>(s.numel()));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const auto A = logits(b, h);
      for (int64_t i = 0; i < N; ++i) {
        const int64_t last = causal ? i : N - 1;
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, A[i * N + j]);
        for (int64_t j = 0; j <= last; ++j) sum += std::exp(A[i * N + j] - mx);
        for (int64_t d = 0; d < s.D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= last; ++j) o += std::exp(A[i * N + j] - mx) / sum * v.at(b, h, j, d);
          out[idx(s, b, h, i, d)] = o;
        }
      }
    }
  return out;
}

}  // namespace ab
