// Routing attention.
// sinkhorn: one block reduces to vanilla; P doubly stochastic; P and the output equal the formula
// beside the kernel (ref::sinkhorn_sort, ref::sinkhorn); gradients (through the attention, the sort, the Sinkhorn
// iterations and the sorting network) against finite differences; memory, FLOPs, bad input.
// reformer: one bucket and one chunk is dense shared-QK attention with the self-exclusion rule;
// otherwise it equals its formula beside the kernel (ref::reformer), which builds each query's
// admissible set from the dumped buckets; the buckets are the argmax of the dumped rotations; causal ignores later positions;
// gradients against finite differences; memory, FLOPs, bad input. The exact hash on its own:
// random, planted near-tie, exactly tied and degenerate rows against a double argmax, with the
// AVX2 and portable paths giving the same buckets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "attention_impls/lsh_hash.hpp"
#include "core/rng.hpp"
#include "tests/helpers.hpp"

namespace ab {
namespace {

using test::exec;
using test::Run;
using test::run_mechanism;
using test::tensor;

double max_diff(const Tensor& a, const Tensor& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, double(std::abs(a.data()[i] - b.data()[i])));
  return w;
}

double max_diff(const Tensor& a, const std::vector<double>& want) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(double(a.data()[i]) - want[i]));
  return w;
}

TEST(Sinkhorn, OneBlockEqualsVanillaForwardAndBackward) {
  for (int64_t n : {16, 64}) {
    const Shape4 s{2, 3, n, 16};
    auto sk = run_mechanism("sinkhorn", s, false, Mode::fwdbwd, {"block=" + std::to_string(n)}, 3);
    auto va = run_mechanism("vanilla", s, false, Mode::fwdbwd, {}, 3);
    EXPECT_LT(max_diff(sk.data->o, va.data->o), 2e-6) << n;
    EXPECT_LT(max_diff(sk.data->dq, va.data->dq), 2e-5) << n;
    EXPECT_LT(max_diff(sk.data->dk, va.data->dk), 2e-5) << n;
    EXPECT_LT(max_diff(sk.data->dv, va.data->dv), 2e-5) << n;
  }
}

TEST(Sinkhorn, PIsDoublyStochastic) {
  // The defaults (8 iterations at temperature 0.75), and a low temperature, whose sharper logits
  // need more iterations to balance (8 leave rows off by ~1e-2 there).
  for (const std::vector<std::string>& t : {std::vector<std::string>{"block=32"},
                                             std::vector<std::string>{"block=32", "temperature=0.05", "sinkhorn_iters=60"}}) {
    const Shape4 s{2, 2, 512, 32};
    auto r = run_mechanism("sinkhorn", s, false, Mode::fwd, t, 4);
    const DumpTensor P = tensor(*r.impl, "P");
    ASSERT_EQ(P.shape, (std::vector<int64_t>{2, 2, 16, 16}));
    const int64_t nb = 16;
    double worst = 0, spread = 0;
    for (int64_t m = 0; m < 4; ++m)
      for (int64_t i = 0; i < nb; ++i) {
        double row = 0, col = 0;
        for (int64_t j = 0; j < nb; ++j) {
          row += P.f32[(m * nb + i) * nb + j];
          col += P.f32[(m * nb + j) * nb + i];
          spread = std::max(spread, std::abs(double(P.f32[(m * nb + i) * nb + j]) - 1.0 / nb));
        }
        worst = std::max({worst, std::abs(row - 1), std::abs(col - 1)});
      }
    EXPECT_LT(worst, 1e-4) << t.back();
    EXPECT_GT(spread, 1e-4) << t.back() << ": P is uniform, the test would not see a sort";
  }
}

// The sorting matrix from the block means, the sorting network and the Sinkhorn iterations, and
// the output over [K_b ; K~_b], as the formula beside the kernel computes them in double.
TEST(Sinkhorn, MatchesItsFormula) {
  for (const char* t : {"temperature=0.75", "temperature=0.05"}) {
    const Shape4 s{2, 2, 96, 16};
    const int64_t nb = 6;
    const std::vector<std::string> ps = {"block=16", t};
    auto r = run_mechanism("sinkhorn", s, false, Mode::fwd, ps, 9);
    const DumpTensor P = tensor(*r.impl, "P"), W1 = tensor(*r.impl, "W1"), W2 = tensor(*r.impl, "W2");
    const double temperature = std::stod(std::string(t).substr(12));
    double worst_p = 0;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h) {
        const auto want = ref::sinkhorn_sort(r.data->q.view(), b, h, W1.f32, W2.f32, 16, 8, temperature);
        for (int64_t x = 0; x < nb * nb; ++x)
          worst_p = std::max(worst_p, std::abs(want[x] - P.f32[(b * s.H + h) * nb * nb + x]));
      }
    EXPECT_LT(worst_p, 1e-5) << t;
    EXPECT_LT(max_diff(r.data->o, test::formula("sinkhorn", ps, *r.impl, r.data->args())), 2e-5) << t;
  }
}

// Finite differences of the whole mechanism: a low temperature makes P depend visibly on Q,
// so the path through the sorting network and the Sinkhorn iterations carries real gradient.
class SinkhornFiniteDifferences : public ::testing::TestWithParam<std::vector<std::string>> {};
TEST_P(SinkhornFiniteDifferences, GradientsMatch) {
  const Shape4 s{1, 2, 24, 8};
  auto r = run_mechanism("sinkhorn", s, false, Mode::fwdbwd, GetParam(), 5);
  EXPECT_GT(test::check_gradients_by_differences(r, 2, 2e-3, 1e-2, 1e-2f), 250);
}
INSTANTIATE_TEST_SUITE_P(All, SinkhornFiniteDifferences,
                         ::testing::Values(std::vector<std::string>{"block=8"},
                                           std::vector<std::string>{"block=8", "temperature=0.05"},
                                           std::vector<std::string>{"block=6", "temperature=0.1", "sinkhorn_iters=3"},
                                           std::vector<std::string>{"block=8", "sinkhorn_iters=0"}));

// Only the sort links one block's queries to another block's output: moving a query of block 0
// must move the outputs of the other blocks (the sort is not a no-op).
TEST(Sinkhorn, OtherBlocksDependOnAQueryThroughTheSort) {
  const Shape4 s{1, 1, 32, 8};
  auto r = run_mechanism("sinkhorn", s, false, Mode::fwd, {"block=8", "temperature=0.05"}, 5);
  const std::vector<float> o0(r.data->o.data(), r.data->o.data() + r.data->o.size());
  AttnArgs a = r.data->args();
  a.q.at(0, 0, 3, 2) += 0.5f;
  r.impl->forward(a);
  double moved = 0;
  for (int64_t i = 8; i < 32; ++i)
    for (int64_t d = 0; d < 8; ++d) moved = std::max(moved, double(std::abs(a.o.at(0, 0, i, d) - o0[static_cast<size_t>(i * 8 + d)])));
  EXPECT_GT(moved, 1e-5);
}

TEST(Sinkhorn, TrackedPeakEqualsDeclaredAndCostsScaleAsStated) {
  for (Mode mode : {Mode::fwd, Mode::fwdbwd})
    for (int64_t n : {64, 256}) {
      auto r = run_mechanism("sinkhorn", Shape4{1, 2, n, 16}, false, mode, {"block=16"}, 1, 2);
      EXPECT_EQ(r.tracked_peak, r.declared) << to_string(mode) << " N=" << n;
    }
  const auto& info = find_mechanism("sinkhorn");
  auto flops = [&](int64_t n, Mode mode) {
    const Shape4 s{1, 8, n, 64};
    return info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, resolve_params(info, {}))->flops(mode);
  };
  // N = 4096, block 64, nb 64, D 64, per head: attention 8 N b D, sort 4 nb N D, network 2 nb D² + 2 nb² D.
  const double N = 4096, b = 64, nb = 64, D = 64;
  EXPECT_DOUBLE_EQ(flops(4096, Mode::fwd), 8 * (8 * N * b * D + 4 * nb * N * D + 2 * nb * D * D + 2 * nb * nb * D));
}

TEST(Sinkhorn, BadInputAndCausal) {
  auto e = exec("run --attn sinkhorn --seq 100 --reps 1 --min-time 0");
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("N=100 is not a multiple of block=64"), std::string::npos) << e.out;
  e = exec("run --attn sinkhorn --param sinkhorn_iters=-1");
  EXPECT_EQ(e.code, 2) << e.out;
  e = exec("run --attn sinkhorn --param temperature=0");
  EXPECT_EQ(e.code, 2) << e.out;
  e = exec("run --attn sinkhorn --seq 128 --heads 1 --dhead 16 --reps 1 --min-time 0 --causal --format csv", false);
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("SKIPPED: sinkhorn cannot be causal"), std::string::npos) << e.out;
}

// ---- reformer ----

// With one bucket and one chunk, reformer is dense attention of Q against the normalised Q,
// each query excluded from its own keys. Q's rows are flipped to the positive side of the single
// rotation column (n_buckets = 2), which puts every position in bucket 0.
TEST(Reformer, OneBucketOneChunkEqualsDenseSharedQKWithoutSelf) {
  for (bool causal : {false, true}) {
    const Shape4 s{2, 2, 32, 8};
    const std::vector<std::string> prm{"bucket_size=32", "n_buckets=2", "n_hashes=1"};
    auto r = run_mechanism("reformer", s, causal, Mode::fwd, prm, 3);
    const DumpTensor rot = tensor(*r.impl, "rotations");
    ASSERT_EQ(rot.shape, (std::vector<int64_t>{1, 2, 8, 1}));
    TensorView q = r.data->q.view();
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t i = 0; i < s.N; ++i) {
          double proj = 0;
          for (int64_t d = 0; d < s.D; ++d) proj += double(q.at(b, h, i, d)) * rot.f32[h * s.D + d];
          if (proj < 0)
            for (int64_t d = 0; d < s.D; ++d) q.at(b, h, i, d) = -q.at(b, h, i, d);
        }
    r.impl->forward(r.data->args());
    const DumpTensor bk = tensor(*r.impl, "buckets");
    for (int64_t i = 0; i < s.B * s.H * s.N; ++i) ASSERT_EQ(bk.i64[i], 0) << i;
    // Dense: softmax over all j != i (j < i when causal; position 0 causal has only itself).
    const TensorView v = r.data->v.view(), o = r.data->o.view();
    double worst = 0;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t i = 0; i < s.N; ++i) {
          std::vector<int64_t> keys;
          for (int64_t j = 0; j < s.N; ++j)
            if (j != i && (!causal || j < i)) keys.push_back(j);
          if (keys.empty()) keys.push_back(i);
          std::vector<double> w;
          double mx = -1e300, sum = 0;
          for (int64_t j : keys) {
            double dq = 0, nn = 0;
            for (int64_t d = 0; d < s.D; ++d) {
              dq += double(q.at(b, h, i, d)) * q.at(b, h, j, d);
              nn += double(q.at(b, h, j, d)) * q.at(b, h, j, d);
            }
            w.push_back(dq / std::sqrt(nn) / std::sqrt(double(s.D)));
            mx = std::max(mx, w.back());
          }
          for (double& x : w) sum += (x = std::exp(x - mx));
          for (int64_t d = 0; d < s.D; ++d) {
            double want = 0;
            for (size_t t = 0; t < keys.size(); ++t) want += w[t] / sum * v.at(b, h, keys[t], d);
            worst = std::max(worst, std::abs(want - o.at(b, h, i, d)));
          }
        }
    EXPECT_LT(worst, 2e-6) << "causal=" << causal;
  }
}

// ---- the exact hash on its own (attention_impls/lsh_hash.hpp) ----

struct HashRun {
  std::vector<int64_t> fast, portable;  // (rounds, rows) from assign and assign_portable
  int64_t exact_fast = 0, exact_portable = 0;
};
// Both paths of one RotationHash over x (rows, D), and every bucket checked against the
// reference; returns the run for further checks.
HashRun check_hash(const std::vector<float>& R, int64_t rounds, int64_t D, int64_t half, const std::vector<float>& x,
                   int64_t rows) {
  const RotationHash hash(R.data(), D * half, rounds, D, half);
  Buffer<std::byte> scratch(RotationHash::scratch_bytes(D, half));
  HashRun run;
  run.fast.assign(static_cast<size_t>(rounds * rows), -1);
  run.portable = run.fast;
  std::vector<float> inv(static_cast<size_t>(rows));
  inverse_norms(x.data(), D, rows, D, inv.data());
  run.exact_fast = hash.assign(x.data(), D, rows, inv.data(), scratch.data(), run.fast.data(), rows);
  run.exact_portable = hash.assign_portable(x.data(), D, rows, inv.data(), scratch.data(), run.portable.data(), rows);
  EXPECT_EQ(run.fast, run.portable) << "D=" << D << " half=" << half;
  EXPECT_EQ(run.exact_fast, run.exact_portable);
  int mismatches = 0;
  for (int64_t r = 0; r < rounds; ++r)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t want = ref::reformer_bucket(x.data() + i * D, R.data() + r * D * half, D, half);
      if (run.fast[r * rows + i] != want && ++mismatches <= 5)
        ADD_FAILURE() << "D=" << D << " half=" << half << " round " << r << " row " << i << ": "
                      << run.fast[r * rows + i] << ", want " << want;
    }
  EXPECT_EQ(mismatches, 0);
  return run;
}

std::vector<float> normal(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng(seed).fill_normal(v.data(), n);
  return v;
}

// Random rows over shapes that cover odd D (a half-empty last pair), D = 1, one column, column
// counts below, at and above the 6-column step, and row counts that leave partial 16-row groups
// and 64-row blocks; some rows scaled by 1e-20 (still quantised) or 1e30 (their squared norm
// overflows float: the exact path).
TEST(RotationHash, RandomRowsAreTheDoubleArgmaxOnBothPaths) {
  struct Case {
    int64_t D, half, rows;
  };
  for (const Case c : {Case{64, 128, 200}, Case{16, 4, 64}, Case{7, 3, 33}, Case{1, 1, 17}, Case{1, 5, 40},
                       Case{33, 50, 100}, Case{64, 1, 20}, Case{64, 13, 150}}) {
    const int64_t rounds = 3;
    const std::vector<float> R = normal(rounds * c.D * c.half, 11 + c.D);
    std::vector<float> x = normal(c.rows * c.D, 12 + c.half);
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t k = 0; k < c.D; ++k) x[i * c.D + k] *= i % 11 == 4 ? 1e-20f : i % 11 == 7 ? 1e30f : 1.0f;
    const HashRun run = check_hash(R, rounds, c.D, c.half, x, c.rows);
    // Rows scaled by 1e30 always take the exact path; with several columns, a random row
    // rarely does (about 1% at D = 64, half = 128).
    const int64_t huge = (c.rows + 3) / 11;
    EXPECT_GE(run.exact_fast, rounds * huge) << c.D << " " << c.half;
    if (c.half >= 4) {
      EXPECT_LT(run.exact_fast, rounds * (huge + c.rows / 4)) << c.D << " " << c.half;
    }
  }
}

// Rows planted so that two columns' projections differ by about 1e-7 of their size, far inside
// the integer estimate's error: the estimate alone would pick the wrong one about half the time,
// so the buckets only match the reference if the gap test sends these rows to the exact path.
TEST(RotationHash, PlantedNearTiesTakeTheExactPath) {
  const int64_t D = 64, half = 16, rows = 96;
  const std::vector<float> R = normal(D * half, 21);
  std::vector<float> x(static_cast<size_t>(rows * D));
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t a = i % half, b = (i + 1 + i / half) % half;
    double uw = 0, ww = 0;  // u = r_a + r_b, w = r_a - r_b: x = u + t w has x·w = delta
    for (int64_t k = 0; k < D; ++k) {
      const double ra = R[k * half + a], rb = R[k * half + b];
      uw += (ra + rb) * (ra - rb);
      ww += (ra - rb) * (ra - rb);
    }
    const double delta = 1e-6 * double((i % 3) - 1), t = (delta - uw) / ww, sign = i % 2 ? -1.0 : 1.0;
    for (int64_t k = 0; k < D; ++k) {
      const double ra = R[k * half + a], rb = R[k * half + b];
      x[i * D + k] = static_cast<float>(sign * ((ra + rb) + t * (ra - rb)));
    }
  }
  const HashRun run = check_hash(R, 1, D, half, x, rows);
  EXPECT_GE(run.exact_fast, rows * 9 / 10);
}

// Columns that tie exactly: column 2 repeats column 0, column 3 is minus column 1. The first
// index of [x·R ; -x·R] wins: bucket 0, never 2 or half + 2; for the pair (1, 3), whichever is
// positive, in the first half.
TEST(RotationHash, ExactTiesTakeTheFirstIndex) {
  const int64_t D = 8, half = 6, rows = 300;
  std::vector<float> R = normal(D * half, 31);
  for (int64_t k = 0; k < D; ++k) {
    R[k * half + 2] = R[k * half + 0];
    R[k * half + 3] = -R[k * half + 1];
  }
  const std::vector<float> x = normal(rows * D, 32);
  const HashRun run = check_hash(R, 1, D, half, x, rows);
  std::set<int64_t> seen(run.fast.begin(), run.fast.end());
  EXPECT_TRUE(seen.count(0) && seen.count(1) && seen.count(3) && seen.count(half)) << "the tie cases did not occur";
  EXPECT_FALSE(seen.count(2) || seen.count(half + 1) || seen.count(half + 2) || seen.count(half + 3));
}

// Zero, NaN, infinite and overflowing rows all take the exact path; zero and NaN rows get bucket 0.
TEST(RotationHash, DegenerateRows) {
  const int64_t D = 16, half = 10, rows = 6;
  const std::vector<float> R = normal(D * half, 41);
  std::vector<float> x = normal(rows * D, 42);
  for (int64_t k = 0; k < D; ++k) {
    x[0 * D + k] = 0.0f;
    x[1 * D + k] = std::numeric_limits<float>::quiet_NaN();
    x[3 * D + k] *= 1e30f;
  }
  x[2 * D + 5] = std::numeric_limits<float>::infinity();
  const HashRun run = check_hash(R, 1, D, half, x, rows);
  EXPECT_EQ(run.fast[0], 0);
  EXPECT_EQ(run.fast[1], 0);
  EXPECT_GE(run.exact_fast, 4);
}

// The dumped buckets are exactly argmax([q·R ; -q·R]) of the dumped rotations, computed in
// double, and every bucket is used. Zero query rows tie everywhere and take bucket 0 (the first
// index). The shapes cover the hash's blocks of 64 rows, partial 16-row groups, and column counts
// that are and are not multiples of its 6-column step.
struct BucketCase {
  int64_t N, n_buckets, bucket_size;
};
class ReformerBuckets : public ::testing::TestWithParam<BucketCase> {};
TEST_P(ReformerBuckets, AreTheArgmaxOfTheDumpedRotations) {
  const auto& c = GetParam();
  const int64_t H = 2, D = 16, R = 3, half = c.n_buckets / 2;
  const Shape4 s{1, H, c.N, D};
  auto r = run_mechanism("reformer", s, false, Mode::fwd,
                         {"bucket_size=" + std::to_string(c.bucket_size), "n_buckets=" + std::to_string(c.n_buckets),
                          "n_hashes=" + std::to_string(R)},
                         4);
  const TensorView q = r.data->q.view();
  auto zero_row = [](int64_t i) { return i % 17 == 3; };
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < c.N; ++i)
      if (zero_row(i))
        for (int64_t d = 0; d < D; ++d) q.data[((h * c.N) + i) * D + d] = 0.0f;
  r.impl->forward(r.data->args());
  const DumpTensor rot = tensor(*r.impl, "rotations"), bk = tensor(*r.impl, "buckets");
  ASSERT_EQ(rot.shape, (std::vector<int64_t>{R, H, D, half}));
  ASSERT_EQ(bk.shape, (std::vector<int64_t>{1, H, R, c.N}));
  int mismatches = 0;
  std::set<int64_t> used;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t rd = 0; rd < R; ++rd)
      for (int64_t i = 0; i < c.N; ++i) {
        std::vector<double> x(static_cast<size_t>(2 * half));
        for (int64_t k = 0; k < half; ++k) {
          double p = 0;
          for (int64_t d = 0; d < D; ++d) p += double(q.at(0, h, i, d)) * rot.f32[((rd * H + h) * D + d) * half + k];
          x[k] = p;
          x[k + half] = -p;
        }
        const int64_t want = std::max_element(x.begin(), x.end()) - x.begin();
        const int64_t got = bk.i64[(h * R + rd) * c.N + i];
        if (zero_row(i)) {
          EXPECT_EQ(got, 0) << "zero row " << i << " round " << rd;
          continue;
        }
        used.insert(got);
        if (got != want) {
          ++mismatches;
          ADD_FAILURE() << "round " << rd << " position " << i << ": bucket " << got << ", argmax " << want
                        << " (projections " << x[got] << ", " << x[want] << ")";
        }
      }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(used.size(), static_cast<size_t>(c.n_buckets));
}
INSTANTIATE_TEST_SUITE_P(All, ReformerBuckets,
                         ::testing::Values(BucketCase{256, 8, 16},     // four blocks of 64 rows, 4 columns
                                           BucketCase{280, 40, 8},     // a block of 24 rows (16 + 8), 20 columns
                                           BucketCase{90, 12, 10},     // 64 + 26 rows (16 + 10), 6 columns
                                           BucketCase{48, 6, 8},       // one block of 48 rows, 3 columns
                                           BucketCase{320, 100, 8}));  // 50 columns (8 steps of 6, then 2)

struct ReformerCase {
  Shape4 shape;
  bool causal;
  std::vector<std::string> params;
  int64_t bucket_size;
};
class ReformerReference : public ::testing::TestWithParam<ReformerCase> {};
TEST_P(ReformerReference, MatchesAdmissibleSetsFromDumpedBuckets) {
  const auto& c = GetParam();
  auto r = run_mechanism("reformer", c.shape, c.causal, Mode::fwd, c.params, 11);
  EXPECT_LT(max_diff(r.data->o, test::formula("reformer", c.params, *r.impl, r.data->args(), c.causal)), 2e-6);
}
INSTANTIATE_TEST_SUITE_P(
    All, ReformerReference,
    ::testing::Values(
        // several chunks and buckets, one and three rounds
        ReformerCase{{2, 2, 64, 8}, false, {"bucket_size=8", "n_buckets=4", "n_hashes=1"}, 8},
        ReformerCase{{2, 2, 64, 8}, false, {"bucket_size=8", "n_buckets=4", "n_hashes=3"}, 8},
        ReformerCase{{2, 2, 64, 8}, true, {"bucket_size=8", "n_buckets=4", "n_hashes=3"}, 8},
        // many small buckets: queries left with no other key attend themselves
        ReformerCase{{1, 2, 48, 8}, false, {"bucket_size=4", "n_buckets=16", "n_hashes=2"}, 4},
        ReformerCase{{1, 2, 48, 8}, true, {"bucket_size=4", "n_buckets=16", "n_hashes=2"}, 4},
        // two chunks (each the other's previous), and one chunk (no look-back)
        ReformerCase{{1, 3, 32, 8}, true, {"bucket_size=16", "n_buckets=2"}, 16},
        ReformerCase{{1, 3, 16, 8}, false, {"bucket_size=16", "n_buckets=4", "n_hashes=2"}, 16},
        // the defaults: bucket_size 64, N/64 buckets rounded up to even, 4 rounds
        ReformerCase{{1, 2, 192, 16}, false, {}, 64}, ReformerCase{{1, 2, 192, 16}, true, {}, 64}));

// Perturbing the keys and values of later positions leaves earlier outputs exactly alone when
// causal. Keys are the normalised queries: a small perturbation of later query rows that keeps
// every bucket (checked) changes later keys without moving the sort.
TEST(Reformer, CausalNeverUsesALaterPosition) {
  const Shape4 s{1, 2, 64, 8};
  auto r = run_mechanism("reformer", s, true, Mode::fwd, {"bucket_size=8", "n_buckets=4", "n_hashes=3"}, 6);
  const DumpTensor bk = tensor(*r.impl, "buckets");
  const std::vector<int64_t> buckets0(bk.i64, bk.i64 + 2 * 3 * 64);
  const std::vector<float> o0(r.data->o.data(), r.data->o.data() + r.data->o.size());
  AttnArgs a = r.data->args();
  const int64_t t = 29;
  Rng noise(99, 0);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = t + 1; i < 64; ++i)
      for (int64_t d = 0; d < 8; ++d) {
        a.q.at(0, h, i, d) += static_cast<float>(1e-3 * noise.normal());
        a.k.at(0, h, i, d) += 1.0f;
        a.v.at(0, h, i, d) += 1.0f;
      }
  r.impl->forward(a);
  ASSERT_EQ(std::vector<int64_t>(bk.i64, bk.i64 + 2 * 3 * 64), buckets0) << "the perturbation moved a bucket";
  double earlier = 0, later = 0;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 64; ++i)
      for (int64_t d = 0; d < 8; ++d) {
        const double diff = std::abs(a.o.at(0, h, i, d) - o0[static_cast<size_t>((h * 64 + i) * 8 + d)]);
        (i <= t ? earlier : later) = std::max(i <= t ? earlier : later, diff);
      }
  EXPECT_EQ(earlier, 0.0);
  EXPECT_GT(later, 0.1);  // the perturbation was seen where it may be
}

// Finite differences of the whole mechanism; elements whose perturbation moves a bucket (where
// the output jumps) are left out, and dK is zero (K is not an input).
class ReformerFiniteDifferences : public ::testing::TestWithParam<std::tuple<bool, std::vector<std::string>>> {};
TEST_P(ReformerFiniteDifferences, GradientsMatch) {
  const auto& [causal, prm] = GetParam();
  const Shape4 s{1, 2, 32, 8};
  const float eps = 1e-2f;
  auto r = run_mechanism("reformer", s, causal, Mode::fwdbwd, prm, 5);
  for (size_t i = 0; i < r.data->dk.size(); ++i) ASSERT_EQ(r.data->dk.data()[i], 0.0f);
  const DumpTensor bk = tensor(*r.impl, "buckets");
  const size_t nb = static_cast<size_t>(bk.shape[0] * bk.shape[1] * bk.shape[2] * bk.shape[3]);
  int skipped = 0;
  const auto moves_a_bucket =
      test::skip_where_state_moves(r, eps, [&] { return std::vector<int64_t>(bk.i64, bk.i64 + nb); }, &skipped);
  EXPECT_GT(test::check_gradients_by_differences(r, 1, 2e-3, 1e-2, eps, moves_a_bucket), 1400);
  EXPECT_LT(skipped, 60);
}
INSTANTIATE_TEST_SUITE_P(
    All, ReformerFiniteDifferences,
    ::testing::Values(std::tuple{false, std::vector<std::string>{"bucket_size=8", "n_buckets=4", "n_hashes=2"}},
                      std::tuple{true, std::vector<std::string>{"bucket_size=8", "n_buckets=4", "n_hashes=2"}},
                      std::tuple{false, std::vector<std::string>{"bucket_size=4", "n_buckets=8", "n_hashes=3"}},
                      std::tuple{true, std::vector<std::string>{"bucket_size=32", "n_buckets=2", "n_hashes=1"}},
                      // two chunks: chunk 0's wrapped previous chunk is also the next chunk,
                      // so the last chunk's key gradients arrive from both of the window's halves
                      std::tuple{false, std::vector<std::string>{"bucket_size=16", "n_buckets=2", "n_hashes=2"}}));

TEST(Reformer, TrackedPeakEqualsDeclaredAndFlopsAreAnalytic) {
  for (Mode mode : {Mode::fwd, Mode::fwdbwd})
    for (int64_t n : {64, 256})
      for (int threads : {1, 2}) {
        auto r = run_mechanism("reformer", Shape4{1, 2, n, 16}, false, mode, {"bucket_size=16"}, 1, threads);
        EXPECT_EQ(r.tracked_peak, r.declared) << to_string(mode) << " N=" << n << " threads=" << threads;
      }
  const auto& info = find_mechanism("reformer");
  auto flops = [&](int64_t n, Mode mode, const std::vector<std::string>& prm) {
    const Shape4 s{1, 8, n, 64};
    return info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, resolve_params(info, prm))->flops(mode);
  };
  // N = 4096, defaults: 64 buckets (32 rotation columns), 4 rounds, windows of 128 keys.
  const double N = 4096, D = 64;
  const double hash = 2 * N * D * 32, attention = 4 * N * 128 * D;
  EXPECT_DOUBLE_EQ(flops(4096, Mode::fwd, {}), 8 * 4 * (hash + attention));
  EXPECT_DOUBLE_EQ(flops(4096, Mode::fwdbwd, {}), 8 * 4 * (hash + 3.5 * attention));
  // One chunk: a window of bucket_size keys; an odd N/bucket_size rounds n_buckets up to even.
  EXPECT_DOUBLE_EQ(flops(64, Mode::fwd, {"n_hashes=1"}), 8 * (2 * 64 * D * 1 + 4 * 64 * 64 * D));
  EXPECT_DOUBLE_EQ(flops(192, Mode::fwd, {"n_hashes=1"}), 8 * (2 * 192 * D * 2 + 4 * 192 * 128 * D));
}

TEST(Reformer, BadInputExitsTwo) {
  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"--seq 100", "N=100 is not a multiple of bucket_size=64"},
           {"--seq 128 --param n_buckets=3", "n_buckets=3 must be even"},
           {"--seq 128 --param n_hashes=0", "n_hashes=0 is invalid"},
           {"--seq 128 --param bucket_size=0", "bucket_size=0 is invalid"},
           {"--seq 64 --heads 1 --dhead 65538", "D=65538 is above 65536"}}) {
    auto e = exec("run --attn reformer --reps 1 --min-time 0 " + args);
    EXPECT_EQ(e.code, 2) << args << ": " << e.out;
    EXPECT_NE(e.out.find(msg), std::string::npos) << e.out;
  }
  auto e = exec("run --attn reformer --seq 128 --heads 1 --dhead 16 --reps 1 --min-time 0 --causal --mode fwdbwd --format csv", false);
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find(",OK,"), std::string::npos) << e.out;
}

// ---- routing (the Routing Transformer) ----

// dist(i, c) = x_i . mu_c in double from the dumped centroids.
double routing_score(const Run& r, int64_t b, int64_t h, int64_t i, int64_t c) {
  const DumpTensor mu = tensor(*r.impl, "centroids");
  const TensorView q = r.data->q.view();
  const int64_t D = q.shape.D, k = mu.shape[1];
  double n2 = 0, d = 0;
  for (int64_t x = 0; x < D; ++x) n2 += double(q.at(b, h, i, x)) * q.at(b, h, i, x);
  for (int64_t x = 0; x < D; ++x) d += double(q.at(b, h, i, x)) * mu.f32[(h * k + c) * D + x];
  return d / std::sqrt(n2);
}

struct RoutingCase {
  Shape4 shape;
  bool causal;
  std::vector<std::string> params;
  int64_t window;
};
void PrintTo(const RoutingCase& c, std::ostream* os) {
  *os << "N=" << c.shape.N << " H=" << c.shape.H << (c.causal ? " causal " : " ") << ::testing::PrintToString(c.params);
}
class RoutingEqualsReference : public ::testing::TestWithParam<RoutingCase> {};
TEST_P(RoutingEqualsReference, OutputAndRouting) {
  const RoutingCase& c = GetParam();
  auto r = run_mechanism("routing", c.shape, c.causal, Mode::fwd, c.params, 11);
  EXPECT_LT(max_diff(r.data->o, test::formula("routing", c.params, *r.impl, r.data->args(), c.causal)), 2e-6);
  // The routing itself: every position's nearest centroid, and each centroid's members its
  // top-window positions (within float rounding of the double scores), in position order.
  const DumpTensor as = tensor(*r.impl, "assignment"), mu = tensor(*r.impl, "centroids");
  const int64_t k = mu.shape[1], N = c.shape.N;
  for (int64_t b = 0; b < c.shape.B; ++b)
    for (int64_t h = 0; h < c.shape.H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        const int64_t got = as.i64[(b * c.shape.H + h) * N + i];
        for (int64_t cc = 0; cc < k; ++cc)
          ASSERT_LE(routing_score(r, b, h, i, cc), routing_score(r, b, h, i, got) + 1e-6) << i;
      }
  if (c.causal) return;
  const DumpTensor mem = tensor(*r.impl, "members");
  for (int64_t b = 0; b < c.shape.B; ++b)
    for (int64_t h = 0; h < c.shape.H; ++h)
      for (int64_t cc = 0; cc < k; ++cc) {
        const int64_t* m = mem.i64 + ((b * c.shape.H + h) * k + cc) * c.window;
        std::set<int64_t> in(m, m + c.window);
        ASSERT_EQ(in.size(), size_t(c.window));
        ASSERT_TRUE(std::is_sorted(m, m + c.window));
        double lowest_in = 1e300, highest_out = -1e300;
        for (int64_t i = 0; i < N; ++i)
          (in.count(i) ? lowest_in : highest_out) = in.count(i) ? std::min(lowest_in, routing_score(r, b, h, i, cc))
                                                                : std::max(highest_out, routing_score(r, b, h, i, cc));
        EXPECT_GE(lowest_in, highest_out - 1e-6) << cc;
      }
}
INSTANTIATE_TEST_SUITE_P(
    All, RoutingEqualsReference,
    ::testing::Values(RoutingCase{{2, 2, 64, 16}, false, {}, 8},  // defaults: 8 clusters of 8
                      RoutingCase{{2, 2, 64, 16}, true, {}, 8},
                      RoutingCase{{1, 2, 100, 8}, false, {"clusters=7"}, 15},  // overlapping clusters, some positions in none
                      RoutingCase{{1, 2, 100, 8}, true, {"clusters=3", "window=16"}, 16},  // windows across tile edges
                      RoutingCase{{1, 3, 48, 16}, false, {"clusters=4", "window=5"}, 5},
                      RoutingCase{{1, 1, 40, 8}, true, {"clusters=2", "window=1"}, 1}));  // only itself

// One cluster of every position is dense shared query-key attention without self (causal: over
// j < i; position 0 attends itself).
TEST(Routing, OneClusterOfAllEqualsDenseSharedQKWithoutSelf) {
  for (bool causal : {false, true}) {
    const Shape4 s{2, 2, 32, 8};
    auto r = run_mechanism("routing", s, causal, Mode::fwdbwd, {"clusters=1", "window=32"}, 3);
    const TensorView q = r.data->q.view(), v = r.data->v.view(), o = r.data->o.view();
    double worst = 0;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t i = 0; i < s.N; ++i) {
          std::vector<double> sc;
          std::vector<int64_t> keys;
          for (int64_t j = 0; j < s.N; ++j)
            if (j != i && (!causal || j < i)) keys.push_back(j);
          if (keys.empty()) keys.push_back(i);
          double mx = -1e300, sum = 0;
          for (int64_t j : keys) {
            double n2 = 0, d = 0;
            for (int64_t c = 0; c < s.D; ++c) n2 += double(q.at(b, h, j, c)) * q.at(b, h, j, c);
            for (int64_t c = 0; c < s.D; ++c) d += double(q.at(b, h, i, c)) * q.at(b, h, j, c);
            sc.push_back(d / std::sqrt(n2) / std::sqrt(double(s.D)));
            mx = std::max(mx, sc.back());
          }
          for (double x : sc) sum += std::exp(x - mx);
          for (int64_t c = 0; c < s.D; ++c) {
            double want = 0;
            for (size_t x = 0; x < keys.size(); ++x) want += std::exp(sc[x] - mx) / sum * v.at(b, h, keys[x], c);
            worst = std::max(worst, std::abs(want - o.at(b, h, i, c)));
          }
        }
    EXPECT_LT(worst, 2e-6) << causal;
  }
}

// Finite differences of the whole mechanism (dK is zero: K is not an input); elements whose
// perturbation moves the routing are left out.
class RoutingFiniteDifferences : public ::testing::TestWithParam<std::tuple<bool, std::vector<std::string>>> {};
TEST_P(RoutingFiniteDifferences, GradientsMatch) {
  const auto& [causal, prm] = GetParam();
  const Shape4 s{1, 2, 32, 8};
  const float eps = 1e-2f;
  auto r = run_mechanism("routing", s, causal, Mode::fwdbwd, prm, 5);
  for (size_t i = 0; i < r.data->dk.size(); ++i) ASSERT_EQ(r.data->dk.data()[i], 0.0f);
  auto routing_now = [&]() {
    const DumpTensor as = tensor(*r.impl, "assignment");
    std::vector<int64_t> v(as.i64, as.i64 + s.B * s.H * s.N);
    if (!causal) {
      const DumpTensor mem = tensor(*r.impl, "members");
      v.insert(v.end(), mem.i64, mem.i64 + mem.shape[0] * mem.shape[1] * mem.shape[2] * mem.shape[3]);
    }
    return v;
  };
  int skipped = 0;
  const auto moves_the_routing = test::skip_where_state_moves(r, eps, routing_now, &skipped);
  EXPECT_GT(test::check_gradients_by_differences(r, 1, 2e-3, 1e-2, eps, moves_the_routing), 1400);
  EXPECT_LT(skipped, 80);
}
INSTANTIATE_TEST_SUITE_P(All, RoutingFiniteDifferences,
                         ::testing::Values(std::tuple{false, std::vector<std::string>{"clusters=4", "window=8"}},
                                           std::tuple{true, std::vector<std::string>{"clusters=4", "window=8"}},
                                           std::tuple{false, std::vector<std::string>{"clusters=3", "window=6"}},
                                           std::tuple{true, std::vector<std::string>{"clusters=2", "window=5"}}));

// Training moves the centroids by the moving average of the rule, from the routing the forward
// call used; evaluation (and a training forward at decay 1) leaves them where they are.
TEST(Routing, TrainingUpdatesCentroidsByTheMovingAverageAndEvaluationDoesNot) {
  for (bool causal : {false, true}) {
    const Shape4 s{3, 2, 48, 8};
    const float decay = 0.75f;
    auto r = run_mechanism("routing", s, causal, Mode::fwdbwd, {"clusters=5", "decay=0.75"}, 9);
    const DumpTensor mu = tensor(*r.impl, "centroids"), as = tensor(*r.impl, "assignment");
    const int64_t k = 5, D = s.D;
    const std::vector<float> before(mu.f32, mu.f32 + s.H * k * D);
    r.impl->forward(r.data->args());  // not training
    EXPECT_EQ(std::vector<float>(mu.f32, mu.f32 + s.H * k * D), before);
    r.impl->set_training(true);
    r.impl->forward(r.data->args());
    r.impl->set_training(false);
    const TensorView q = r.data->q.view();
    double worst = 0;
    int moved = 0;
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t c = 0; c < k; ++c) {
        std::vector<double> m(D, 0);
        int64_t n = 0;
        for (int64_t b = 0; b < s.B; ++b)
          for (int64_t i = 0; i < s.N; ++i) {
            if (as.i64[(b * s.H + h) * s.N + i] != c) continue;
            double n2 = 0;
            for (int64_t d = 0; d < D; ++d) n2 += double(q.at(b, h, i, d)) * q.at(b, h, i, d);
            for (int64_t d = 0; d < D; ++d) m[d] += q.at(b, h, i, d) / std::sqrt(n2);
            ++n;
          }
        double norm = 0;
        for (double x : m) norm += x * x;
        norm = std::sqrt(norm);
        for (int64_t d = 0; d < D; ++d) {
          const size_t at = static_cast<size_t>((h * k + c) * D + d);
          const double want = n ? decay * before[at] + (1 - decay) * m[d] / norm : before[at];
          worst = std::max(worst, std::abs(want - mu.f32[at]));
        }
        moved += n > 0;
      }
    EXPECT_LT(worst, 1e-6) << causal;
    EXPECT_GT(moved, 2 * 2);
    auto fixed = run_mechanism("routing", s, causal, Mode::fwdbwd, {"clusters=5", "decay=1"}, 9);
    const DumpTensor mu1 = tensor(*fixed.impl, "centroids");
    const std::vector<float> first(mu1.f32, mu1.f32 + s.H * k * D);
    fixed.impl->set_training(true);
    fixed.impl->forward(fixed.data->args());
    EXPECT_EQ(std::vector<float>(mu1.f32, mu1.f32 + s.H * k * D), first);
  }
}

TEST(Routing, TrackedPeakEqualsDeclaredAndFlopsAreAnalytic) {
  for (bool causal : {false, true})
    for (Mode mode : {Mode::fwd, Mode::fwdbwd})
      for (int64_t n : {64, 200})
        for (int threads : {1, 2}) {
          auto r = run_mechanism("routing", Shape4{2, 2, n, 16}, causal, mode, {}, 1, threads);
          EXPECT_EQ(r.tracked_peak, r.declared) << to_string(mode) << " N=" << n << " threads=" << threads;
        }
  const auto& info = find_mechanism("routing");
  auto flops = [&](int64_t n, bool causal, Mode mode, const std::vector<std::string>& prm) {
    const Shape4 s{1, 8, n, 64};
    return info.make(AttnProblem{s, causal, Strides3::contiguous(s), 1}, resolve_params(info, prm))->flops(mode);
  };
  // N = 4096, defaults: 64 clusters of 64; routing 2 N k D, attention over k·w² pairs (not
  // causal) or N·2w logits (causal).
  const double N = 4096, D = 64, route = 2 * N * 64 * D;
  EXPECT_DOUBLE_EQ(flops(4096, false, Mode::fwd, {}), 8 * (route + 4 * 64.0 * 64 * 64 * D));
  EXPECT_DOUBLE_EQ(flops(4096, false, Mode::fwdbwd, {}), 8 * (route + 3.5 * 4 * 64.0 * 64 * 64 * D));
  EXPECT_DOUBLE_EQ(flops(4096, true, Mode::fwd, {}), 8 * (route + 4 * N * 128 * D));
  // N = 1000: round(sqrt(1000)) = 32 clusters of ceil(1000/32) = 32.
  EXPECT_DOUBLE_EQ(flops(1000, false, Mode::fwd, {}), 8 * (2 * 1000.0 * 32 * D + 4 * 32.0 * 32 * 32 * D));
}

TEST(Routing, BadInputExitsTwo) {
  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"--seq 64 --param clusters=65", "clusters=65 is more than N=64"},
           {"--seq 64 --param window=100", "window=100 is more than N=64"},
           {"--seq 64 --param decay=1.5", "decay=1.5 is invalid"}}) {
    auto e = exec("run --attn routing --reps 1 --min-time 0 " + args);
    EXPECT_EQ(e.code, 2) << args << ": " << e.out;
    EXPECT_NE(e.out.find(msg), std::string::npos) << e.out;
  }
}

}  // namespace
}  // namespace ab
