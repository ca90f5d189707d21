// vanilla and flash against the triple-loop reference: forward, backward, finite differences,
// strided layouts, threads, and their exact working-memory counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "attention_impls/tiled_softmax.hpp"
#include "core/memory.hpp"
#include "tests/helpers.hpp"
#include "tests/reference.hpp"

namespace ab {
namespace {

using test::run_mechanism;

// (mechanism, N, D, causal, threads)
using ExactCase = std::tuple<std::string, int64_t, int64_t, bool, int>;

class ExactVsReference : public ::testing::TestWithParam<ExactCase> {};

TEST_P(ExactVsReference, ForwardAndBackwardMatchTripleLoop) {
  const auto [name, N, D, causal, threads] = GetParam();
  const Shape4 s{2, 2, N, D};
  auto r = run_mechanism(name, s, causal, Mode::fwdbwd, {}, 11, threads);
  const AttnArgs a = r.data->args();
  const auto mask = ref::dense_mask(causal);
  const auto o = ref::forward(a.q, a.k, a.v, mask);
  EXPECT_LT(ref::rel_err(a.o.data, o), 2e-5) << name << " forward N=" << N << " D=" << D;
  const auto g = ref::backward(a.q, a.k, a.v, a.dout, mask);
  EXPECT_LT(ref::rel_err(a.dq.data, g.dq), 1e-4) << name << " dq";
  EXPECT_LT(ref::rel_err(a.dk.data, g.dk), 1e-4) << name << " dk";
  EXPECT_LT(ref::rel_err(a.dv.data, g.dv), 1e-4) << name << " dv";
}

INSTANTIATE_TEST_SUITE_P(
    OddShapes, ExactVsReference,
    ::testing::Combine(::testing::Values("vanilla", "flash"), ::testing::Values(1, 7, 100, 300),
                       ::testing::Values(8, 64), ::testing::Bool(), ::testing::Values(1)));
INSTANTIATE_TEST_SUITE_P(
    TwoThreadsAndOddD, ExactVsReference,
    ::testing::Combine(::testing::Values("vanilla", "flash"), ::testing::Values(129, 513),
                       ::testing::Values(40), ::testing::Bool(), ::testing::Values(2)));

// Every head size the AVX-512 dense kernel takes (16, 32, 64, 128), several key tiles of its 512
// columns with a ragged last one, partial strips of rows: through the kernel where the build has
// it, through the oneDNN tiles elsewhere.
INSTANTIATE_TEST_SUITE_P(
    DenseKernelHeadSizes, ExactVsReference,
    ::testing::Combine(::testing::Values("flash"), ::testing::Values(17, 1100), ::testing::Values(16, 32, 128),
                       ::testing::Bool(), ::testing::Values(1)));

// A two-thread result x equals the same run again (y) bit for bit and one thread's (z) to 1e-5 of
// z's largest value; `what` names the tensor and the case.
template <class T>
void expect_repeats_and_near_one_thread(const std::string& what, const T& x, const T& y, const T& z, size_t n) {
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), sizeof(float) * n)) << what << ": two runs differ";
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, double(std::abs(x.data()[i] - z.data()[i])));
    scale = std::max(scale, double(std::abs(z.data()[i])));
  }
  EXPECT_LT(worst, 1e-5 * scale) << what << ": two threads against one";
}

// On two threads, forward and backward repeat bit for bit from run to run (each work item is one
// thread's, in a fixed order), and equal the one-thread results to float rounding: vanilla's row
// blocks (a ragged last one at N = 513) and flash's tiles, causal and not.
TEST(Exact, TwoThreadsRepeatBitForBitAndEqualOneThread) {
  for (const std::string name : {"vanilla", "flash"})
    for (bool causal : {false, true}) {
      const Shape4 s{1, 3, 513, 64};
      auto first = run_mechanism(name, s, causal, Mode::fwdbwd, {}, 5, 2);
      auto again = run_mechanism(name, s, causal, Mode::fwdbwd, {}, 5, 2);
      auto one = run_mechanism(name, s, causal, Mode::fwdbwd, {}, 5, 1);
      const auto n = static_cast<size_t>(s.numel());
      for (auto [what, x, y, z] : {std::tuple{"o", &first.data->o, &again.data->o, &one.data->o},
                                   std::tuple{"dq", &first.data->dq, &again.data->dq, &one.data->dq},
                                   std::tuple{"dk", &first.data->dk, &again.data->dk, &one.data->dk},
                                   std::tuple{"dv", &first.data->dv, &again.data->dv, &one.data->dv}})
        expect_repeats_and_near_one_thread(name + " " + what + " causal=" + std::to_string(causal), *x, *y, *z, n);
    }
}

// One (b, h) on two threads: the backward cuts its key tiles into two parts of about equal work
// (see TiledSoftmax::key_parts), each with its own dK, dV rows, dQ summed from a partial buffer:
// against the reference, causal and not, with a ragged last tile; bit for bit from run to run;
// within float rounding of one thread; memory as declared (the partial dQ included).
TEST(Exact, BackwardSplitsOneHeadsKeysOverTwoThreads) {
  for (bool causal : {false, true})
    for (int64_t N : {300, 1100}) {
      const Shape4 s{1, 1, N, 64};
      auto two = run_mechanism("flash", s, causal, Mode::fwdbwd, {}, 9, 2);
      auto again = run_mechanism("flash", s, causal, Mode::fwdbwd, {}, 9, 2);
      auto one = run_mechanism("flash", s, causal, Mode::fwdbwd, {}, 9, 1);
      const AttnArgs a = two.data->args();
      const auto g = ref::backward(a.q, a.k, a.v, a.dout, ref::dense_mask(causal));
      EXPECT_LT(ref::rel_err(a.dq.data, g.dq), 1e-4) << "dq N=" << N << " causal=" << causal;
      EXPECT_LT(ref::rel_err(a.dk.data, g.dk), 1e-4) << "dk N=" << N << " causal=" << causal;
      EXPECT_LT(ref::rel_err(a.dv.data, g.dv), 1e-4) << "dv N=" << N << " causal=" << causal;
      EXPECT_EQ(two.tracked_peak, two.declared) << "N=" << N;
      const auto n = static_cast<size_t>(s.numel());
      for (auto [what, x, y, z] : {std::tuple{"dq", &two.data->dq, &again.data->dq, &one.data->dq},
                                   std::tuple{"dk", &two.data->dk, &again.data->dk, &one.data->dk},
                                   std::tuple{"dv", &two.data->dv, &again.data->dv, &one.data->dv}})
        expect_repeats_and_near_one_thread(std::string(what) + " N=" + std::to_string(N) + " causal=" + std::to_string(causal),
                                           *x, *y, *z, n);
    }
}

// The double reference's own gradient against central differences of its loss: the oracle is
// itself checked.
TEST(Reference, GradientMatchesFiniteDifferences) {
  const Shape4 s{1, 1, 5, 4};
  AttnData d(s, 3, true);
  AttnArgs a = d.args();
  for (bool causal : {false, true}) {
    const auto mask = ref::dense_mask(causal);
    const auto g = ref::backward(a.q, a.k, a.v, a.dout, mask);
    for (auto [t, grad] : {std::pair{a.q, &g.dq}, std::pair{a.k, &g.dk}, std::pair{a.v, &g.dv}}) {
      for (int64_t i = 0; i < s.numel(); ++i) {
        const float saved = t.data[i];
        const double eps = 1e-3;
        t.data[i] = saved + static_cast<float>(eps);
        const double lp = ref::loss(a.q, a.k, a.v, a.dout, mask);
        t.data[i] = saved - static_cast<float>(eps);
        const double lm = ref::loss(a.q, a.k, a.v, a.dout, mask);
        t.data[i] = saved;
        // The perturbation actually applied is the float-rounded one.
        const double h = (double(saved + static_cast<float>(eps)) - double(saved - static_cast<float>(eps)));
        EXPECT_NEAR((lp - lm) / h, (*grad)[static_cast<size_t>(i)], 1e-5);
      }
    }
  }
}

// Each mechanism's float32 backward against central differences of its own float32 forward.
class ExactFiniteDifferences : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(ExactFiniteDifferences, GradientsMatch) {
  const auto [name, causal] = GetParam();
  const Shape4 s{1, 2, 9, 16};
  auto r = run_mechanism(name, s, causal, Mode::fwdbwd, {}, 5);
  test::check_gradients_by_differences(r, 7, 2e-3, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Both, ExactFiniteDifferences,
                         ::testing::Combine(::testing::Values("vanilla", "flash"), ::testing::Bool()));

TEST(Exact, BaselinesAgreeWithEachOther) {
  for (bool causal : {false, true}) {
    const Shape4 s{1, 3, 333, 64};
    auto v = run_mechanism("vanilla", s, causal, Mode::fwdbwd, {}, 21);
    auto f = run_mechanism("flash", s, causal, Mode::fwdbwd, {}, 21);
    const auto n = static_cast<size_t>(s.numel());
    EXPECT_LT(nmse(f.data->o.data(), v.data->o.data(), n), 1e-11);
    EXPECT_LT(nmse(f.data->dq.data(), v.data->dq.data(), n), 1e-10);
    EXPECT_LT(nmse(f.data->dk.data(), v.data->dk.data(), n), 1e-10);
    EXPECT_LT(nmse(f.data->dv.data(), v.data->dv.data(), n), 1e-10);
  }
}

// Views with non-contiguous heads: Q, K, V, O laid out (B, N, H, D) as a projection writes them.
TEST(Exact, StridedLayoutMatchesContiguous) {
  const Shape4 s{2, 3, 70, 16};
  const Strides3 st{s.N * s.H * s.D, s.D, s.H * s.D};
  // sinkhorn too: it reads keys and values as one matrix per head, copied when rows are strided.
  for (const std::string name : {"vanilla", "flash", "sinkhorn"}) {
    const std::vector<std::string> params = name == "sinkhorn" ? std::vector<std::string>{"block=14"} : std::vector<std::string>{};
    for (bool causal : {false, true}) {
      if (causal && name == "sinkhorn") continue;
      auto ref_run = run_mechanism(name, s, causal, Mode::fwdbwd, params, 9);
      const AttnArgs c = ref_run.data->args();
      std::vector<Buffer<float>> bufs;
      std::vector<TensorView> views;
      for (const TensorView* src : {&c.q, &c.k, &c.v, &c.o, &c.dout, &c.dq, &c.dk, &c.dv}) {
        bufs.emplace_back(static_cast<size_t>(s.numel()));
        TensorView v{bufs.back().data(), s, st};
        for (int64_t b = 0; b < s.B; ++b)
          for (int64_t h = 0; h < s.H; ++h)
            for (int64_t n = 0; n < s.N; ++n)
              for (int64_t d = 0; d < s.D; ++d) v.at(b, h, n, d) = src->at(b, h, n, d);
        views.push_back(v);
      }
      AttnArgs a{views[0], views[1], views[2], views[3], views[4], views[5], views[6], views[7]};
      const auto& info = find_mechanism(name);
      auto impl = info.make(AttnProblem{s, causal, st, 1}, resolve_params(info, params));
      Rng rng(9, kStreamParams);
      impl->setup(Mode::fwdbwd, rng);
      impl->forward(a);
      impl->backward(a);
      for (auto [got, want] : {std::pair{a.o, c.o}, std::pair{a.dq, c.dq}, std::pair{a.dk, c.dk}, std::pair{a.dv, c.dv}})
        for (int64_t b = 0; b < s.B; ++b)
          for (int64_t h = 0; h < s.H; ++h)
            for (int64_t n = 0; n < s.N; ++n)
              for (int64_t d = 0; d < s.D; ++d)
                ASSERT_NEAR(got.at(b, h, n, d), want.at(b, h, n, d), 1e-5) << name << " causal=" << causal;
    }
  }
}

TEST(Exact, NoRowProducesNaNWithLargeScores) {
  // Scores around 1e3 overflow a naive exp; the online max keeps them finite.
  const Shape4 s{1, 1, 300, 16};
  for (const std::string name : {"vanilla", "flash"}) {
    omp_set_num_threads(1);
    const auto& info = find_mechanism(name);
    auto impl = info.make(AttnProblem{s, true, Strides3::contiguous(s), 1}, ParamValues());
    AttnData d(s, 1, false);
    for (size_t i = 0; i < d.q.size(); ++i) {
      d.q.data()[i] *= 30.0f;
      d.k.data()[i] *= 30.0f;
    }
    Rng rng(1, kStreamParams);
    impl->setup(Mode::fwd, rng);
    impl->forward(d.args());
    for (size_t i = 0; i < d.o.size(); ++i) ASSERT_TRUE(std::isfinite(d.o.data()[i])) << name;
  }
}

// ---- memory: tracked bytes equal the declared count, and grow as the mechanism says ----

TEST(ExactMemory, TrackedPeakEqualsDeclared) {
  for (const std::string name : {"vanilla", "flash"})
    for (Mode mode : {Mode::fwd, Mode::fwdbwd})
      for (int64_t n : {100, 512, 1000})
        for (int threads : {1, 2}) {
          auto r = run_mechanism(name, Shape4{1, 2, n, 32}, false, mode, {}, 1, threads);
          EXPECT_EQ(r.tracked_peak, r.declared) << name << " " << to_string(mode) << " N=" << n;
        }
}

TEST(ExactMemory, VanillaGrowsAsNSquared) {
  const Shape4 base{2, 4, 0, 64};
  for (Mode mode : {Mode::fwd, Mode::fwdbwd}) {
    const size_t per_score = (mode == Mode::fwd ? 1 : 2) * sizeof(float) * base.B * base.H;
    std::vector<size_t> rest;
    for (int64_t n : {256, 512, 1024}) {
      Shape4 s = base;
      s.N = n;
      auto r = run_mechanism("vanilla", s, false, mode);
      ASSERT_EQ(r.tracked_peak, r.declared);
      ASSERT_GE(r.tracked_peak, per_score * n * n);
      rest.push_back(r.tracked_peak - per_score * n * n);
    }
    // What is left beyond the (B, H, N, N) score tensors is oneDNN's scratchpad: bounded and
    // far below one score tensor.
    for (size_t x : rest) EXPECT_LT(x, size_t(1) << 20) << to_string(mode);
  }
}

TEST(ExactMemory, FlashGrowsLinearly) {
  const Shape4 base{2, 4, 0, 64};
  std::vector<size_t> fwd, bwd;
  for (int64_t n : {512, 1024, 2048, 4096}) {
    Shape4 s = base;
    s.N = n;
    fwd.push_back(run_mechanism("flash", s, false, Mode::fwd).tracked_peak);
    auto r = run_mechanism("flash", s, false, Mode::fwdbwd);
    // Saved log-sum-exp and dO.O row sums: two floats per (b, h, row).
    bwd.push_back(r.tracked_peak - 2 * sizeof(float) * base.B * base.H * n);
  }
  for (size_t i = 1; i < fwd.size(); ++i) {
    // The AVX-512 dense kernel keeps the keys transposed (N D floats per head, at these N a
    // whole number of its tiles): exactly that grows with N, nothing else.
    const int64_t n = int64_t{512} << i;
    const size_t keys = TiledSoftmax::dense_kernel(base.D)
                            ? sizeof(float) * static_cast<size_t>(base.B * base.H * base.D * (n - 512))
                            : 0;
    EXPECT_EQ(fwd[i], fwd[0] + keys) << "flash forward working memory beyond the packed keys must not depend on N";
    EXPECT_EQ(bwd[i], bwd[0] + keys) << "flash backward memory beyond 2 floats per row must not depend on N";
  }
}

// flash in bf16 (a build for AVX512-BF16 on a CPU that has it): against the float64 reference of
// the float inputs, within what rounding Q, K, V and P to bf16 (8 bits of mantissa) costs, but
// clearly not float accuracy (the bf16 path really ran); identical at one and two threads.
// vanilla's bf16 path (oneDNN's bf16 matmul) likewise, but with no claim on threads: oneDNN may
// split its products differently at another thread count.
TEST(Bf16, ForwardMatchesReferenceWithinBf16Rounding) {
  if (!TiledSoftmax::dense_bf16_kernel(64) || !cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 build or CPU";
  for (const std::string name : {"flash", "vanilla"})
    for (int64_t D : {16, 32, 64, 128})
      for (int64_t N : {17, 1100})
        for (bool causal : {false, true}) {
          const Shape4 s{2, 2, N, D};
          auto r = run_mechanism(name, s, causal, Mode::fwd, {}, 11, 1, Dtype::bf16);
          const AttnArgs a = r.data->args();
          const auto o = ref::forward(a.q, a.k, a.v, ref::dense_mask(causal));
          const double err = ref::rel_err(a.o.data, o);
          EXPECT_LT(err, 1.5e-2) << name << " D=" << D << " N=" << N << " causal=" << causal;
          EXPECT_GT(err, 1e-4) << name << ": float accuracy, the bf16 path did not run, D=" << D;
          EXPECT_EQ(r.tracked_peak, r.declared) << name << " D=" << D << " N=" << N;
          if (name != "flash") continue;
          auto two = run_mechanism(name, s, causal, Mode::fwd, {}, 11, 2, Dtype::bf16);
          EXPECT_EQ(0, std::memcmp(two.data->o.data(), r.data->o.data(), sizeof(float) * static_cast<size_t>(s.numel())))
              << "two threads differ from one, D=" << D << " N=" << N;
        }
}

// flash's and vanilla's bf16 backward (the same inputs and dO as the float32 backward): dQ, dK, dV each
// within kBf16GradTolerance of the float32 gradients in relative Frobenius norm (rounding Q, K,
// V, dO, P and dS to 8 significant bits; measured at most 0.5% over these shapes), and not equal
// to them (the bf16 products ran); the tracked peak as declared; flash's one and two threads
// identical (whole (b, h) pairs per thread in both). Finite differences stay float32.
TEST(Bf16, FlashAndVanillaBackwardNearFloat32) {
  if (!TiledSoftmax::dense_bf16_kernel(64) || !cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 build or CPU";
  constexpr double kBf16GradTolerance = 2e-2;
  for (const std::string name : {"flash", "vanilla"})
  for (int64_t D : {16, 32, 64, 128})
    for (int64_t N : {17, 300})
      for (bool causal : {false, true}) {
        const Shape4 s{2, 2, N, D};
        auto f32 = run_mechanism(name, s, causal, Mode::fwdbwd, {}, 11, 1, Dtype::f32);
        auto b16 = run_mechanism(name, s, causal, Mode::fwdbwd, {}, 11, 1, Dtype::bf16);
        EXPECT_EQ(b16.tracked_peak, b16.declared) << "D=" << D << " N=" << N;
        const AttnArgs a = f32.data->args(), b = b16.data->args();
        for (auto [got, want, label] : {std::tuple{b.dq.data, a.dq.data, "dq"}, std::tuple{b.dk.data, a.dk.data, "dk"},
                                        std::tuple{b.dv.data, a.dv.data, "dv"}}) {
          const double rel = test::frobenius_diff(got, want, s.numel()) / test::frobenius(want, s.numel());
          EXPECT_LT(rel, kBf16GradTolerance) << label << " D=" << D << " N=" << N << " causal=" << causal;
          EXPECT_GT(rel, 1e-4) << label << ": float32 accuracy, the bf16 tiles did not run, D=" << D;
          std::printf("[ bf16     ] %s %s D=%ld N=%ld causal=%d: %.4f\n", name.c_str(), label, static_cast<long>(D), static_cast<long>(N),
                      causal, rel);
        }
        if (name != "flash") continue;  // oneDNN may split vanilla's products otherwise at two threads
        auto two = run_mechanism("flash", s, causal, Mode::fwdbwd, {}, 11, 2, Dtype::bf16);
        for (auto [x, y] : {std::pair{two.data->args().dq.data, b.dq.data}, std::pair{two.data->args().dk.data, b.dk.data},
                            std::pair{two.data->args().dv.data, b.dv.data}})
          EXPECT_EQ(0, std::memcmp(x, y, sizeof(float) * static_cast<size_t>(s.numel()))) << "two threads differ, D=" << D;
      }
}

TEST(Bf16, FlashRefusesHeadSizesWithoutTheKernel) {
  if (!TiledSoftmax::dense_bf16_kernel(64) || !cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 build or CPU";
  EXPECT_THROW(run_mechanism("flash", Shape4{1, 1, 8, 40}, false, Mode::fwd, {}, 1, 1, Dtype::bf16), InvalidInput);
}

TEST(ExactMemory, TimedCallsAllocateNothing) {
  for (const std::string name : {"vanilla", "flash"}) {
    auto r = run_mechanism(name, Shape4{1, 2, 300, 32}, true, Mode::fwdbwd);
    const uint64_t before = MemoryMeter::allocations();
    const size_t cur = MemoryMeter::current();
    r.impl->forward(r.data->args());
    r.impl->backward(r.data->args());
    EXPECT_EQ(MemoryMeter::allocations(), before) << name;
    EXPECT_EQ(MemoryMeter::current(), cur) << name;
  }
}

TEST(ExactFlops, AnalyticCounts) {
  const auto& info = find_mechanism("flash");
  const Shape4 s{2, 8, 4096, 64};
  auto full = info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, ParamValues());
  auto causal = info.make(AttnProblem{s, true, Strides3::contiguous(s), 1}, ParamValues());
  const double per_head = 4.0 * 4096.0 * 4096.0 * 64.0;
  EXPECT_DOUBLE_EQ(full->flops(Mode::fwd), 16 * per_head);
  EXPECT_DOUBLE_EQ(full->flops(Mode::fwdbwd), 3.5 * 16 * per_head);
  EXPECT_DOUBLE_EQ(causal->flops(Mode::fwd), 16 * 4.0 * 64.0 * (4096.0 * 4097.0 / 2));
}

}  // namespace
}  // namespace ab
