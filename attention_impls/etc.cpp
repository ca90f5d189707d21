// etc: Extended Transformer Construction, global-local attention.
// Paper: Ainslie, Ontanon, Alberti, Cvicek, Fisher, Pham, Ravula, Sanghai, Wang, Yang 2020,
//   "ETC: Encoding Long and Structured Inputs in Transformers" (reference code:
//   google-research/google-research etcmodel/layers/attention.py, FusedGlobalLocalAttention).
// Computes: two inputs, a long one of N tokens and a global one of g = `global` extra tokens
//   whose content embeddings are learned (they are not input tokens). Four pieces of attention
//   share one softmax per query: long-to-long within `radius` positions on each side, long-to-
//   global, global-to-long and global-to-global in full. The model prepends the global tokens
//   (MechanismInfo::prepended_tokens): the mechanism sees them as the first g rows of Q, K and V,
//   and each layer's global outputs are the next layer's global inputs, so information travels
//   long -> global -> long across layers. At the attention level (`run --level attn`) the first
//   g of the N rows play the global tokens. Absolute positions apply to the long tokens only.
// Complexity: O((N - g) (2r + 1 + g) D + g N D) time, O(N D) memory: linear in N at fixed r, g.
// Optimises: the pieces are Longformer's segments with dilation 1 (sparse_segments.hpp): the
//   global queries' dense strip, the band with the global keys fused into its diagonal kernel,
//   so one pass over the output rows; backward through the same segments.
// Leaves out: ETC's structured inputs (hard global-to-long masks, one global token per sentence),
//   its separate relative-position vocabulary per piece (the suite's --positions shaw, bias and
//   alibi apply one distance-based term to every pair, distances counted over the g + N rows),
//   CPC pre-training, and separate projections for the global tokens (ETC's default shares
//   them, as here). Not causal: global tokens see the whole sequence, and `list` says so.
#include "attention_impls/registry.hpp"
#include "attention_impls/sparse_segments.hpp"

namespace ab {

MechanismInfo etc_info() {
  MechanismInfo m;
  m.name = "etc";
  m.family = "sparse";
  m.summary = "ETC: `global` learned extra tokens attending and attended fully + long-to-long within `radius`, one softmax";
  m.complexity = "O(N (2 radius + 1 + global) D) time, O(N D) memory";
  // Not causal: the global tokens attend to and are attended by the whole sequence.
  m.caps = Capabilities{.exact = true, .causal = false, .backward = true, .decode = false, .constraints = "",
                        .attn_dropout = true, .no_attn_dropout = ""};
  // radius 64 (the paper's 84 is for 4,096-token documents): the window of the suite's
  // longformer and sliding defaults, so at default parameters the three differ only in their
  // global tokens; 2r + 1 = 129 keys a row fit the band kernel's tiles.
  m.params = {ParamSpec{"radius", ParamType::Int, int64_t{64}, 0, 1 << 24, {}, "long-to-long reach on each side (in tokens)"},
              ParamSpec{"global", ParamType::Int, int64_t{16}, 0, 1 << 20, {},
                        "learned global tokens the model prepends (the first rows at the attention level)"}};
  m.bf16 = sparse_bf16_support();
  m.caps.additive_bias = true;
  m.caps.no_additive_bias = "";
  m.prepended_tokens = [](const ParamValues& v) { return v.get_int("global"); };
  m.make = [](const AttnProblem& p, const ParamValues& v) {
    return make_global_window(p, v.get_int("radius"), 1, v.get_int("global"));
  };
  // The first `global` rows are the global tokens: they attend and are attended by every token;
  // the long tokens attend each other within radius.
  m.reference_mask = [](const ParamValues& v, int64_t, bool causal) {
    const int64_t r = v.get_int("radius"), g = v.get_int("global");
    return ref::causal_and([=](int64_t i, int64_t j) { return i < g || j < g || std::abs(i - j) <= r; }, causal);
  };
  return m;
}

}  // namespace ab
