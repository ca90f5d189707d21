// strided: the Sparse Transformer's factorised patterns.
// Paper: Child et al. 2019, "Generating Long Sequences with Sparse Transformers".
// Complexity: O(N (l + N/l) D) time (O(N sqrt(N) D) at l = sqrt(N)), O(N) extra memory.
// Computes, with stride l (`stride`, 0 means round(sqrt(N))):
//   pattern=strided: S(i) = { |i - j| < l } u { (i - j) mod l = 0 };
//   pattern=fixed:   S(i) = { floor(j/l) = floor(i/l) } u { j mod l >= l - c }, c = `summary`;
//   causal keeps j <= i.
// Optimises: the union is split into disjoint segments: for strided, the band |i - j| < l and
//   the query's residue class modulo l without the query (all residues at once as a folded view
//   with row stride l, no copy; the engine drops the diagonal); for fixed, the query's block and
//   the summary columns of the other blocks (gathered once per call). No masked-out pair is scored outside tile edges.
// Leaves out: the paper's per-head split of the two halves (here every head attends the union).
#include <cmath>

#include "attention_impls/registry.hpp"
#include "attention_impls/sparse_segments.hpp"

namespace ab {
namespace {

class Strided final : public SparseAttention {
 public:
  Strided(const AttnProblem& p, const ParamValues& v)
      : SparseAttention(p),
        fixed_(v.get_choice("pattern") == "fixed"),
        l_(v.get_int("stride") == 0 ? std::max<int64_t>(1, std::llround(std::sqrt(double(p.shape.N)))) : v.get_int("stride")),
        c_(v.get_int("summary")) {}

  void validate() const override {
    if (fixed_ && c_ > l_)
      throw InvalidInput("strided: summary=" + std::to_string(c_) + " exceeds stride=" + std::to_string(l_));
  }

 protected:
  std::vector<Segment> make_segments(Rng* rng) const override {
    return fixed_ ? fixed_segments(rng != nullptr) : strided_segments();
  }

 private:
  std::vector<Segment> strided_segments() const {
    const int64_t N = problem_.shape.N, l = l_;
    std::vector<Segment> s;
    // The band with the query itself: |i - j| < l (causal: 0 <= i - j < l), one tight band.
    s.push_back(band(rows(0, N), l - 1, problem_.causal ? 0 : l - 1, problem_.causal));
    // The residue class of the query without the query itself (the band has it): all residues
    // as one folded segment per residue length, each a dense (or causal) attention.
    for (const RowSet& r : residue_classes(N, l)) {
      Segment res;
      res.queries = res.keys = r;
      res.causal = problem_.causal;
      res.exclude_self = true;
      s.push_back(std::move(res));
    }
    return s;
  }

  std::vector<Segment> fixed_segments(bool with_index) const {
    const int64_t N = problem_.shape.N, l = l_, c = c_, H = problem_.shape.H;
    std::vector<Segment> s;
    s.push_back(block_band(rows(0, N), l, 0, 0, problem_.causal));
    // Summary rows j with j mod l >= l - c, in order: block b's start at index b * c.
    std::vector<int64_t> summary;
    for (int64_t j = 0; j < N; ++j)
      if (j % l >= l - c) summary.push_back(j);
    const int64_t nk = static_cast<int64_t>(summary.size());
    if (nk == 0) return s;
    auto summaries = [&](KeyRangeFn range) {
      Segment g;
      g.queries = rows(0, N);
      g.keys = rows(0, nk);
      g.gathered = true;
      if (with_index) {
        g.gather = Buffer<int64_t>(static_cast<size_t>(H * nk));
        for (int64_t h = 0; h < H; ++h)
          for (int64_t u = 0; u < nk; ++u) g.gather[static_cast<size_t>(h * nk + u)] = summary[static_cast<size_t>(u)];
      }
      g.range = std::move(range);
      s.push_back(std::move(g));
    };
    // Other blocks' summaries: earlier blocks, and (non-causal) later ones.
    summaries([l, c](int64_t t) { return std::pair<int64_t, int64_t>{0, t / l * c}; });
    if (!problem_.causal) summaries([l, c, nk](int64_t t) { return std::pair<int64_t, int64_t>{(t / l + 1) * c, nk}; });
    return s;
  }

  bool fixed_;
  int64_t l_, c_;
};

}  // namespace

MechanismInfo strided_info() {
  MechanismInfo m;
  m.name = "strided";
  m.family = "sparse";
  m.summary = "Sparse Transformer: local band + every l-th key (strided), or block + summary columns (fixed)";
  m.complexity = "O(N sqrt(N) D) time at l = sqrt(N), O(N) memory";
  m.caps = Capabilities{.exact = true, .causal = true, .backward = true, .decode = false,
                        .constraints = "fixed: summary <= stride", .attn_dropout = true, .no_attn_dropout = ""};
  m.params = {ParamSpec{"pattern", ParamType::Choice, std::string("strided"), 0, 0, {"strided", "fixed"}, "which factorisation"},
              ParamSpec{"stride", ParamType::Int, int64_t{64}, 0, 1 << 20, {}, "stride l (0: round(sqrt(N)))"},
              ParamSpec{"summary", ParamType::Int, int64_t{8}, 1, 1 << 20, {}, "fixed: summary columns c per block"}};
  m.bf16 = sparse_bf16_support();
  m.caps.additive_bias = true;  // SparseAttention adds it inside every segment's tiles
  m.caps.no_additive_bias = "";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Strided>(p, v); };
  // strided: |i - j| < l or i - j a multiple of l; fixed: the same block of l, or one of the last
  // c columns of a block.
  m.reference_mask = [](const ParamValues& v, int64_t N, bool causal) {
    const int64_t l = v.get_int("stride") == 0 ? std::max<int64_t>(1, std::llround(std::sqrt(double(N)))) : v.get_int("stride");
    const int64_t c = v.get_int("summary");
    if (v.get_choice("pattern") == "fixed")
      return ref::causal_and([=](int64_t i, int64_t j) { return j / l == i / l || j % l >= l - c; }, causal);
    return ref::causal_and([=](int64_t i, int64_t j) { return std::abs(i - j) < l || (i - j) % l == 0; }, causal);
  };
  return m;
}

}  // namespace ab
