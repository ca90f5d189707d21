// bigbird: window, global and random blocks.
// Paper: Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences" (ITC variant).
// Complexity: O(N (window_blocks + global_blocks + random_blocks) block D) time, O(N) memory.
// Computes, in blocks of `block` (N a multiple): query block q attends window blocks
//   q-1, q, q+1 (`window_blocks` = 3), the global blocks (the first ceil(g/2) and last
//   floor(g/2)), and `random_blocks` other blocks drawn per (head, query block) without
//   replacement from those not already attended (all of them when fewer remain); global query
//   blocks attend every block. Not causal. The draw is seeded and dumped as random_blocks
//   (H, nb, random_blocks), -1 in unused slots and in global query blocks' rows.
// Optimises: disjoint segments: global query blocks over all keys, the others over the global
//   key strips, their window among non-global blocks (a block band), and their random blocks,
//   gathered per call into one contiguous run per query block.
// Leaves out: the ETC variant (extra global tokens).
#include <algorithm>
#include <string>

#include "attention_impls/registry.hpp"
#include "attention_impls/sparse_segments.hpp"

namespace ab {
namespace {

class BigBird final : public SparseAttention {
 public:
  BigBird(const AttnProblem& p, const ParamValues& v)
      : SparseAttention(p), block_(v.get_int("block")), window_blocks_(v.get_int("window_blocks")),
        global_blocks_(v.get_int("global_blocks")), random_blocks_(v.get_int("random_blocks")) {}

  void validate() const override {
    if (problem_.shape.N % block_ != 0)
      throw InvalidInput("bigbird: N=" + std::to_string(problem_.shape.N) + " is not a multiple of block=" +
                         std::to_string(block_) + "; choose N or --param block= so that block divides N");
  }

  std::vector<DumpTensor> dump_tensors() const override {
    std::vector<DumpTensor> t = {DumpTensor{"random_blocks", {problem_.shape.H, nb(), random_blocks_}, nullptr, drawn_.data()}};
    for (DumpTensor& e : SparseAttention::dump_tensors()) t.push_back(e);  // the position encoding's
    return t;
  }

 protected:
  size_t pattern_bytes() const override { return static_cast<size_t>(problem_.shape.H * nb() * random_blocks_) * sizeof(int64_t); }

  std::vector<Segment> make_segments(Rng* rng) const override {
    const int64_t N = problem_.shape.N, H = problem_.shape.H, b = block_, n = nb();
    const int64_t g1 = std::min((global_blocks_ + 1) / 2, n), g2 = std::min(global_blocks_ / 2, n - g1);
    const int64_t lo = g1, hi = n - g2;  // non-global query blocks [lo, hi)
    const int64_t wl = (window_blocks_ - 1) / 2, wr = window_blocks_ / 2;
    std::vector<Segment> s;
    if (rng) {
      drawn_ = Buffer<int64_t>(static_cast<size_t>(H * n * random_blocks_));
      std::fill(drawn_.data(), drawn_.data() + drawn_.size(), int64_t{-1});
    }
    if (g1 > 0) s.push_back(dense(rows(0, g1 * b), rows(0, N)));
    if (g2 > 0) s.push_back(dense(rows(hi * b, g2 * b), rows(0, N)));
    if (hi <= lo) return s;
    const RowSet inner = rows(lo * b, (hi - lo) * b);
    s.push_back(block_band(inner, b, wl, wr, false));  // window among non-global blocks
    if (g1 > 0) s.push_back(dense(inner, rows(0, g1 * b)));
    if (g2 > 0) s.push_back(dense(inner, rows(hi * b, g2 * b)));

    // Random blocks: candidates of query block q are the blocks outside its window and the
    // global blocks; q takes min(r, candidates) of them.
    auto candidates = [&](int64_t q) {
      std::vector<int64_t> c;
      for (int64_t k = lo; k < hi; ++k)
        if (k < q - wl || k > q + wr) c.push_back(k);
      return c;
    };
    std::vector<int64_t> start(static_cast<size_t>(hi - lo + 1), 0);
    for (int64_t q = lo; q < hi; ++q)
      start[static_cast<size_t>(q - lo + 1)] =
          start[static_cast<size_t>(q - lo)] + std::min<int64_t>(random_blocks_, static_cast<int64_t>(candidates(q).size())) * b;
    const int64_t nk = start.back();
    if (nk == 0) return s;
    Segment rnd;
    rnd.queries = inner;
    rnd.keys = rows(0, nk);
    rnd.gathered = true;
    if (rng) {
      rnd.gather = Buffer<int64_t>(static_cast<size_t>(H * nk));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t q = lo; q < hi; ++q) {
          std::vector<int64_t> c = candidates(q);
          const int64_t take = std::min<int64_t>(random_blocks_, static_cast<int64_t>(c.size()));
          for (int64_t t = 0; t < take; ++t) {  // partial Fisher-Yates: without replacement
            const int64_t pick = t + static_cast<int64_t>(rng->below(static_cast<uint64_t>(c.size()) - t));
            std::swap(c[static_cast<size_t>(t)], c[static_cast<size_t>(pick)]);
            drawn_[static_cast<size_t>((h * n + q) * random_blocks_ + t)] = c[static_cast<size_t>(t)];
            const int64_t u0 = start[static_cast<size_t>(q - lo)] + t * b;
            for (int64_t x = 0; x < b; ++x) rnd.gather[static_cast<size_t>(h * nk + u0 + x)] = c[static_cast<size_t>(t)] * b + x;
          }
        }
    }
    // One tile per query block and its random run (r blocks wide).
    rnd.tight = true;
    rnd.tile_rows = b;
    rnd.tile_cols = std::max<int64_t>(b, std::min<int64_t>(random_blocks_ * b, 512));
    rnd.range = [start, b](int64_t t) {
      const size_t q = static_cast<size_t>(t / b);
      return std::pair<int64_t, int64_t>{start[q], start[q + 1]};
    };
    s.push_back(std::move(rnd));
    return s;
  }

 private:
  int64_t nb() const { return problem_.shape.N / block_; }
  int64_t block_, window_blocks_, global_blocks_, random_blocks_;
  mutable Buffer<int64_t> drawn_;
};

}  // namespace

MechanismInfo bigbird_info() {
  MechanismInfo m;
  m.name = "bigbird";
  m.family = "sparse";
  m.summary = "block window + global blocks + seeded random blocks per (head, query block)";
  m.complexity = "O(N (w + g + r) block D) time, O(N) memory";
  m.caps = Capabilities{.exact = true, .causal = false, .backward = true, .decode = false,
                        .constraints = "N multiple of block", .attn_dropout = true, .no_attn_dropout = ""};
  m.params = {ParamSpec{"block", ParamType::Int, int64_t{64}, 1, 1 << 20, {}, "block length (must divide N)"},
              ParamSpec{"window_blocks", ParamType::Int, int64_t{3}, 1, 1 << 20, {}, "window width in blocks, centred"},
              ParamSpec{"global_blocks", ParamType::Int, int64_t{2}, 0, 1 << 20, {}, "global blocks: first ceil(g/2), last floor(g/2)"},
              ParamSpec{"random_blocks", ParamType::Int, int64_t{3}, 0, 1 << 20, {}, "random key blocks per query block"}};
  m.bf16 = sparse_bf16_support();
  m.caps.additive_bias = true;  // SparseAttention adds it inside every segment's tiles
  m.caps.no_additive_bias = "";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<BigBird>(p, v); };
  // Masked softmax over the pairs of each head's draw (ref::bigbird_mask below).
  m.reference = [](const Attention& impl, const AttnArgs& a, const AttnProblem& p, const ParamValues& v) {
    const Shape4& s = p.shape;
    const int64_t b = v.get_int("block");
    const DumpTensor drawn = dump_tensor(impl, "random_blocks");
    std::vector<double> out(static_cast<size_t>(s.numel()));
    for (int64_t bi = 0; bi < s.B; ++bi)
      for (int64_t h = 0; h < s.H; ++h) {
        auto head = [&](const TensorView& t) { return TensorView{t.head(bi, h), Shape4{1, 1, s.N, s.D}, t.strides}; };
        const ref::Mask mask = ref::bigbird_mask(drawn.i64, h, s.N / b, b, v.get_int("window_blocks"),
                                                 v.get_int("global_blocks"), v.get_int("random_blocks"));
        ref::put_head(out, s, bi, h, ref::forward(head(a.q), head(a.k), head(a.v), mask));
      }
    return out;
  };
  return m;
}

ref::Mask ref::bigbird_mask(const int64_t* drawn, int64_t h, int64_t nb, int64_t block, int64_t window_blocks,
                            int64_t global_blocks, int64_t random_blocks) {
  const int64_t g1 = std::min((global_blocks + 1) / 2, nb), g2 = std::min(global_blocks / 2, nb - g1);
  const int64_t wl = (window_blocks - 1) / 2, wr = window_blocks / 2;
  auto global = [=](int64_t blk) { return blk < g1 || blk >= nb - g2; };
  return [=](int64_t i, int64_t j) {
    const int64_t q = i / block, k = j / block;
    if (global(q) || global(k) || (k >= q - wl && k <= q + wr)) return true;
    for (int64_t t = 0; t < random_blocks; ++t)
      if (drawn[(h * nb + q) * random_blocks + t] == k) return true;
    return false;
  };
}

}  // namespace ab
