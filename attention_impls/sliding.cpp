// sliding: sliding-window (banded) attention.
// Paper: the band of Beltagy et al. 2020 ("Longformer") without global tokens.
// Complexity: O(N window D) time, O(threads * tile) extra memory.
// Computes: S(i) = { j : |i - j| <= window }, causal 0 <= i - j <= window.
// Optimises: one banded segment on the sparse core. On AVX-512 the diagonal kernel scores each
//   16 queries over the 16 + 2 window keys their rows use (144 for 129 at window 64); elsewhere
//   each block of 48 queries is one oneDNN product with the 48 + 2 window keys of its rows.
// Decode: against a ring cache of the last window + 1 tokens: constant time and memory per token.
// Leaves out: nothing of the definition.
#include <algorithm>

#include "attention_impls/registry.hpp"
#include "attention_impls/sparse_segments.hpp"

namespace ab {
namespace {

class Sliding final : public SparseAttention {
 public:
  Sliding(const AttnProblem& p, const ParamValues& v) : SparseAttention(p), window_(v.get_int("window")) {}

 protected:
  int64_t window_capacity() const override { return window_ + 1; }
  std::pair<int64_t, int64_t> window_keys(int64_t pos) const override {
    return {std::max<int64_t>(0, pos - window_), pos + 1};
  }

  std::vector<Segment> make_segments(Rng*) const override {
    std::vector<Segment> s;
    s.push_back(band(rows(0, problem_.shape.N), window_, problem_.causal ? 0 : window_, problem_.causal));
    return s;
  }

 private:
  int64_t window_;
};

}  // namespace

MechanismInfo sliding_info() {
  MechanismInfo m;
  m.name = "sliding";
  m.family = "sparse";
  m.summary = "sliding-window attention: keys within `window` positions of the query";
  m.complexity = "O(N window D) time, O(N) memory";
  m.caps = Capabilities{.exact = true, .causal = true, .backward = true, .decode = true, .constraints = "", .attn_dropout = true, .no_attn_dropout = ""};
  m.params = {ParamSpec{"window", ParamType::Int, int64_t{64}, 0, 1 << 24, {}, "one-sided window"}};
  m.bf16 = sparse_bf16_support();
  m.caps.additive_bias = true;  // SparseAttention adds it inside every segment's tiles
  m.caps.no_additive_bias = "";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Sliding>(p, v); };
  // |i - j| <= window.
  m.reference_mask = [](const ParamValues& v, int64_t, bool causal) {
    const int64_t w = v.get_int("window");
    return ref::causal_and([=](int64_t i, int64_t j) { return std::abs(i - j) <= w; }, causal);
  };
  return m;
}

}  // namespace ab
