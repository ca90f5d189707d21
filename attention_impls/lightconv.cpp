// lightconv: lightweight convolution in the place of attention.
// Paper: Wu, Fan, Baevski, Dauphin, Auli 2019, "Pay Less Attention with Lightweight and Dynamic
//   Convolutions" (reference code: fairseq's modules/lightweight_convolution.py).
// Computes: O_i = sum_t softmax(theta_h)_t V_{i - pad + t}, a depthwise 1-D convolution of width
//   `kernel` along the sequence, one softmax-normalised kernel per head shared by the head's D
//   channels; causal by left padding (pad = K - 1), else centred (pad = (K - 1) / 2), zeros
//   outside the sequence. theta (H, K) is learned (Xavier-uniform init, as fairseq). The mixed
//   input is V; Q and K are not used (softmax_conv.hpp says why).
// Complexity: O(N K D) time, O(H K) memory beyond the inputs; decode O(K D) time and state per
//   head, whatever the context: no N^2 term anywhere.
// Optimises: each output row is a weighted sum of the K rows of V it reaches, accumulated 64
//   columns at a time in registers (eight independent FMA chains) and stored once; the padding
//   taps are skipped rather than multiplied by zero; the kernel's softmax once per call. 0.41-0.46
//   of the one-thread GEMM rate (docs/measurements/convolutions.md).
// Backward: dV the same way over the transposed taps (rows of dO); the kernel's gradient (dot
//   products of dO and V rows, then the softmax's backward) only when parameters are trained,
//   summed per thread in a fixed order. dQ = dK = 0.
// Decode: a ring of the last K rows of V per head; a step is O(K D) time and its state K D floats
//   per head, whatever the context.
// Leaves out: fairseq's DropConnect on the kernel (weight_dropout), its GLU input projection and
//   output projection (the model's own projections stand in), the CUDA kernels' band layouts.
//   It is a mixer, not attention: no logits per (query, key) pair, so no attention dropout, RoPE
//   or additive position encodings, and on associative recall it is the negative control (it
//   sees K positions back and cannot look anything up by content). No bf16 path: the convolution is
//   its own float FMA loop (K rows weighted per output row), not a product the engine has a bf16
//   form of, so a bf16 training step runs it in float32.
#include "attention_impls/softmax_conv.hpp"

namespace ab {

MechanismInfo lightconv_info() {
  return softmax_conv_info("lightconv", "lightweight convolution: V mixed by a softmax-normalised kernel of width K per head",
                           "O(N K D) time, O(H K) memory; decode O(K D) per token", false);
}

}  // namespace ab
