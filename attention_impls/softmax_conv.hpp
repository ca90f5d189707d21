// The engine of lightconv and dynamicconv (Wu et al. 2019, "Pay Less Attention with Lightweight
// and Dynamic Convolutions"): a depthwise 1-D convolution along the sequence whose taps are
// softmax-normalised, one kernel per head shared by the head's D channels, mixing the rows of V.
//
//   O_i = sum_{t=0}^{K-1} w_{i,t} V_{i - pad + t}      (rows outside [0, N) are zero)
//   pad = K - 1 when causal (the window ends at i), (K - 1) / 2 otherwise (centred, fairseq's
//   encoder padding: K / 2 for an odd K).
//   lightconv:   w_{i,t} = softmax_t(theta_h)                  theta (H, K), learned
//   dynamicconv: w_{i,t} = softmax_t(q_i W_h + b_h)            W (H, D, K), b (H, K), learned
//
// What the mechanism interface's Q, K, V become: V is the convolution's input (fairseq convolves
// the block's input after its projection, which is what V is); dynamicconv predicts each
// position's kernel from q_i, the query row of that position (fairseq reads the layer's input
// x_i through one Linear(C, H K); q_i W_h = x_i (W_q,h W_h) is the same map with rank at most
// D per head, which is no restriction while K <= D). K is not used by either.
#pragma once
#include <memory>
#include <string>

#include "attention_impls/attention.hpp"

namespace ab {

std::unique_ptr<Attention> make_softmax_conv(const AttnProblem& p, int64_t kernel, bool dynamic);

// What lightconv and dynamicconv share in the registry: their family, capabilities (and the
// reasons for what they refuse), the `kernel` parameter and the constructor; the caller names
// the mechanism and says what it computes.
MechanismInfo softmax_conv_info(const std::string& name, const std::string& summary, const std::string& complexity,
                                bool dynamic);

// The taps the convolution computes over one sequence: sum over t of the rows i with
// 0 <= i - pad + t < N (padding taps are skipped, so they are not counted either).
double softmax_conv_taps(int64_t N, int64_t kernel, bool causal);

}  // namespace ab
