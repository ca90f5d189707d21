// longformer: sliding window plus global tokens.
// Paper: Beltagy et al. 2020, "Longformer: The Long-Document Transformer".
// Complexity: O(N (window + global) D) time, O(N) extra memory.
// Computes: the (optionally dilated) sliding window, plus the first `global` positions G: a
//   global query attends every key, every query attends every global key. Not causal (global
//   tokens see ahead).
// Optimises: disjoint segments: global queries over all keys (a dense strip), the other
//   queries over the global keys (a dense strip) and over the non-global keys of their window
//   (one band per residue of the dilation, as views). On AVX-512 the bands run the diagonal
//   kernel with the global keys inside it (fuse_prefix_keys): one pass over the output rows;
//   the global keys' strip then serves the backward pass only.
// Leaves out: separate projections for global attention (the paper's Q_g, K_g, V_g): the same
//   Q, K, V serve both, as mechanisms.md defines it.
#include <algorithm>

#include "attention_impls/registry.hpp"
#include "attention_impls/sparse_segments.hpp"

namespace ab {
namespace {

class Longformer final : public SparseAttention {
 public:
  Longformer(const AttnProblem& p, int64_t window, int64_t dilation, int64_t global)
      : SparseAttention(p), window_(window), dilation_(dilation), global_(global) {}

 protected:
  std::vector<Segment> make_segments(Rng*) const override {
    const int64_t N = problem_.shape.N, g = std::min(global_, N), d = dilation_;
    std::vector<Segment> s;
    if (g > 0) s.push_back(dense(rows(0, g), rows(0, N)));  // global queries
    if (N > g) {
      bool fused = g > 0;
      for (int64_t r = 0; r < std::min(d, N - g); ++r) {  // the window over non-global keys
        Segment w = band(rows(g + r, (N - g - r + d - 1) / d, d), window_, window_, false);
        // With attention dropout, no diagonal kernel, so no global keys inside the bands.
        fused = fused && !problem_.attn_dropout && !problem_.bias.active() && fuse_prefix_keys(w, g, problem_.shape.D);
        s.push_back(std::move(w));
      }
      if (!fused)  // some band cannot hold the global keys: none does
        for (auto& seg : s) seg.prefix_keys = 0;
      if (g > 0) {  // global keys
        s.push_back(dense(rows(g, N - g), rows(0, g)));
        s.back().backward_only = fused;
      }
    }
    return s;
  }

 private:
  int64_t window_, dilation_, global_;
};

}  // namespace

std::unique_ptr<Attention> make_global_window(const AttnProblem& p, int64_t window, int64_t dilation, int64_t global) {
  return std::make_unique<Longformer>(p, window, dilation, global);
}

MechanismInfo longformer_info() {
  MechanismInfo m;
  m.name = "longformer";
  m.family = "sparse";
  m.summary = "sliding window (optionally dilated) + the first `global` tokens attending and attended globally";
  m.complexity = "O(N (window + global) D) time, O(N) memory";
  m.caps = Capabilities{.exact = true, .causal = false, .backward = true, .decode = false, .constraints = "", .attn_dropout = true, .no_attn_dropout = ""};
  m.params = {ParamSpec{"window", ParamType::Int, int64_t{64}, 0, 1 << 24, {}, "one-sided window (in steps)"},
              ParamSpec{"dilation", ParamType::Int, int64_t{1}, 1, 1 << 20, {}, "distance between window keys"},
              ParamSpec{"global", ParamType::Int, int64_t{16}, 0, 1 << 24, {}, "number of leading global tokens"}};
  m.bf16 = sparse_bf16_support();
  m.caps.additive_bias = true;  // SparseAttention adds it inside every segment's tiles
  m.caps.no_additive_bias = "";
  m.make = [](const AttnProblem& p, const ParamValues& v) {
    return make_global_window(p, v.get_int("window"), v.get_int("dilation"), v.get_int("global"));
  };
  // The first `global` tokens attend and are attended by every token; the others their dilated
  // window.
  m.reference_mask = [](const ParamValues& v, int64_t, bool causal) {
    const int64_t w = v.get_int("window"), d = v.get_int("dilation"), g = v.get_int("global");
    return ref::causal_and(
        [=](int64_t i, int64_t j) { return i < g || j < g || (std::abs(i - j) % d == 0 && std::abs(i - j) / d <= w); }, causal);
  };
  return m;
}

}  // namespace ab
