// linformer, memory_compressed and synthesizer against the direct references of their formulas
// beside their kernels,
// the identity settings that reduce the first two to vanilla, finite differences, memory and
// FLOPs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "attention_impls/tiled_softmax.hpp"
#include "core/dtype.hpp"
#include "core/vecmath.hpp"
#include "tests/helpers.hpp"
#include "tests/reference.hpp"

namespace ab {
namespace {

using test::run_mechanism;
using test::formula;
using test::tensor;

int64_t numel(const DumpTensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}

// ---- linformer ----
TEST(Linformer, IdentityProjectionsEqualVanilla) {
  const Shape4 s{2, 2, 50, 16};
  auto r = run_mechanism("linformer", s, false, Mode::fwd, {"k=50"}, 3);
  for (const char* name : {"E", "F"}) {
    DumpTensor t = tensor(*r.impl, name);
    ASSERT_EQ(t.shape, (std::vector<int64_t>{2, 50, 50}));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 50; ++i)
        for (int64_t j = 0; j < 50; ++j) t.f32[(h * 50 + i) * 50 + j] = i == j ? 1.0f : 0.0f;
  }
  AttnArgs a = r.data->args();
  r.impl->forward(a);
  EXPECT_LT(ref::rel_err(a.o.data, ref::forward(a.q, a.k, a.v, ref::dense_mask(false))), 2e-5);
}

TEST(Linformer, MatchesDirectFormula) {
  for (int64_t N : {1, 37, 300})
    for (const char* share : {"false", "true"}) {
      const Shape4 s{2, 2, N, 16};
      const std::vector<std::string> ps = {"k=24", std::string("share_kv=") + share};
      auto r = run_mechanism("linformer", s, false, Mode::fwd, ps, 5);
      EXPECT_LT(ref::rel_err(r.data->o.data(), formula("linformer", ps, *r.impl, r.data->args())), 2e-5)
          << "N=" << N << " share=" << share;
      if (std::string(share) == "true") {
        DumpTensor E = tensor(*r.impl, "E"), F = tensor(*r.impl, "F");
        EXPECT_EQ(E.f32, F.f32);
      }
    }
}

TEST(Linformer, EntriesAreUniformWithinBound) {
  auto r = run_mechanism("linformer", Shape4{1, 2, 512, 16}, false, Mode::fwd, {"k=64"}, 5);
  DumpTensor E = tensor(*r.impl, "E");
  double mx = 0, sum2 = 0;
  for (int64_t i = 0; i < numel(E); ++i) {
    mx = std::max(mx, double(std::abs(E.f32[i])));
    sum2 += double(E.f32[i]) * E.f32[i];
  }
  EXPECT_LE(mx, 1.0 / 8.0);
  // Uniform on [-a, a] has variance a^2 / 3.
  EXPECT_NEAR(sum2 / numel(E), (1.0 / 64.0) / 3.0, 2e-4);
}

// ---- memory_compressed ----
TEST(MemoryCompressed, StrideOneIdentityKernelsEqualVanilla) {
  const Shape4 s{1, 2, 70, 16};
  auto r = run_mechanism("memory_compressed", s, false, Mode::fwd, {"stride=1"}, 2);
  for (const char* name : {"Wk", "Wv"}) {
    DumpTensor t = tensor(*r.impl, name);
    ASSERT_EQ(t.shape, (std::vector<int64_t>{2, 1, 16, 16}));
    for (int64_t i = 0; i < numel(t); ++i) t.f32[i] = (i % (16 * 16)) / 16 == i % 16 ? 1.0f : 0.0f;
  }
  AttnArgs a = r.data->args();
  r.impl->forward(a);
  EXPECT_LT(ref::rel_err(a.o.data, ref::forward(a.q, a.k, a.v, ref::dense_mask(false))), 2e-5);
}

TEST(MemoryCompressed, MatchesPaddedConvolutionReference) {
  for (int64_t stride : {3, 5})
    for (int64_t N : {100, 101, 2}) {
      const Shape4 s{2, 2, N, 8};
      const std::vector<std::string> ps = {"stride=" + std::to_string(stride)};
      auto r = run_mechanism("memory_compressed", s, false, Mode::fwd, ps, 4);
      const auto want = formula("memory_compressed", ps, *r.impl, r.data->args());
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(r.data->o.data()[i] - want[i]));
      EXPECT_LT(worst, 1e-5) << "stride " << stride << " N " << N;
    }
}

// ---- bf16 (forward) ----
// linformer and memory_compressed in bf16: against the formulas beside their kernels (float64 from
// the float inputs and maps), within what rounding the maps, K, V, Q, K', V' and P to bf16 costs,
// and clearly not at float accuracy (the bf16 path ran); bit-identical at one and two threads
// (each head's products run on one thread); tracked memory as declared.
TEST(LowRankBf16, ForwardMatchesReferenceWithinBf16Rounding) {
  if (!TiledSoftmax::dense_bf16_kernel(64) || !cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 build or CPU";
  for (int64_t D : {16, 64})
    for (int64_t N : {37, 300}) {
      const Shape4 s{2, 2, N, D};
      struct Case {
        std::string name;
        std::vector<std::string> params;
      };
      const Case cases[] = {{"linformer", {"k=24"}}, {"linformer", {"k=24", "share_kv=true"}},
                            {"memory_compressed", {"stride=3"}}};
      for (const auto& c : cases) {
        auto r = run_mechanism(c.name, s, false, Mode::fwd, c.params, 5, 1, Dtype::bf16);
        const double err = ref::rel_err(r.data->o.data(), formula(c.name, c.params, *r.impl, r.data->args()));
        EXPECT_LT(err, 1.5e-2) << c.name << " D=" << D << " N=" << N;
        EXPECT_GT(err, 1e-4) << c.name << ": float accuracy, the bf16 path did not run, D=" << D << " N=" << N;
        EXPECT_EQ(r.tracked_peak, r.declared) << c.name << " D=" << D << " N=" << N;
        auto two = run_mechanism(c.name, s, false, Mode::fwd, c.params, 5, 2, Dtype::bf16);
        EXPECT_EQ(0, std::memcmp(two.data->o.data(), r.data->o.data(), sizeof(float) * static_cast<size_t>(s.numel())))
            << c.name << ": two threads differ from one, D=" << D << " N=" << N;
      }
    }
}

// Their bf16 backward (the attention over the reduced keys in bf16 tiles, the maps' products in
// float32), against the float32 backward on the same inputs, maps and dO: dQ, dK, dV and the maps'
// gradients each within 2% in relative Frobenius norm (measured at most 0.7%) and not equal (the
// bf16 tiles ran); memory as declared; the maps re-rounded each call when training (a changed map
// changes the bf16 output).
TEST(LowRankBf16, BackwardNearItsFloat32Backward) {
  if (!TiledSoftmax::dense_bf16_kernel(64) || !cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 build or CPU";
  constexpr double kBf16GradTolerance = 2e-2;
  double worst = 0;
  for (int64_t D : {16, 64})
    for (int64_t N : {37, 300})
      for (const auto& [name, params] : std::vector<std::pair<std::string, std::vector<std::string>>>{
               {"linformer", {"k=24"}}, {"linformer", {"k=24", "share_kv=true"}}, {"memory_compressed", {"stride=3"}}}) {
        const Shape4 sh{2, 2, N, D};
        auto run = [&](Dtype dtype) {
          AttnProblem p{sh, false, Strides3::contiguous(sh), 1};
          p.dtype = dtype;
          p.param_grads = true;
          return test::run_problem(name, p, Mode::fwdbwd, params, 5);
        };
        auto f32 = run(Dtype::f32), b16 = run(Dtype::bf16);
        EXPECT_EQ(b16.tracked_peak, b16.declared) << name << " D=" << D << " N=" << N;
        auto rel = [&](const float* got, const float* want, int64_t n, const std::string& what) {
          const double r = test::frobenius_diff(got, want, n) / test::frobenius(want, n);
          worst = std::max(worst, r);
          EXPECT_LT(r, kBf16GradTolerance) << name << " " << what << " D=" << D << " N=" << N;
          EXPECT_GT(r, 1e-4) << name << " " << what << ": float32 accuracy, the bf16 path did not run";
        };
        const AttnArgs a = f32.data->args(), b = b16.data->args();
        rel(b.dq.data, a.dq.data, sh.numel(), "dq");
        rel(b.dk.data, a.dk.data, sh.numel(), "dk");
        rel(b.dv.data, a.dv.data, sh.numel(), "dv");
        const auto lf = f32.impl->learned(), lb = b16.impl->learned();
        ASSERT_EQ(lf.size(), lb.size());
        for (size_t t = 0; t < lf.size(); ++t) rel(lb[t].grad, lf[t].grad, lf[t].count, "d" + lf[t].name);
        // Training changes the maps between calls: the next bf16 forward multiplies the new ones.
        const std::vector<float> before(b.o.data, b.o.data + sh.numel());
        for (int64_t i = 0; i < lb[0].count; ++i) lb[0].value[i] *= 0.5f;
        b16.impl->forward(b);
        EXPECT_NE(0, std::memcmp(before.data(), b.o.data, sizeof(float) * before.size())) << name << ": stale bf16 maps";
      }
  std::printf("[ bf16     ] worst relative gradient error %.4f\n", worst);
}

TEST(LowRankBf16, HeadSizesWithoutTheKernelAreRefused) {
  if (!TiledSoftmax::dense_bf16_kernel(64) || !cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 build or CPU";
  for (const std::string name : {"linformer", "memory_compressed"})
    EXPECT_THROW(run_mechanism(name, Shape4{1, 1, 8, 40}, false, Mode::fwd, {}, 1, 1, Dtype::bf16), InvalidInput) << name;
}

// ---- synthesizer ----
class SynthesizerVsDirect : public ::testing::TestWithParam<std::tuple<std::string, bool, int64_t>> {};

TEST_P(SynthesizerVsDirect, Matches) {
  const auto [variant, causal, N] = GetParam();
  const Shape4 s{2, 2, N, 16};
  std::vector<std::string> params = {"variant=" + variant, "k=5"};
  if (variant == "dense") params.push_back("max_len=" + std::to_string(N + 9));
  auto r = run_mechanism("synthesizer", s, causal, Mode::fwd, params, 6);
  EXPECT_LT(ref::rel_err(r.data->o.data(), formula("synthesizer", params, *r.impl, r.data->args(), causal)), 2e-5);
}
INSTANTIATE_TEST_SUITE_P(All, SynthesizerVsDirect,
                         ::testing::Combine(::testing::Values("dense", "random", "factorized"), ::testing::Bool(),
                                            ::testing::Values(1, 77, 300)));

TEST(Synthesizer, MaxLenBelowNIsRejected) {
  const auto& info = find_mechanism("synthesizer");
  const Shape4 s{1, 1, 100, 16};
  auto impl = info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, resolve_params(info, {"max_len=50"}));
  EXPECT_THROW(impl->validate(), InvalidInput);
}

// ---- backward against finite differences ----
class LowRankFiniteDifferences : public ::testing::TestWithParam<std::tuple<std::string, std::vector<std::string>, bool>> {};

TEST_P(LowRankFiniteDifferences, GradientsMatch) {
  const auto& [name, params, causal] = GetParam();
  const Shape4 s{1, 2, 11, 8};
  auto r = run_mechanism(name, s, causal, Mode::fwdbwd, params, 5);
  const float eps = 1e-2f;
  // The dense synthesizer has a ReLU on q W1 + b1: a central difference across a kink measures
  // neither side, so query rows with a pre-activation within reach of zero are left out.
  const float* q = r.data->q.data();
  auto near_kink = [&](const TensorView& t, int64_t i) {
    if (t.data != q || name != "synthesizer" || params[0] != "variant=dense") return false;
    DumpTensor W1 = tensor(*r.impl, "W1"), b1 = tensor(*r.impl, "b1");
    const int64_t D = s.D, h = i / (s.N * D), row = (i / D) % s.N;
    for (int64_t o = 0; o < D; ++o) {
      double pre = b1.f32[h * D + o], reach = 0;
      for (int64_t c = 0; c < D; ++c) {
        pre += double(t.at(0, h, row, c)) * W1.f32[(h * D + c) * D + o];
        reach = std::max(reach, 2.0 * eps * std::abs(W1.f32[(h * D + c) * D + o]));
      }
      if (std::abs(pre) < reach) return true;
    }
    return false;
  };
  EXPECT_GT(test::check_gradients_by_differences(r, 3, 2e-3, 1e-2, eps, near_kink), 150);
}
INSTANTIATE_TEST_SUITE_P(
    All, LowRankFiniteDifferences,
    ::testing::Values(std::make_tuple("linformer", std::vector<std::string>{"k=5"}, false),
                      std::make_tuple("linformer", std::vector<std::string>{"k=5", "share_kv=true"}, false),
                      std::make_tuple("memory_compressed", std::vector<std::string>{"stride=3"}, false),
                      std::make_tuple("memory_compressed", std::vector<std::string>{"stride=1"}, false),
                      std::make_tuple("synthesizer", std::vector<std::string>{"variant=dense"}, false),
                      std::make_tuple("synthesizer", std::vector<std::string>{"variant=dense"}, true),
                      std::make_tuple("synthesizer", std::vector<std::string>{"variant=random"}, true),
                      std::make_tuple("synthesizer", std::vector<std::string>{"variant=factorized", "k=3"}, false)));

// ---- memory and FLOPs ----
TEST(LowRankMemory, TrackedPeakEqualsDeclared) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"linformer", {"k=32"}}, {"linformer", {"k=32", "share_kv=true"}}, {"memory_compressed", {}},
      {"synthesizer", {}},     {"synthesizer", {"variant=random"}},       {"synthesizer", {"variant=factorized"}}};
  for (const auto& [name, params] : cases)
    for (Mode mode : {Mode::fwd, Mode::fwdbwd})
      for (int64_t n : {100, 512}) {
        auto r = run_mechanism(name, Shape4{1, 2, n, 16}, false, mode, params, 1, 2);
        EXPECT_EQ(r.tracked_peak, r.declared) << name << " " << to_string(mode) << " N=" << n;
      }
}

double declared_flops(const std::string& name, const std::vector<std::string>& params, int64_t n, Mode mode) {
  const auto& info = find_mechanism(name);
  const Shape4 s{1, 8, n, 64};
  return info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, resolve_params(info, params))->flops(mode);
}
size_t declared_bytes(const std::string& name, const std::vector<std::string>& params, int64_t n) {
  const auto& info = find_mechanism(name);
  const Shape4 s{1, 8, n, 64};
  return info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, resolve_params(info, params))
      ->working_bytes(Mode::fwd);
}

TEST(LowRankCost, LinformerIsLinearInN) {
  const double f1 = declared_flops("linformer", {}, 4096, Mode::fwd), f2 = declared_flops("linformer", {}, 8192, Mode::fwd);
  EXPECT_DOUBLE_EQ(f1, 8.0 * 4096 * 256 * 64 * 8);
  EXPECT_DOUBLE_EQ(f2, 2 * f1);
  EXPECT_DOUBLE_EQ(declared_flops("linformer", {}, 4096, Mode::fwdbwd), 22.0 * 4096 * 256 * 64 * 8);
  // Bytes: E and F (H k N floats each) plus a constant; the step from N to 2N is the same twice.
  const double b1 = double(declared_bytes("linformer", {}, 2048)), b2 = double(declared_bytes("linformer", {}, 4096)),
               b3 = double(declared_bytes("linformer", {}, 8192));
  EXPECT_NEAR(b3 - b2, 2 * (b2 - b1), 64 * 1024);
  EXPECT_NEAR(b2 - b1, 2.0 * 8 * 256 * 2048 * 4, 64 * 1024);
}

TEST(LowRankCost, MemoryCompressedMemoryIsLinearAndAttentionQuadraticInNOverStride) {
  const double n = 6144, D = 64, T = 2048;
  EXPECT_DOUBLE_EQ(declared_flops("memory_compressed", {}, 6144, Mode::fwd), 8 * (4 * n * D * D + 4 * n * T * D));
  const double b1 = double(declared_bytes("memory_compressed", {}, 3072)),
               b2 = double(declared_bytes("memory_compressed", {}, 6144)),
               b3 = double(declared_bytes("memory_compressed", {}, 12288));
  EXPECT_NEAR(b3 - b2, 2 * (b2 - b1), 64 * 1024);
}

TEST(LowRankCost, SynthesizerDenseAndRandomAreQuadratic) {
  for (const char* v : {"variant=dense", "variant=random"}) {
    const double f1 = declared_flops("synthesizer", {v}, 2048, Mode::fwd), f2 = declared_flops("synthesizer", {v}, 4096, Mode::fwd);
    EXPECT_GT(f2 / f1, 3.5) << v;
  }
  EXPECT_DOUBLE_EQ(declared_flops("synthesizer", {"variant=random"}, 1024, Mode::fwd), 8 * 2.0 * 1024 * 1024 * 64);
  // random's logits are an (N, N) parameter per head: memory quadratic.
  const double r1 = double(declared_bytes("synthesizer", {"variant=random"}, 1024)),
               r2 = double(declared_bytes("synthesizer", {"variant=random"}, 2048));
  EXPECT_NEAR(r2 - r1, 8.0 * (2048.0 * 2048 - 1024.0 * 1024) * 4, 64 * 1024);
  EXPECT_NE(find_mechanism("synthesizer").complexity.find("N^2"), std::string::npos);
}

TEST(LowRankCaps, LinformerAndMemoryCompressedRefuseCausal) {
  EXPECT_FALSE(find_mechanism("linformer").caps.causal);
  EXPECT_FALSE(find_mechanism("memory_compressed").caps.causal);
  EXPECT_TRUE(find_mechanism("synthesizer").caps.causal);
  auto e = test::exec("run --attn linformer,memory_compressed --seq 64 --causal --reps 1 --min-time 0 --format csv", false);
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("SKIPPED: linformer cannot be causal"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("SKIPPED: memory_compressed cannot be causal"), std::string::npos) << e.out;
}

}  // namespace
}  // namespace ab
