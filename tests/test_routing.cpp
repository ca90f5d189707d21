// sinkhorn: one block reduces to vanilla; P doubly stochastic; the output equals a direct
// reference built from the dumped P; gradients (through the attention, the sort, the Sinkhorn
// iterations and the sorting network) against finite differences; memory, FLOPs, bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/helpers.hpp"

namespace ab {
namespace {

using test::exec;
using test::run_mechanism;
using test::tensor;

double max_diff(const Tensor& a, const Tensor& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, double(std::abs(a.data()[i] - b.data()[i])));
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

// O from the dumped P: K~ and V~ block by block, then each query block's softmax over
// [K_b ; K~_b], all in double.
TEST(Sinkhorn, MatchesDirectReferenceFromDumpedP) {
  for (const char* t : {"temperature=0.75", "temperature=0.05"}) {
    const Shape4 s{2, 2, 96, 16};
    const int64_t blk = 16, nb = 6, D = s.D;
    auto r = run_mechanism("sinkhorn", s, false, Mode::fwd, {"block=16", t}, 9);
    const DumpTensor P = tensor(*r.impl, "P");
    const TensorView q = r.data->q.view(), k = r.data->k.view(), v = r.data->v.view(), o = r.data->o.view();
    double worst = 0;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h) {
        const float* Pm = P.f32 + (b * s.H + h) * nb * nb;
        for (int64_t i = 0; i < nb; ++i) {
          // keys[j], values[j] for j < 2·blk: the block itself, then its sorted block.
          std::vector<std::vector<double>> keys(2 * blk, std::vector<double>(D)), vals = keys;
          for (int64_t j = 0; j < blk; ++j)
            for (int64_t d = 0; d < D; ++d) {
              keys[j][d] = k.at(b, h, i * blk + j, d);
              vals[j][d] = v.at(b, h, i * blk + j, d);
              double ks = 0, vs = 0;
              for (int64_t c = 0; c < nb; ++c) {
                ks += double(Pm[i * nb + c]) * k.at(b, h, c * blk + j, d);
                vs += double(Pm[i * nb + c]) * v.at(b, h, c * blk + j, d);
              }
              keys[blk + j][d] = ks;
              vals[blk + j][d] = vs;
            }
          for (int64_t rr = 0; rr < blk; ++rr) {
            const int64_t row = i * blk + rr;
            std::vector<double> sc(2 * blk);
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < 2 * blk; ++j) {
              double d = 0;
              for (int64_t c = 0; c < D; ++c) d += double(q.at(b, h, row, c)) * keys[j][c];
              sc[j] = d / std::sqrt(double(D));
              mx = std::max(mx, sc[j]);
            }
            for (auto& x : sc) sum += (x = std::exp(x - mx));
            for (int64_t c = 0; c < D; ++c) {
              double want = 0;
              for (int64_t j = 0; j < 2 * blk; ++j) want += sc[j] / sum * vals[j][c];
              worst = std::max(worst, std::abs(want - o.at(b, h, row, c)));
            }
          }
        }
      }
    EXPECT_LT(worst, 2e-5) << t;
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

}  // namespace
}  // namespace ab
