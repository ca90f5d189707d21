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
// bf16 (--dtype bf16): the kernels (once at setup; training: every forward call), K and V rounded to
//   bf16, the convolutions oneDNN bf16 matmuls with float output, the attention in the engine's
//   bf16 dense kernel. Backward: the attention over the compressed keys in the engine's bf16
//   tiles; the convolutions' backward products (dK, dV and the kernels' gradients) bf16 too, over
//   dK', dV' and (for the kernels) K, V rounded per head, with float output.
// Training: the kernels are learned (their gradients with param_grads, summed over the batch).
// Leaves out: causality (a window mixes later tokens; refused as SKIPPED), the local-attention
//   half of the paper's model.
#include <algorithm>
#include <cmath>

#include "attention_impls/registry.hpp"
#include "attention_impls/reduced_keys.hpp"

namespace ab {
namespace {

class MemoryCompressed final : public ReducedKeysAttention {
 public:
  MemoryCompressed(const AttnProblem& p, const ParamValues& v)
      // Glorot uniform for a (D out, D in, stride) kernel: fan_in = fan_out = D * stride.
      : ReducedKeysAttention(p, (p.shape.N + v.get_int("stride") - 1) / v.get_int("stride"),
                             v.get_int("stride") * p.shape.D * p.shape.D,
                             std::sqrt(6.0 / (2.0 * static_cast<double>(p.shape.D * v.get_int("stride")))), false),
        stride_(v.get_int("stride")) {}

  double flops(Mode mode) const override {
    const auto& s = problem_.shape;
    const double N = static_cast<double>(s.N), D = static_cast<double>(s.D);
    // Forward: two convolutions (2 N D^2 each), attention over T keys (4 N T D). Backward: the
    // attention's 10 N T D and the two transposed convolutions.
    const double conv = 4.0 * N * D * D, attn = N * static_cast<double>(Nk_) * D;
    const double per_head = mode == Mode::fwd ? conv + 4.0 * attn : 2.0 * conv + 14.0 * attn;
    return per_head * static_cast<double>(s.B * s.H) + param_grad_flops(mode);
  }

  std::vector<DumpTensor> dump_tensors() const override {
    const auto& s = problem_.shape;
    return map_tensors("Wk", "Wv", {stride_, s.D, s.D});
  }

 protected:
  void plan_maps(MatmulCache& mm, Mode mode) const override {
    for (int64_t r = 0; r < offsets(); ++r) {
      mm.add(spec_conv(rows_at(r), r > 0));
      if (mode == Mode::fwdbwd) mm.add(spec_deconv(rows_at(r)));
      if (mode == Mode::fwdbwd && problem_.param_grads)
        for (bool acc : {false, true}) mm.add(spec_kernel_grad(rows_at(r), acc));
    }
  }
  const char* mechanism() const override { return "memory_compressed"; }
  std::pair<const char*, const char*> map_names() const override { return {"Wk", "Wv"}; }
  // dW[r] (+)= X[r::stride]^T dX': (D, rows) x (rows, D), per window offset r; in a bf16 call
  // bf16 products (the base rounds X, rows contiguous, and dX').
  void map_backward(const MatmulCache& mm, int tid, const void* X, const void* dXr, float* dMap,
                    bool accumulate) const override {
    for (int64_t r = 0; r < offsets(); ++r)
      mm.run(tid, spec_kernel_grad(rows_at(r), accumulate), input_row(X, r), dXr, dMap + r * problem_.shape.D * problem_.shape.D);
  }
  double map_backward_flops() const override {
    const double D = static_cast<double>(problem_.shape.D);
    return 2.0 * static_cast<double>(problem_.shape.N) * D * D;
  }
  // X'(t) = sum_r X(t stride + r) W[h, r]: one product per window offset r over the rows
  // r, r + stride, ... (a view with row stride `stride`).
  void reduce(const MatmulCache& mm, int tid, int64_t h, Which which, const void* X, float* Xr) const override {
    const void* W = input_map(h, which);
    for (int64_t r = 0; r < offsets(); ++r)
      mm.run(tid, spec_conv(rows_at(r), r > 0), input_row(X, r), input_at(W, r * problem_.shape.D * problem_.shape.D), Xr);
  }
  // dX(t stride + r) = dX'(t) W[h, r]^T (bf16 call: dX' and W as bf16 numbers)
  void expand(const MatmulCache& mm, int tid, int64_t h, Which which, const void* dXr, float* dX) const override {
    const void* W = input_map(h, which);
    for (int64_t r = 0; r < offsets(); ++r)
      mm.run(tid, spec_deconv(rows_at(r)), dXr, input_at(W, r * problem_.shape.D * problem_.shape.D), dX + r * problem_.strides.sn);
  }

 private:
  // Window offsets that hold a token: all of them unless stride > N (one zero-padded window).
  int64_t offsets() const { return std::min(stride_, problem_.shape.N); }
  // Rows t with t * stride + r < N: the windows that reach offset r.
  int64_t rows_at(int64_t r) const { return (problem_.shape.N - r + stride_ - 1) / stride_; }
  // X'(rows, D) (+)= X[r::stride](rows, D) W[r](D, D)
  MatmulSpec spec_conv(int64_t rows, bool acc) const {
    return with_input_type(MatmulSpec::tile(rows, problem_.shape.D, problem_.shape.D, stride_ * ld_input(), false, problem_.shape.D,
                                            false, problem_.shape.D, 1.0f, acc));
  }
  // dW[r](D, D) (+)= X[r::stride](rows, D)^T dX'(rows, D)
  MatmulSpec spec_kernel_grad(int64_t rows, bool acc) const {
    return with_input_type(MatmulSpec::tile(problem_.shape.D, problem_.shape.D, rows, stride_ * ld_input(), true, problem_.shape.D, false,
                                            problem_.shape.D, 1.0f, acc));
  }
  // dX[r::stride](rows, D) = dX'(rows, D) W[r]^T
  MatmulSpec spec_deconv(int64_t rows) const {
    return with_input_type(MatmulSpec::tile(rows, problem_.shape.D, problem_.shape.D, problem_.shape.D, false, problem_.shape.D, true,
                                            stride_ * problem_.strides.sn));
  }
  int64_t stride_;
};

}  // namespace

MechanismInfo memory_compressed_info() {
  MechanismInfo m;
  m.name = "memory_compressed";
  m.family = "low-rank";
  m.summary = "softmax over keys/values compressed by a strided convolution (kernel = stride)";
  m.complexity = "O(N D^2 + N^2 D / stride) time, O(N D / stride) memory";
  m.caps = Capabilities{.exact = false, .causal = false, .backward = true, .decode = false,
                        .constraints = "", .attn_dropout = true, .no_attn_dropout = ""};
  m.bf16 = Bf16Support{.available = true,
                       .constraints = "forward and backward (the kernels' backward products too), with attention "
                                      "dropout (then in bf16 tiles, not the dense kernel); D of 16, 32, 64 or 128",
                       .backward = true,
                       .attn_dropout = true};
  m.params = {ParamSpec{"stride", ParamType::Int, int64_t{3}, 1, 4096, {}, "convolution kernel size and stride"}};
  m.caps.no_additive_bias = "its keys are strided convolutions over several positions, so a logit has no single key position to take an offset from";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<MemoryCompressed>(p, v); };
  m.reference = [](const Attention& impl, const AttnArgs& a, const AttnProblem&, const ParamValues& v) {
    return ref::memory_compressed(a.q, a.k, a.v, dump_tensor(impl, "Wk").f32, dump_tensor(impl, "Wv").f32,
                                  v.get_int("stride"));
  };
  return m;
}

std::vector<double> ref::memory_compressed(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const float* Wk, const float* Wv, int64_t stride) {
  const Shape4& s = q.shape;
  const int64_t N = s.N, D = s.D, T = (N + stride - 1) / stride;
  std::vector<double> out(static_cast<size_t>(s.numel()));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      // K'_t = sum_r K_{t stride + r} Wk[h, r], likewise V': (T, D) each
      Rows kc(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(D), 0.0)), vc = kc;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < stride; ++r) {
          const int64_t row = t * stride + r;
          if (row >= N) continue;  // the last window's zero padding
          for (int64_t i = 0; i < D; ++i)
            for (int64_t o = 0; o < D; ++o) {
              const int64_t w = ((h * stride + r) * D + i) * D + o;
              kc[t][o] += double(k.at(b, h, row, i)) * Wk[w];
              vc[t][o] += double(v.at(b, h, row, i)) * Wv[w];
            }
        }
      put_head(out, s, b, h, attend(q, b, h, kc, vc));
    }
  return out;
}

}  // namespace ab
