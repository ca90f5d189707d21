// dilated: dilated sliding-window attention (Longformer-style, no global tokens).
// Paper: Beltagy et al. 2020, "Longformer: The Long-Document Transformer".
// Complexity: O(N window D) time, O(threads * tile) extra memory.
// Computes: S(i) = { j : |i - j| = t dilation, t = 0..window }, causal i - j = t dilation.
// Optimises: queries and keys of one residue class modulo `dilation` form a subsequence (a view
//   with row stride dilation, no copy) on which the pattern is a plain band of `window`; all
//   residues of one length run as one folded segment, so no masked-out key is ever scored
//   (beyond the band's tile edges: the diagonal kernel on AVX-512, as in sliding).
// Leaves out: per-head dilation rates (the paper varies them across heads).
#include <algorithm>

#include "attention_impls/registry.hpp"
#include "attention_impls/sparse_segments.hpp"

namespace ab {
namespace {

class Dilated final : public SparseAttention {
 public:
  Dilated(const AttnProblem& p, const ParamValues& v)
      : SparseAttention(p), window_(v.get_int("window")), dilation_(v.get_int("dilation")) {}

 protected:
  std::vector<Segment> make_segments(Rng*) const override {
    // All residues of one length as one folded segment: N a multiple of d is one segment.
    std::vector<Segment> s;
    for (const RowSet& r : residue_classes(problem_.shape.N, dilation_))
      s.push_back(band(r, window_, problem_.causal ? 0 : window_, problem_.causal));
    return s;
  }

 private:
  int64_t window_, dilation_;
};

}  // namespace

MechanismInfo dilated_info() {
  MechanismInfo m;
  m.name = "dilated";
  m.family = "sparse";
  m.summary = "dilated sliding window: keys at multiples of `dilation` within `window` steps";
  m.complexity = "O(N window D) time, O(N) memory";
  m.caps = Capabilities{.exact = true, .causal = true, .backward = true, .decode = false, .constraints = "", .attn_dropout = true, .no_attn_dropout = ""};
  m.params = {ParamSpec{"window", ParamType::Int, int64_t{64}, 0, 1 << 24, {}, "steps on each side"},
              ParamSpec{"dilation", ParamType::Int, int64_t{2}, 1, 1 << 20, {}, "distance between attended keys"}};
  m.bf16 = sparse_bf16_support();
  m.caps.additive_bias = true;  // SparseAttention adds it inside every segment's tiles
  m.caps.no_additive_bias = "";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Dilated>(p, v); };
  // |i - j| a multiple of dilation, at most window steps of it.
  m.reference_mask = [](const ParamValues& v, int64_t, bool causal) {
    const int64_t w = v.get_int("window"), d = v.get_int("dilation");
    return ref::causal_and([=](int64_t i, int64_t j) { return std::abs(i - j) % d == 0 && std::abs(i - j) / d <= w; }, causal);
  };
  return m;
}

}  // namespace ab
