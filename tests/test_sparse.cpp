// The fixed sparse patterns against the triple-loop reference under the dense mask of each
// pattern (written here from mechanisms.md, independently of the segment decomposition),
// forward and backward, causal where allowed, edge-case parameters; BigBird's random blocks;
// memory and FLOPs linear in N; bad parameters.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "attention_impls/sparse_segments.hpp"
#include "attention_impls/tiled_softmax.hpp"
#include "core/dtype.hpp"
#include "tests/helpers.hpp"
#include "tests/patterns.hpp"
#include "tests/reference.hpp"

namespace ab {
namespace {

using test::run_mechanism;
using test::param;
using test::pattern_mask;

struct SparseCase {
  std::string mech;
  std::vector<std::string> params;
  int64_t N;
  bool causal;
};
void PrintTo(const SparseCase& c, std::ostream* os) {
  *os << c.mech << " N=" << c.N << (c.causal ? " causal" : "");
  for (const auto& p : c.params) *os << " " << p;
}

class SparseVsMaskedVanilla : public ::testing::TestWithParam<SparseCase> {};

TEST_P(SparseVsMaskedVanilla, ForwardAndBackward) {
  const SparseCase& c = GetParam();
  const Shape4 s{2, 2, c.N, 16};
  auto r = run_mechanism(c.mech, s, c.causal, Mode::fwdbwd, c.params, 17, 2);
  const AttnArgs a = r.data->args();
  const auto mask = pattern_mask(c.mech, c.params, c.N, c.causal);
  EXPECT_LT(ref::rel_err(a.o.data, ref::forward(a.q, a.k, a.v, mask)), 2e-5);
  const auto g = ref::backward(a.q, a.k, a.v, a.dout, mask);
  // dQ and dK come from dS = P (dP - delta), a difference of two dot products of dO: with one
  // admissible key per row (window 0) both are exactly zero in theory and float rounding of
  // that difference is ~1e-6, which depends on the summation order of the matmul kernel the CPU
  // gets (AVX2 and AVX-512 differ). Their errors are measured against the gradients' scale,
  // dV = P^T dO, which is never degenerate.
  const double scale = std::max(1e-2, ref::max_abs(g.dv));
  EXPECT_LT(ref::rel_err(a.dq.data, g.dq, scale), 1e-4) << "dq";
  EXPECT_LT(ref::rel_err(a.dk.data, g.dk, scale), 1e-4) << "dk";
  EXPECT_LT(ref::rel_err(a.dv.data, g.dv), 1e-4) << "dv";
  EXPECT_EQ(r.tracked_peak, r.declared);
}

std::vector<SparseCase> sparse_cases() {
  std::vector<SparseCase> v;
  for (bool causal : {false, true})
    for (int64_t N : {1, 7, 100, 130}) {
      v.push_back({"local", {"block=16"}, N, causal});
      v.push_back({"local", {"block=16", "lookback=0", "lookahead=0"}, N, causal});
      v.push_back({"local", {"block=5", "lookback=2", "lookahead=1"}, N, causal});
      v.push_back({"local", {"block=200"}, N, causal});  // one block
      v.push_back({"sliding", {"window=9"}, N, causal});
      v.push_back({"sliding", {"window=0"}, N, causal});
      v.push_back({"sliding", {"window=500"}, N, causal});  // window >= N
      v.push_back({"dilated", {"window=5", "dilation=3"}, N, causal});
      v.push_back({"dilated", {"window=0", "dilation=2"}, N, causal});
      v.push_back({"dilated", {"window=70", "dilation=1"}, N, causal});
      v.push_back({"strided", {"stride=8"}, N, causal});
      v.push_back({"strided", {"stride=0"}, N, causal});
      v.push_back({"strided", {"stride=1"}, N, causal});
      v.push_back({"strided", {"pattern=fixed", "stride=10", "summary=3"}, N, causal});
      v.push_back({"strided", {"pattern=fixed", "stride=16", "summary=16"}, N, causal});
    }
  for (int64_t N : {1, 7, 100, 130}) {
    v.push_back({"longformer", {"window=6", "global=5"}, N, false});
    v.push_back({"longformer", {"window=6", "global=0"}, N, false});
    v.push_back({"longformer", {"window=4", "dilation=3", "global=2"}, N, false});
    v.push_back({"longformer", {"window=2", "global=200"}, N, false});
    // Too wide for the diagonal kernel to hold the global keys: they keep their forward segment.
    v.push_back({"longformer", {"window=1000", "global=3"}, N, false});
    v.push_back({"etc", {"radius=5", "global=4"}, N, false});
    v.push_back({"etc", {"radius=0", "global=2"}, N, false});  // global pieces only, and the diagonal
    v.push_back({"etc", {"radius=9", "global=0"}, N, false});
  }
  // Global keys inside the diagonal kernel over several 16-row blocks, 33 of them (its logits in
  // groups of 24, 8 and 1 keys), with a dilation.
  v.push_back({"longformer", {"window=20", "dilation=2", "global=33"}, 300, false});
  return v;
}
INSTANTIATE_TEST_SUITE_P(Patterns, SparseVsMaskedVanilla, ::testing::ValuesIn(sparse_cases()));

// One (b, h) on two threads: each segment's backward splits its key tiles over the threads
// (TiledSoftmax::key_parts), dQ summed from partial buffers, for every pattern of the list.
TEST(SparseVsMaskedVanillaOneHead, BackwardSplitOverTwoThreads) {
  for (const SparseCase& c : sparse_cases()) {
    if (c.N != 130) continue;
    const Shape4 s{1, 1, c.N, 16};
    auto r = run_mechanism(c.mech, s, c.causal, Mode::fwdbwd, c.params, 17, 2);
    const AttnArgs a = r.data->args();
    const auto mask = pattern_mask(c.mech, c.params, c.N, c.causal);
    std::ostringstream what;
    PrintTo(c, &what);
    EXPECT_LT(ref::rel_err(a.o.data, ref::forward(a.q, a.k, a.v, mask)), 2e-5) << what.str();
    const auto g = ref::backward(a.q, a.k, a.v, a.dout, mask);
    const double scale = std::max(1e-2, ref::max_abs(g.dv));
    EXPECT_LT(ref::rel_err(a.dq.data, g.dq, scale), 1e-4) << "dq " << what.str();
    EXPECT_LT(ref::rel_err(a.dk.data, g.dk, scale), 1e-4) << "dk " << what.str();
    EXPECT_LT(ref::rel_err(a.dv.data, g.dv), 1e-4) << "dv " << what.str();
    EXPECT_EQ(r.tracked_peak, r.declared) << what.str();
  }
}

// ---- bf16 (a CPU with AVX512-BF16): the same patterns, forward ----
// Q, K, V rounded once per call and every segment's products in bf16 with float accumulation:
// within what 8 bits of mantissa cost of the float64 reference under the pattern's mask, but
// clearly not float accuracy (the bf16 path ran); an odd D (rows padded in the copies); memory
// as declared; one and two threads bit-identical (each tile is one thread's product); the
// bands scored by the diagonal kernel's bf16 variant (the same scored pairs as in float32).
TEST(SparseBf16, ForwardMatchesTheMaskedReferenceWithinBf16Rounding) {
  if (!cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 CPU";
  for (const SparseCase& c : sparse_cases()) {
    if (c.N < 100) continue;
    for (int64_t D : {15, 16}) {
      const Shape4 s{2, 2, c.N, D};
      auto r = run_mechanism(c.mech, s, c.causal, Mode::fwd, c.params, 17, 1, Dtype::bf16);
      const AttnArgs a = r.data->args();
      std::ostringstream what;
      PrintTo(c, &what);
      what << " D=" << D;
      const double err = ref::rel_err(a.o.data, ref::forward(a.q, a.k, a.v, pattern_mask(c.mech, c.params, c.N, c.causal)));
      EXPECT_LT(err, 1.5e-2) << what.str();
      EXPECT_GT(err, 1e-4) << what.str() << ": float accuracy, the bf16 path did not run";
      EXPECT_EQ(r.tracked_peak, r.declared) << what.str();
      // The bands' diagonal kernel runs in bf16 too, Longformer's global keys inside it: the
      // same keys scored as in float32.
      if (TiledSoftmax::diagonal_bf16_kernel(D)) {
        auto f32 = run_mechanism(c.mech, s, c.causal, Mode::fwd, c.params, 17, 1);
        EXPECT_EQ(r.impl->admissible_fraction(), f32.impl->admissible_fraction()) << what.str();
      }
      auto two = run_mechanism(c.mech, s, c.causal, Mode::fwd, c.params, 17, 2, Dtype::bf16);
      EXPECT_EQ(0, std::memcmp(two.data->o.data(), r.data->o.data(), sizeof(float) * static_cast<size_t>(s.numel())))
          << what.str() << ": two threads differ from one";
    }
  }
}

// BigBird's gathered random blocks in bf16: against itself in float32 with the same seed (so the
// same blocks), within bf16 rounding but not equal.
TEST(SparseBf16, BigBirdMatchesItsFloatPathWithinBf16Rounding) {
  if (!cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 CPU";
  const Shape4 s{2, 3, 128, 16};
  const std::vector<std::string> ps = {"block=8", "global_blocks=2", "random_blocks=3"};
  auto f32 = run_mechanism("bigbird", s, false, Mode::fwd, ps, 23, 1);
  auto bf16 = run_mechanism("bigbird", s, false, Mode::fwd, ps, 23, 1, Dtype::bf16);
  EXPECT_EQ(bf16.tracked_peak, bf16.declared);
  const std::vector<double> want(f32.data->o.data(), f32.data->o.data() + s.numel());
  const double err = ref::rel_err(bf16.data->o.data(), want);
  EXPECT_LT(err, 1.5e-2);
  EXPECT_GT(err, 1e-4) << "float accuracy: the bf16 path did not run";
}

// ---- bf16 backward: every pattern's dQ, dK, dV against its own float32 backward ----
// The same inputs and dO, bf16 against float32: each gradient within kBf16GradTolerance in
// relative Frobenius norm (Q, K, V, dO, P and dS rounded to 8 significant bits; measured at
// most 0.5% over these cases) and not equal (the bf16 tiles ran); memory as declared; one and
// two threads bit-identical (a (b, h) pair is one thread's in bf16: no key split). BigBird's
// gathered random blocks likewise, against float32 with the same seed (the same blocks).
TEST(SparseBf16, BackwardNearItsFloat32Backward) {
  if (!cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 CPU";
  constexpr double kBf16GradTolerance = 2e-2;
  std::vector<SparseCase> cases;
  for (const SparseCase& c : sparse_cases())
    if (c.N >= 100) cases.push_back(c);
  cases.push_back({"bigbird", {"block=8", "global_blocks=2", "random_blocks=3"}, 128, false});
  double worst = 0;
  for (const SparseCase& c : cases)
    for (int64_t D : {15, 16}) {
      const Shape4 s{2, 2, c.N, D};
      std::ostringstream what;
      PrintTo(c, &what);
      what << " D=" << D;
      auto f32 = run_mechanism(c.mech, s, c.causal, Mode::fwdbwd, c.params, 17, 1);
      auto b16 = run_mechanism(c.mech, s, c.causal, Mode::fwdbwd, c.params, 17, 1, Dtype::bf16);
      EXPECT_EQ(b16.tracked_peak, b16.declared) << what.str();
      const AttnArgs a = f32.data->args(), b = b16.data->args();
      auto norm_of = [&](const float* x) { return test::frobenius(x, s.numel()); };
      // A row of one key (window 0) has dQ = dK = 0 exactly: both sides are rounding noise there,
      // measured against dV's scale instead.
      const double scale = norm_of(a.dv.data);
      for (auto [got, want, label] : {std::tuple{b.dq.data, a.dq.data, "dq"}, std::tuple{b.dk.data, a.dk.data, "dk"},
                                      std::tuple{b.dv.data, a.dv.data, "dv"}}) {
        const double norm = norm_of(want);
        if (norm < 1e-5 * scale) {
          EXPECT_LT(norm_of(got), 1e-5 * scale) << what.str() << " " << label << ": zero in float32, not in bf16";
          continue;
        }
        const double rel = test::frobenius_diff(got, want, s.numel()) / norm;
        worst = std::max(worst, rel);
        EXPECT_LT(rel, kBf16GradTolerance) << what.str() << " " << label;
        EXPECT_GT(rel, 1e-4) << what.str() << " " << label << ": float32 accuracy, the bf16 tiles did not run";
      }
      auto two = run_mechanism(c.mech, s, c.causal, Mode::fwdbwd, c.params, 17, 2, Dtype::bf16);
      for (auto [x, y] : {std::pair{two.data->args().dq.data, b.dq.data}, std::pair{two.data->args().dk.data, b.dk.data},
                          std::pair{two.data->args().dv.data, b.dv.data}})
        EXPECT_EQ(0, std::memcmp(x, y, sizeof(float) * static_cast<size_t>(s.numel()))) << what.str() << ": two threads differ";
    }
  std::printf("[ bf16     ] worst relative gradient error %.4f\n", worst);
}

// Attention dropout in bf16 (every mechanism whose bf16 path applies it: the sparse patterns in
// their tiles, flash, linformer and memory_compressed in bf16 tiles instead of the dense kernel,
// vanilla on its materialised probabilities):
// under one mask key the bf16 forward and backward are within 2% of float32's with the same mask
// in relative Frobenius norm, and not within 1e-4 (the bf16 tiles ran); the mask acted (the
// output differs from the undropped one); two threads give the bits of one.
TEST(Bf16Dropout, NearFloat32UnderTheSameMask) {
  if (!cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 CPU";
  const std::map<std::string, std::vector<std::string>> params = {
      {"vanilla", {}}, {"flash", {}}, {"local", {"block=16"}}, {"sliding", {"window=9"}}, {"dilated", {"window=5", "dilation=2"}},
      {"strided", {"stride=8"}}, {"longformer", {"window=6", "global=4"}}, {"etc", {"radius=6", "global=4"}},
      {"bigbird", {"block=8", "random_blocks=1"}}, {"linformer", {"k=16"}}, {"memory_compressed", {"stride=3"}}};
  const Dropout mask{0.2f, 42};
  int checked = 0;
  for (const auto& info : mechanisms()) {
    if (!info.bf16.attn_dropout) continue;
    const auto it = params.find(info.name);
    ASSERT_NE(it, params.end()) << info.name << ": give it parameters for N 64 here";
    for (bool causal : {false, true}) {
      if (causal && !info.caps.causal) continue;
      const Shape4 s{2, 2, 64, 16};
      auto run = [&](Dtype dtype, int threads, const Dropout& d) {
        AttnProblem p{s, causal, Strides3::contiguous(s), threads};
        p.dtype = dtype;
        p.attn_dropout = true;
        auto r = test::run_problem(info.name, p, Mode::fwdbwd, it->second, 17);
        EXPECT_EQ(r.tracked_peak, r.declared) << info.name;
        r.impl->set_dropout(d);
        r.impl->forward(r.data->args());
        r.impl->backward(r.data->args());
        return r;
      };
      auto f32 = run(Dtype::f32, 1, mask), b16 = run(Dtype::bf16, 1, mask), b16_two = run(Dtype::bf16, 2, mask);
      auto undropped = run(Dtype::bf16, 1, Dropout{});
      const AttnArgs a = f32.data->args(), b = b16.data->args(), t = b16_two.data->args();
      for (auto [got, want, label] : {std::tuple{b.o.data, a.o.data, "o"}, std::tuple{b.dq.data, a.dq.data, "dq"},
                                      std::tuple{b.dk.data, a.dk.data, "dk"}, std::tuple{b.dv.data, a.dv.data, "dv"}}) {
        const double rel = test::frobenius_diff(got, want, s.numel()) / test::frobenius(want, s.numel());
        EXPECT_LT(rel, 2e-2) << info.name << (causal ? " causal " : " ") << label;
        EXPECT_GT(rel, 1e-4) << info.name << " " << label << ": float32 accuracy, the bf16 tiles did not run";
      }
      for (auto [x, y] : {std::pair{t.o.data, b.o.data}, std::pair{t.dq.data, b.dq.data}, std::pair{t.dk.data, b.dk.data},
                          std::pair{t.dv.data, b.dv.data}})
        EXPECT_EQ(0, std::memcmp(x, y, sizeof(float) * static_cast<size_t>(s.numel()))) << info.name << ": two threads differ";
      const double moved = test::frobenius_diff(undropped.data->o.data(), b.o.data, s.numel()) / test::frobenius(b.o.data, s.numel());
      EXPECT_GT(moved, 5e-2) << info.name << ": the mask did nothing";
      ++checked;
    }
  }
  EXPECT_GE(checked, 16);
}

// ---- The engine itself: the output is written, never read first ----
// O starts as NaN. Rows 0..kEmpty-1 have no key (a whole first block with no tile: O must come
// out 0); the others a band [i - 20, i + 9) without the query itself (exclude_self), in tight
// tiles narrower than the band (several tiles per block: the first writes, the rest add).
TEST(TiledSoftmaxEngine, WritesEveryOutputRowWithoutReadingItFirst) {
  const int64_t N = 70, D = 8, kEmpty = 32;
  const Shape4 s{1, 2, N, D};
  std::vector<float> q(static_cast<size_t>(s.numel())), k(q.size()), v(q.size()), o(q.size());
  for (size_t x = 0; x < q.size(); ++x) {
    q[x] = std::sin(0.37f * static_cast<float>(x));
    k[x] = std::cos(0.23f * static_cast<float>(x));
    v[x] = std::sin(0.11f * static_cast<float>(x) + 1.0f);
  }
  const Strides3 st = Strides3::contiguous(s);
  const TensorView Q{q.data(), s, st}, K{k.data(), s, st}, V{v.data(), s, st}, O{o.data(), s, st};
  auto range = [=](int64_t i) {
    return i < kEmpty ? std::pair<int64_t, int64_t>{0, 0} : std::pair<int64_t, int64_t>{i - 20, i + 9};
  };
  for (bool tight : {false, true})
    for (int64_t cols : {8, 64}) {
      TiledSoftmaxShape sh = TiledSoftmaxShape::dense(1, 2, N, N, D, false, D, D, omp_get_max_threads());
      sh.keys = range;
      sh.exclude_self = true;
      sh.tight = tight;
      sh.fwd_rows = kEmpty;
      sh.fwd_cols = cols;
      QKLogits qk(D, D, D, 1.0f / std::sqrt(static_cast<float>(D)));
      TiledSoftmax engine(sh);
      engine.plan(Mode::fwd, qk);
      engine.setup(Mode::fwd);
      std::fill(o.begin(), o.end(), std::numeric_limits<float>::quiet_NaN());
      qk.bind(Q, K);
      engine.forward(qk, V, O);
      const auto want = ref::forward(Q, K, V, [&](int64_t i, int64_t j) {
        const auto [lo, hi] = range(i);
        return j >= lo && j < hi && j != i;
      });
      EXPECT_LT(ref::rel_err(o.data(), want), 2e-5) << "tight " << tight << " cols " << cols;
      EXPECT_EQ(o[0], 0.0f) << "a row with no key";
      // Rows 32..61 use 28 keys; rows 62..69 are clipped at N: 27 down to 20.
      EXPECT_DOUBLE_EQ(engine.pairs(), 30 * 28 + (27 + 20) * 8 / 2);
    }
}

// Resuming: a second engine over a disjoint key range continues from the first one's O and
// log-sum-exp, and the result is the softmax over the union. Rows 0..15 have no key in the
// first range (they start from O = 0, lse = -inf), rows 50..69 none in the second; the lse
// written is the union's.
TEST(TiledSoftmaxEngine, ResumesFromAnEarlierKeySet) {
  const int64_t N = 70, D = 8;
  const Shape4 s{1, 2, N, D};
  std::vector<float> q(static_cast<size_t>(s.numel())), k(q.size()), v(q.size()), o(q.size());
  for (size_t x = 0; x < q.size(); ++x) {
    q[x] = 2.0f * std::sin(0.37f * static_cast<float>(x));
    k[x] = std::cos(0.23f * static_cast<float>(x));
    v[x] = std::sin(0.11f * static_cast<float>(x) + 1.0f);
  }
  const Strides3 st = Strides3::contiguous(s);
  const TensorView Q{q.data(), s, st}, K{k.data(), s, st}, V{v.data(), s, st}, O{o.data(), s, st};
  using Range = std::pair<int64_t, int64_t>;
  auto first = [](int64_t i) { return i < 16 ? Range{0, 0} : Range{i - 16, i - 4}; };
  auto second = [N](int64_t i) { return i >= 50 ? Range{N, N} : Range{i - 3, i + 12}; };
  for (int64_t cols : {8, 64}) {
    std::vector<float> lse(static_cast<size_t>(2 * N));
    const LseView lv{lse.data(), 2 * N, N, 1};
    QKLogits qk(D, D, D, 1.0f / std::sqrt(static_cast<float>(D)));
    qk.bind(Q, K);
    std::fill(o.begin(), o.end(), std::numeric_limits<float>::quiet_NaN());
    for (int part = 0; part < 2; ++part) {
      TiledSoftmaxShape sh = TiledSoftmaxShape::dense(1, 2, N, N, D, false, D, D, omp_get_max_threads());
      sh.keys = part == 0 ? KeyRangeFn(first) : KeyRangeFn(second);
      sh.tight = true;
      sh.fwd_rows = 16;
      sh.fwd_cols = cols;
      TiledSoftmax engine(sh);
      engine.plan(Mode::fwd, qk);
      engine.setup(Mode::fwd);
      engine.forward(qk, V, O, &lv, part == 1);
    }
    auto admissible = [&](int64_t i, int64_t j) {
      const auto [a, b] = first(i);
      const auto [c, d] = second(i);
      return (j >= a && j < b) || (j >= c && j < d && j < N);
    };
    const auto want = ref::forward(Q, K, V, admissible);
    EXPECT_LT(ref::rel_err(o.data(), want), 2e-5) << "cols " << cols;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < N; ++i) {
        double m = -1e300, sum = 0;
        std::vector<double> logit(static_cast<size_t>(N));
        for (int64_t j = 0; j < N; ++j) {
          double dotp = 0;
          for (int64_t d = 0; d < D; ++d) dotp += double(Q.at(0, h, i, d)) * K.at(0, h, j, d);
          logit[static_cast<size_t>(j)] = dotp / std::sqrt(double(D));
          if (admissible(i, j)) m = std::max(m, logit[static_cast<size_t>(j)]);
        }
        for (int64_t j = 0; j < N; ++j)
          if (admissible(i, j)) sum += std::exp(logit[static_cast<size_t>(j)] - m);
        EXPECT_NEAR(lse[static_cast<size_t>(h * N + i)], m + std::log(sum), 1e-5) << "h " << h << " row " << i;
      }
  }
}

// The backward pass splits each (b, h)'s key tiles into parts when B H does not divide over the
// threads, so that every thread has work: threads / gcd(B H, threads) parts, at most one per key
// tile; never with one thread, a fixed schedule, or a source that cannot write a partial dQ.
TEST(TiledSoftmaxEngine, SplitsKeyTilesWhenPairsDoNotDivideOverThreads) {
  struct C {
    int64_t H, N;
    int threads;
    bool static_schedule, keys_major;
    int64_t parts;
  };
  for (C c : {C{1, 1000, 2, false, false, 2}, C{2, 1000, 2, false, false, 1}, C{3, 1000, 2, false, false, 2},
              C{3, 1000, 4, false, false, 4}, C{2, 1000, 4, false, false, 2}, C{1, 1000, 1, false, false, 1},
              C{1, 100, 2, false, false, 1}, C{1, 1000, 2, true, false, 1}, C{1, 1000, 2, false, true, 1}}) {
    TiledSoftmaxShape sh = TiledSoftmaxShape::dense(1, c.H, c.N, c.N, 16, false, 16, 16, c.threads);
    sh.static_schedule = c.static_schedule;
    QKLogits qk(16, 16, 16, 0.25f, c.keys_major);
    TiledSoftmax engine(sh);
    engine.plan(Mode::fwdbwd, qk);
    EXPECT_EQ(engine.key_parts(), c.parts) << "H=" << c.H << " N=" << c.N << " threads=" << c.threads;
    engine.plan(Mode::fwd, qk);
    EXPECT_EQ(engine.key_parts(), 1) << "forward";
  }
}

// A pattern whose second segment shares some query rows with the first (so it resumes from
// them) and has rows of its own that no earlier segment had (they start from O = 0, lse =
// -inf), and rows 70.. that no segment has (O = 0). Forward and backward against the reference.
class OverlappingSegments final : public SparseAttention {
 public:
  explicit OverlappingSegments(const AttnProblem& p) : SparseAttention(p) {}

 protected:
  std::vector<Segment> make_segments(Rng*) const override {
    std::vector<Segment> s;
    s.push_back(dense(rows(0, 40), rows(0, 30)));   // queries 0..39 over keys 0..29
    s.push_back(dense(rows(20, 50), rows(30, 40)));  // queries 20..69 over keys 30..69
    return s;
  }
};

TEST(SparseAttentionSegments, ResumeOnRowsPartlyNewToThePattern) {
  // N = 70: every row has a segment, so only the resuming segment's new rows need O = 0 and
  // lse = -inf first; N = 80: rows 70.. have no segment as well.
  for (int64_t N : {70, 80}) {
    const Shape4 s{1, 2, N, 8};
    omp_set_num_threads(1);  // the problem's thread count: one execution slot
    OverlappingSegments impl(AttnProblem{s, false, Strides3::contiguous(s), 1});
    impl.validate();
    AttnData data(s, 5, true);
    Rng rng(5, kStreamParams);
    impl.setup(Mode::fwdbwd, rng);
    const AttnArgs a = data.args();
    for (int call = 0; call < 2; ++call) {  // the output of an earlier call must not leak in
      std::fill(a.o.data, a.o.data + s.numel(), std::numeric_limits<float>::quiet_NaN());
      impl.forward(a);
    }
    impl.backward(a);
    auto mask = [](int64_t i, int64_t j) { return (i < 40 && j < 30) || (i >= 20 && i < 70 && j >= 30 && j < 70); };
    EXPECT_LT(ref::rel_err(a.o.data, ref::forward(a.q, a.k, a.v, mask)), 2e-5) << "N=" << N;
    if (N > 70) {
      EXPECT_EQ(a.o.at(0, 1, 75, 3), 0.0f) << "a row with no key";
    }
    const auto g = ref::backward(a.q, a.k, a.v, a.dout, mask);
    EXPECT_LT(ref::rel_err(a.dq.data, g.dq), 1e-4) << "dq N=" << N;
    EXPECT_LT(ref::rel_err(a.dk.data, g.dk), 1e-4) << "dk N=" << N;
    EXPECT_LT(ref::rel_err(a.dv.data, g.dv), 1e-4) << "dv N=" << N;
  }
}

// ---- BigBird: its mask depends on the dumped random draw, per head (tests/patterns.hpp) ----

TEST(BigBird, EqualsMaskedVanillaPerHead) {
  struct C {
    int64_t N, b, g, r;
  };
  for (C c : {C{128, 8, 2, 3}, C{64, 8, 0, 2}, C{64, 8, 3, 1}, C{48, 16, 2, 3}, C{16, 16, 2, 3}, C{96, 8, 2, 20}}) {
    const Shape4 s{2, 3, c.N, 16};
    const std::vector<std::string> ps = {"block=" + std::to_string(c.b), "global_blocks=" + std::to_string(c.g),
                                         "random_blocks=" + std::to_string(c.r)};
    auto run = run_mechanism("bigbird", s, false, Mode::fwdbwd, ps, 23, 2);
    EXPECT_EQ(run.tracked_peak, run.declared);
    const DumpTensor d = run.impl->dump_tensors()[0];
    ASSERT_EQ(d.name, "random_blocks");
    ASSERT_EQ(d.shape, (std::vector<int64_t>{3, c.N / c.b, c.r}));
    const AttnArgs a = run.data->args();
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h) {
        auto head = [&](const TensorView& t) {
          return TensorView{t.head(b, h), Shape4{1, 1, s.N, s.D}, t.strides};
        };
        const auto mask = ref::bigbird_mask(d.i64, h, c.N / c.b, c.b, 3, c.g, c.r);
        const auto o = ref::forward(head(a.q), head(a.k), head(a.v), mask);
        const auto g = ref::backward(head(a.q), head(a.k), head(a.v), head(a.dout), mask);
        double eo = 0, eg = 0, so = 1e-2, sg = 1e-2;
        for (int64_t i = 0; i < s.N; ++i)
          for (int64_t x = 0; x < s.D; ++x) {
            const size_t k = static_cast<size_t>(i * s.D + x);
            eo = std::max(eo, std::abs(head(a.o).at(0, 0, i, x) - o[k]));
            so = std::max(so, std::abs(o[k]));
            for (auto [got, want] : {std::pair{head(a.dq), &g.dq}, std::pair{head(a.dk), &g.dk}, std::pair{head(a.dv), &g.dv}}) {
              eg = std::max(eg, std::abs(got.at(0, 0, i, x) - (*want)[k]));
              sg = std::max(sg, std::abs((*want)[k]));
            }
          }
        EXPECT_LT(eo / so, 2e-5) << "N=" << c.N << " head " << h;
        EXPECT_LT(eg / sg, 1e-4) << "N=" << c.N << " head " << h;
      }
  }
}

TEST(BigBird, RandomBlocksAreSeededAndDrawnWithoutReplacementFromUnattendedBlocks) {
  const Shape4 s{1, 4, 512, 16};
  const int64_t nb = 8, r = 3;
  auto one = run_mechanism("bigbird", s, false, Mode::fwd, {"block=64"}, 5);
  auto same = run_mechanism("bigbird", s, false, Mode::fwd, {"block=64"}, 5);
  auto other = run_mechanism("bigbird", s, false, Mode::fwd, {"block=64"}, 6);
  const int64_t* d1 = one.impl->dump_tensors()[0].i64;
  const int64_t* d2 = same.impl->dump_tensors()[0].i64;
  const int64_t* d3 = other.impl->dump_tensors()[0].i64;
  bool differs = false;
  for (int64_t h = 0; h < s.H; ++h)
    for (int64_t q = 0; q < nb; ++q) {
      std::set<int64_t> seen;
      for (int64_t t = 0; t < r; ++t) {
        const int64_t k = d1[(h * nb + q) * r + t];
        EXPECT_EQ(k, d2[(h * nb + q) * r + t]);
        differs |= k != d3[(h * nb + q) * r + t];
        if (q == 0 || q == nb - 1) {  // global query blocks draw nothing
          EXPECT_EQ(k, -1);
          continue;
        }
        ASSERT_GE(k, 1) << "not a global block";
        ASSERT_LE(k, nb - 2) << "not a global block";
        EXPECT_GT(std::abs(k - q), 1) << "not a window block";
        EXPECT_TRUE(seen.insert(k).second) << "drawn twice";
      }
    }
  EXPECT_TRUE(differs) << "another seed draws other blocks";
}

TEST(BigBird, FewerCandidatesThanSlotsUsesAllAndMarksTheRest) {
  // 6 blocks: query block 2's candidates are only block 4 (0, 5 global; 1..3 window).
  auto r = run_mechanism("bigbird", Shape4{1, 1, 48, 16}, false, Mode::fwd, {"block=8", "random_blocks=3"}, 1);
  const int64_t* d = r.impl->dump_tensors()[0].i64;
  EXPECT_EQ(d[2 * 3 + 0], 4);
  EXPECT_EQ(d[2 * 3 + 1], -1);
  EXPECT_EQ(d[2 * 3 + 2], -1);
}

// ---- cost: exact pair counts, and memory and FLOPs linear in N ----
TEST(SparseCost, FlopsCountAdmissiblePairsExactly) {
  const Shape4 s{1, 2, 256, 16};
  for (const SparseCase& c : sparse_cases()) {
    if (c.N != 100) continue;  // one size of every pattern and parameter set
    const auto& info = find_mechanism(c.mech);
    auto impl = info.make(AttnProblem{s, c.causal, Strides3::contiguous(s), 1}, resolve_params(info, c.params));
    const auto mask = pattern_mask(c.mech, c.params, s.N, c.causal);
    double pairs = 0;
    for (int64_t i = 0; i < s.N; ++i)
      for (int64_t j = 0; j < s.N; ++j) pairs += mask(i, j);
    EXPECT_DOUBLE_EQ(impl->flops(Mode::fwd), 4.0 * 16 * pairs * s.H) << ::testing::PrintToString(c);
    EXPECT_DOUBLE_EQ(impl->flops(Mode::fwdbwd), 3.5 * 4.0 * 16 * pairs * s.H) << ::testing::PrintToString(c);
  }
}

// Memory is linear in N for every pattern; FLOPs too for all but strided, whose residue part
// has N / stride keys per query.
TEST(SparseCost, MemoryAndFlopsGrowLinearlyInN) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"local", {}}, {"sliding", {}}, {"dilated", {}}, {"strided", {}}, {"strided", {"pattern=fixed"}},
      {"longformer", {}}, {"etc", {}}, {"bigbird", {}}};
  for (const auto& [name, ps] : cases)
    for (Mode mode : {Mode::fwd, Mode::fwdbwd}) {
      std::vector<double> bytes, flops;
      for (int64_t n : {4096, 8192, 16384}) {
        const auto& info = find_mechanism(name);
        const Shape4 s{1, 8, n, 64};
        auto impl = info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, resolve_params(info, ps));
        bytes.push_back(double(impl->working_bytes(mode)));
        flops.push_back(impl->flops(mode));
      }
      // Doubling N adds the same amount twice over: a + c N, exactly (the ends of the sequence
      // are the same at every N).
      EXPECT_DOUBLE_EQ(bytes[2] - bytes[1], 2 * (bytes[1] - bytes[0])) << name << " " << to_string(mode);
      if (name != "strided") {
        EXPECT_DOUBLE_EQ(flops[2] - flops[1], 2 * (flops[1] - flops[0])) << name << " " << to_string(mode);
      }
    }
}

// The forward pass scores every admissible pair, and a blocked band (a block of 32 to 128 rows,
// or a multiple of 64: one tile per block) scores nothing else when not causal: local at its
// defaults, with a shorter last block and with blocks split in 64-row tiles, and BigBird.
TEST(SparseCost, BlockedBandsScoreNoKeyOutsideTheWindow) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> exact = {
      {"local", {}}, {"local", {"block=100"}}, {"local", {"block=256", "lookback=2"}}, {"bigbird", {}}};
  const std::vector<std::pair<std::string, std::vector<std::string>>> others = {
      {"local", {"block=16"}}, {"sliding", {}}, {"dilated", {}}, {"strided", {}}, {"longformer", {}}};
  const Shape4 s{1, 2, 4096, 64};
  auto make = [&](const std::string& name, const std::vector<std::string>& ps, bool causal) {
    const auto& info = find_mechanism(name);
    auto impl = info.make(AttnProblem{s, causal, Strides3::contiguous(s), 1}, resolve_params(info, ps));
    return std::unique_ptr<SparseAttention>(dynamic_cast<SparseAttention*>(impl.release()));
  };
  for (const auto& [name, ps] : exact) {
    auto impl = make(name, ps, false);
    EXPECT_DOUBLE_EQ(impl->scored_pairs(), impl->pairs()) << name << " " << ::testing::PrintToString(ps);
  }
  for (const auto& [name, ps] : others)
    for (bool causal : {false, true}) {
      if (causal && name == "longformer") continue;
      auto impl = make(name, ps, causal);
      EXPECT_GT(impl->scored_pairs(), impl->pairs()) << name << " " << ::testing::PrintToString(ps);
    }
}

// A band (sliding): with the AVX-512 diagonal kernel, each 16 query rows score the union of
// their windows, and nothing more; otherwise 48-row tiles of the band's width.
TEST(SparseCost, SlidingBandScoresSixteenRowsOverTheirOwnKeys) {
  for (const auto& [N, w, causal] : std::vector<std::tuple<int64_t, int64_t, bool>>{
           {4096, 64, false}, {1000, 64, false}, {4096, 64, true}, {777, 5, false}, {300, 0, true}}) {
    const Shape4 s{1, 2, N, 64};
    const auto& info = find_mechanism("sliding");
    auto impl = info.make(AttnProblem{s, causal, Strides3::contiguous(s), 1},
                          resolve_params(info, {"window=" + std::to_string(w)}));
    auto* band = dynamic_cast<SparseAttention*>(impl.get());
    ASSERT_NE(band, nullptr);
    auto lo = [&](int64_t i) { return std::max<int64_t>(i - w, 0); };
    auto hi = [&](int64_t i) { return std::min<int64_t>(causal ? i + 1 : i + w + 1, N); };
#if defined(__AVX512F__)
    constexpr int64_t kRows = 16;
#else
    constexpr int64_t kRows = 48;
#endif
    double scored = 0;
    for (int64_t r0 = 0; r0 < N; r0 += kRows) {
      const int64_t n = std::min(kRows, N - r0);
      scored += static_cast<double>(n * (hi(r0 + n - 1) - lo(r0)));
    }
    EXPECT_DOUBLE_EQ(band->scored_pairs(), scored * 2) << N << " " << w << " " << causal;  // 2 heads
  }
}

TEST(SparseCost, StridedWithSqrtNStrideIsNSqrtN) {
  auto flops = [](int64_t n) {
    const auto& info = find_mechanism("strided");
    const Shape4 s{1, 1, n, 64};
    return info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, resolve_params(info, {"stride=0"}))->flops(Mode::fwd);
  };
  EXPECT_NEAR(flops(16384) / flops(4096), 8.0, 0.1);  // 4x N, 8x work
}

// ---- capabilities and bad input ----
TEST(SparseCaps, LongformerAndBigBirdRefuseCausal) {
  auto e = test::exec("run --attn longformer,bigbird --seq 128 --causal --reps 1 --min-time 0 --format csv", false);
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("SKIPPED: longformer cannot be causal"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("SKIPPED: bigbird cannot be causal"), std::string::npos) << e.out;
}

TEST(SparseCaps, BadParametersExitTwo) {
  struct Bad {
    const char* args;
    const char* message;
  };
  for (Bad b : {Bad{"--attn local --param block=0", "local: parameter block=0 is invalid"},
                Bad{"--attn dilated --param dilation=0", "dilated: parameter dilation=0 is invalid"},
                Bad{"--attn bigbird --seq 1000", "bigbird: N=1000 is not a multiple of block=64"},
                Bad{"--attn strided --param pattern=fixed --param summary=65", "strided: summary=65 exceeds stride=64"},
                Bad{"--attn strided --param pattern=diagonal", "expected one of strided, fixed"}}) {
    auto e = test::exec(std::string("run ") + b.args);
    EXPECT_EQ(e.code, 2) << b.args << ": " << e.out;
    EXPECT_NE(e.out.find(b.message), std::string::npos) << e.out;
  }
}

}  // namespace
}  // namespace ab
