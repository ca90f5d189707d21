// memory_compressed: attention over keys and values compressed by a strided convolution.
// Paper: Liu et al. 2018, "Generating Wikipedia by Summarizing Long Sequences".
// Complexity: O(N D^2) for the convolutions plus O(N (N/stride) D) for the attention; memory
//   O((N/stride) D) per head plus the (stride, D, D) kernels.
// Computes: K'_t = sum_r K_{t stride + r} Wk[h, r] (kernel = stride, no bias, the last partial
//   window zero-padded), likewise V'; O = softmax(s Q K'^T) V' over ceil(N/stride) keys. Kernels
//   are Glorot-uniform, seeded, dumped as Wk, Wv (H, stride, D, D).
// Optimises: the convolution is `stride` matmuls per (batch, head), one per offset r in the
//   window, each reading every stride-th row (a strided view, no copy); the attention runs on
//   the tiled online-softmax engine.
// Leaves out: causality (a window mixes later tokens; refused as SKIPPED), the local-attention
//   half of the paper's model.
#include <omp.h>

#include <cmath>

#include "attention_impls/registry.hpp"
#include "attention_impls/tiled_softmax.hpp"

namespace ab {
namespace {

class MemoryCompressed final : public Attention {
 public:
  MemoryCompressed(const AttnProblem& p, const ParamValues& v)
      : p_(p),
        stride_(v.get_int("stride")),
        T_((p.shape.N + stride_ - 1) / stride_),
        qk_(p.shape.D, p.strides.sn, p.shape.D, 1.0f / std::sqrt(static_cast<float>(p.shape.D))),
        core_(TiledSoftmaxShape::dense(p.shape.B, p.shape.H, p.shape.N, T_, p.shape.D, false, p.shape.D,
                                p.strides.sn, p.threads)) {}

  double flops(Mode mode) const override {
    const auto& s = p_.shape;
    const double N = static_cast<double>(s.N), D = static_cast<double>(s.D);
    // Forward: two convolutions (2 N D^2 each), attention over T keys (4 N T D). Backward: the
    // attention's 10 N T D and the two transposed convolutions.
    const double conv = 4.0 * N * D * D, attn = N * static_cast<double>(T_) * D;
    const double per_head = mode == Mode::fwd ? conv + 4.0 * attn : 2.0 * conv + 14.0 * attn;
    return per_head * static_cast<double>(s.B * s.H);
  }

  size_t working_bytes(Mode mode) const override {
    plan(mode);
    return 2 * kernel_floats() * sizeof(float) + (mode == Mode::fwdbwd ? 4 : 2) * compressed_floats() * sizeof(float) +
           static_cast<size_t>(p_.threads) * conv_.scratch_per_slot() + core_.working_bytes(mode);
  }

  void setup(Mode mode, Rng& rng) override {
    plan(mode);
    const int64_t D = p_.shape.D;
    Wk_ = Buffer<float>(kernel_floats());
    Wv_ = Buffer<float>(kernel_floats());
    // Glorot uniform for a (D out, D in, stride) kernel: fan_in = fan_out = D * stride.
    const double lim = std::sqrt(6.0 / (2.0 * static_cast<double>(D * stride_)));
    rng.fill_uniform(Wk_.data(), static_cast<int64_t>(Wk_.size()), -lim, lim);
    rng.fill_uniform(Wv_.data(), static_cast<int64_t>(Wv_.size()), -lim, lim);
    Kc_ = Buffer<float>(compressed_floats());
    Vc_ = Buffer<float>(compressed_floats());
    if (mode == Mode::fwdbwd) {
      dKc_ = Buffer<float>(compressed_floats());
      dVc_ = Buffer<float>(compressed_floats());
    }
    conv_scratch_ = Buffer<std::byte>(static_cast<size_t>(p_.threads) * conv_.scratch_per_slot());
    conv_.bind(p_.threads, conv_scratch_.data());
    core_.setup(mode);
  }

  void forward(const AttnArgs& a) override {
    const auto& s = p_.shape;
    const int64_t BH = s.B * s.H;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int tid = omp_get_thread_num();
      const int64_t b = bh / s.H, h = bh % s.H;
      compress(tid, a.k.head(b, h), W(Wk_, h, 0), view(Kc_).head(b, h));
      compress(tid, a.v.head(b, h), W(Wv_, h, 0), view(Vc_).head(b, h));
    }
    qk_.bind(a.q, view(Kc_));
    core_.forward(qk_, view(Vc_), a.o);
  }

  void backward(const AttnArgs& a) override {
    const auto& s = p_.shape;
    qk_.bind(a.q, view(Kc_));
    qk_.bind_grads(a.dq, view(dKc_));
    core_.backward(qk_, view(Vc_), a.o, a.dout, view(dVc_));
    const int64_t BH = s.B * s.H;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < BH; ++bh) {
      const int tid = omp_get_thread_num();
      const int64_t b = bh / s.H, h = bh % s.H;
      decompress(tid, view(dKc_).head(b, h), W(Wk_, h, 0), a.dk.head(b, h));
      decompress(tid, view(dVc_).head(b, h), W(Wv_, h, 0), a.dv.head(b, h));
    }
  }

  std::vector<DumpTensor> dump_tensors() const override {
    const auto& s = p_.shape;
    return {DumpTensor{"Wk", {s.H, stride_, s.D, s.D}, Wk_.data(), nullptr},
            DumpTensor{"Wv", {s.H, stride_, s.D, s.D}, Wv_.data(), nullptr}};
  }

 private:
  // Window offsets that hold a token: all of them unless stride > N (one zero-padded window).
  int64_t offsets() const { return std::min(stride_, p_.shape.N); }
  // Rows t with t * stride + r < N: the windows that reach offset r.
  int64_t rows_at(int64_t r) const { return (p_.shape.N - r + stride_ - 1) / stride_; }
  // X'(rows, D) (+)= X[r::stride](rows, D) W[r](D, D)
  MatmulSpec spec_conv(int64_t rows, bool acc) const {
    return MatmulSpec::tile(rows, p_.shape.D, p_.shape.D, stride_ * p_.strides.sn, false, p_.shape.D, false,
                            p_.shape.D, 1.0f, acc);
  }
  // dX[r::stride](rows, D) = dX'(rows, D) W[r]^T
  MatmulSpec spec_deconv(int64_t rows) const {
    return MatmulSpec::tile(rows, p_.shape.D, p_.shape.D, p_.shape.D, false, p_.shape.D, true,
                            stride_ * p_.strides.sn);
  }
  void compress(int tid, const float* X, const float* Wh, float* Xc) const {
    for (int64_t r = 0; r < offsets(); ++r)
      conv_.run(tid, spec_conv(rows_at(r), r > 0), X + r * p_.strides.sn, Wh + r * p_.shape.D * p_.shape.D, Xc);
  }
  void decompress(int tid, const float* dXc, const float* Wh, float* dX) const {
    for (int64_t r = 0; r < offsets(); ++r)
      conv_.run(tid, spec_deconv(rows_at(r)), dXc, Wh + r * p_.shape.D * p_.shape.D, dX + r * p_.strides.sn);
  }
  void plan(Mode mode) const {
    if (planned_ && planned_mode_ == mode) return;
    conv_.clear();
    for (int64_t r = 0; r < offsets(); ++r) {
      conv_.add(spec_conv(rows_at(r), r > 0));
      if (mode == Mode::fwdbwd) conv_.add(spec_deconv(rows_at(r)));
    }
    core_.plan(mode, qk_);
    planned_ = true;
    planned_mode_ = mode;
  }
  size_t kernel_floats() const { return static_cast<size_t>(p_.shape.H * stride_ * p_.shape.D * p_.shape.D); }
  size_t compressed_floats() const { return static_cast<size_t>(p_.shape.B * p_.shape.H * T_ * p_.shape.D); }
  TensorView view(const Buffer<float>& buf) const {
    const Shape4 s{p_.shape.B, p_.shape.H, T_, p_.shape.D};
    return TensorView{buf.data(), s, Strides3::contiguous(s)};
  }
  const float* W(const Buffer<float>& w, int64_t h, int64_t r) const {
    return w.data() + (h * stride_ + r) * p_.shape.D * p_.shape.D;
  }

  AttnProblem p_;
  int64_t stride_, T_;
  QKLogits qk_;
  mutable TiledSoftmax core_;
  mutable MatmulCache conv_;
  mutable bool planned_ = false;
  mutable Mode planned_mode_ = Mode::fwd;
  Buffer<float> Wk_, Wv_, Kc_, Vc_, dKc_, dVc_;
  Buffer<std::byte> conv_scratch_;
};

}  // namespace

MechanismInfo memory_compressed_info() {
  MechanismInfo m;
  m.name = "memory_compressed";
  m.family = "low-rank";
  m.summary = "softmax over keys/values compressed by a strided convolution (kernel = stride)";
  m.complexity = "O(N D^2 + N^2 D / stride) time, O(N D / stride) memory";
  m.caps = Capabilities{.exact = false, .causal = false, .backward = true, .decode = false,
                        .constraints = ""};
  m.params = {ParamSpec{"stride", ParamType::Int, int64_t{3}, 1, 4096, {}, "convolution kernel size and stride"}};
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<MemoryCompressed>(p, v); };
  return m;
}

}  // namespace ab
