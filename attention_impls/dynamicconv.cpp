// dynamicconv: dynamic convolution in the place of attention.
// Paper: Wu, Fan, Baevski, Dauphin, Auli 2019, "Pay Less Attention with Lightweight and Dynamic
//   Convolutions" (reference code: fairseq's modules/dynamic_convolution.py).
// Computes: O_i = sum_t softmax(q_i W_h + b_h)_t V_{i - pad + t}: lightconv whose kernel is
//   predicted at every position from that position's query row (W (H, D, K) Xavier-uniform, b
//   (H, K) zero, as fairseq's weight_linear), the K taps softmax-normalised; causal by left
//   padding, else centred. The mixed input is V; K is not used (softmax_conv.hpp says why q_i
//   stands for fairseq's layer input).
// Complexity: O(N K D) time (the predictor Q W is 2 N D K, the convolution 2 N K D), O(N K)
//   memory per head for the kernels kept for the backward pass; decode O(K D) per token.
// Optimises: the predictor and its gradients are oneDNN products (Q W, dL W^T, Q^T dL); the
//   convolution accumulates each output row in registers over its taps inside the sequence, as
//   lightconv.
// Backward: dV over the transposed taps; g = dO_i . V_j per tap; the softmax's backward per row
//   gives dL; dQ = dL W^T; with parameter gradients dW = Q^T dL and db = the column sums of dL,
//   summed per thread in a fixed order. dK = 0.
// Decode: the ring of the last K rows of V per head, the new position's kernel from its query
//   row: O(K D) time and K D floats of state per head, whatever the context.
// Leaves out: DropConnect on the predicted kernels, fairseq's GLU and output projections, its
//   "unfold" and band-matrix variants (same function, other memory layouts). Not attention: no
//   pairwise logits, so no attention dropout, RoPE or additive position encodings. No bf16 path
//   (as lightconv's: its own float loop), so a bf16 training step runs it in float32.
#include "attention_impls/softmax_conv.hpp"

namespace ab {

MechanismInfo dynamicconv_info() {
  return softmax_conv_info("dynamicconv", "dynamic convolution: V mixed by a softmax kernel of width K predicted from each query",
                           "O(N K D) time, O(N K) memory; decode O(K D) per token", true);
}

}  // namespace ab
