// local: blocked local attention.
// Paper: the local attention of Parmar et al. 2018 ("Image Transformer") and Child et al. 2019,
//   as benchmarked by Long Range Arena.
// Complexity: O(N (lookback + lookahead + 1) block D) time, O(threads * tile) extra memory.
// Computes: the sequence in blocks of `block` (the last may be shorter); a query in block b
//   attends every key of blocks b - lookback .. b + lookahead; causal forces lookahead = 0 and
//   masks later keys.
// Optimises: one segment on the sparse core: each query block of 32 to 128 rows is one score
//   tile of its whole window (64 x 192 at the defaults), so no key outside the window is scored
//   and only causal tiles are masked.
// Decode: against a ring cache of (lookback + 1) blocks: constant time and memory per token.
// Leaves out: memory-efficient overlap between neighbouring windows (each query tile recomputes
//   its own window's scores, as in the definition).
#include <algorithm>

#include "attention_impls/registry.hpp"
#include "attention_impls/sparse_segments.hpp"

namespace ab {
namespace {

class Local final : public SparseAttention {
 public:
  Local(const AttnProblem& p, const ParamValues& v)
      : SparseAttention(p), block_(v.get_int("block")), back_(v.get_int("lookback")),
        ahead_(p.causal ? 0 : v.get_int("lookahead")) {}

 protected:
  // Causal: the query's block and `lookback` blocks before it, up to the query.
  int64_t window_capacity() const override { return (back_ + 1) * block_; }
  std::pair<int64_t, int64_t> window_keys(int64_t pos) const override {
    return {std::max<int64_t>(0, (pos / block_ - back_) * block_), pos + 1};
  }

  std::vector<Segment> make_segments(Rng*) const override {
    std::vector<Segment> s;
    s.push_back(block_band(rows(0, problem_.shape.N), block_, back_, ahead_, problem_.causal));
    return s;
  }

 private:
  int64_t block_, back_, ahead_;
};

}  // namespace

MechanismInfo local_info() {
  MechanismInfo m;
  m.name = "local";
  m.family = "sparse";
  m.summary = "blocked local attention: each query block attends blocks b-lookback .. b+lookahead";
  m.complexity = "O(N block D) time, O(N) memory";
  m.caps = Capabilities{.exact = true, .causal = true, .backward = true, .decode = true, .constraints = "", .attn_dropout = true, .no_attn_dropout = ""};
  m.params = {ParamSpec{"block", ParamType::Int, int64_t{64}, 1, 1 << 20, {}, "block length"},
              ParamSpec{"lookback", ParamType::Int, int64_t{1}, 0, 1 << 20, {}, "earlier blocks attended"},
              ParamSpec{"lookahead", ParamType::Int, int64_t{1}, 0, 1 << 20, {}, "later blocks attended (0 when causal)"}};
  m.bf16 = sparse_bf16_support();
  m.caps.additive_bias = true;  // SparseAttention adds it inside every segment's tiles
  m.caps.no_additive_bias = "";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Local>(p, v); };
  // Query i and key j in blocks i / block and j / block, lookback before to lookahead after.
  m.reference_mask = [](const ParamValues& v, int64_t, bool causal) {
    const int64_t L = v.get_int("block"), back = v.get_int("lookback"), ahead = causal ? 0 : v.get_int("lookahead");
    return ref::causal_and([=](int64_t i, int64_t j) { return j / L >= i / L - back && j / L <= i / L + ahead; }, causal);
  };
  return m;
}

}  // namespace ab
