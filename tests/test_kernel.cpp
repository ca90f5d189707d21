// linear and performer against the direct references of their formulas beside their kernels, the chunked causal form
// against the step-by-step recurrence, decode token by token against the causal forward (for
// every mechanism with a decode step), finite differences, and memory.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/helpers.hpp"
#include "core/vecmath.hpp"
#include "tests/reference.hpp"

namespace ab {
namespace {

using test::run_mechanism;

// Features of one row as each mechanism's formula defines them, in double.
using FeatureFn = std::function<std::vector<double>(const float* x, bool is_query)>;

FeatureFn elu_features(int64_t D) {
  return [D](const float* x, bool) {
    std::vector<double> f(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) f[d] = x[d] > 0 ? x[d] + 1.0 : std::exp(double(x[d]));
    return f;
  };
}

// (N, D, causal, chunk)
using KCase = std::tuple<int64_t, int64_t, bool, int64_t>;
class LinearVsQuadraticForm : public ::testing::TestWithParam<KCase> {};

TEST_P(LinearVsQuadraticForm, Matches) {
  const auto [N, D, causal, chunk] = GetParam();
  const Shape4 s{2, 2, N, D};
  auto r = run_mechanism("linear", s, causal, Mode::fwd, {"chunk=" + std::to_string(chunk)}, 3);
  const AttnArgs a = r.data->args();
  const auto want = ref::linear_attention(a.q, a.k, a.v, causal, false);
  EXPECT_LT(ref::rel_err(r.data->o.data(), want), 2e-5);
}
INSTANTIATE_TEST_SUITE_P(Shapes, LinearVsQuadraticForm,
                         ::testing::Combine(::testing::Values(1, 7, 100, 129), ::testing::Values(8, 32),
                                            ::testing::Bool(), ::testing::Values(1, 7, 64)));

// The recurrence S_i = S_{i-1} + phi(k_i) v_i^T, z_i = z_{i-1} + phi(k_i), one step at a time.
TEST(Linear, ChunkedCausalEqualsStepByStepRecurrence) {
  const int64_t N = 150, D = 16;
  const Shape4 s{1, 2, N, D};
  for (int64_t chunk : {1, 7, 64}) {
    auto r = run_mechanism("linear", s, true, Mode::fwd, {"chunk=" + std::to_string(chunk)}, 4);
    const AttnArgs a = r.data->args();
    auto phi = elu_features(D);
    double worst = 0;
    for (int64_t h = 0; h < s.H; ++h) {
      std::vector<double> S(D * D, 0.0), z(D, 0.0);
      for (int64_t i = 0; i < N; ++i) {
        auto fk = phi(a.k.row(0, h, i), false), fq = phi(a.q.row(0, h, i), true);
        for (int64_t f = 0; f < D; ++f) {
          z[f] += fk[f];
          for (int64_t d = 0; d < D; ++d) S[f * D + d] += fk[f] * a.v.at(0, h, i, d);
        }
        double den = 1e-6;
        for (int64_t f = 0; f < D; ++f) den += fq[f] * z[f];
        for (int64_t d = 0; d < D; ++d) {
          double num = 0;
          for (int64_t f = 0; f < D; ++f) num += fq[f] * S[f * D + d];
          worst = std::max(worst, std::abs(num / den - a.o.at(0, h, i, d)));
        }
      }
    }
    EXPECT_LT(worst, 1e-4) << "chunk " << chunk;
  }
}

class PerformerVsDirect : public ::testing::TestWithParam<std::tuple<int64_t, bool, int64_t>> {};

TEST_P(PerformerVsDirect, MatchesWithSameOmega) {
  const auto [N, causal, features] = GetParam();
  const int64_t D = 16;
  const Shape4 s{2, 2, N, D};
  auto r = run_mechanism("performer", s, causal, Mode::fwd,
                         {"features=" + std::to_string(features), "chunk=16"}, 8);
  auto dumped = r.impl->dump_tensors();
  ASSERT_EQ(dumped.size(), 1u);
  ASSERT_EQ(dumped[0].name, "omega");
  ASSERT_EQ(dumped[0].shape, (std::vector<int64_t>{features, D}));
  const AttnArgs a = r.data->args();
  const auto want = ref::performer(a.q, a.k, a.v, causal, dumped[0].f32, features, false);
  EXPECT_LT(ref::rel_err(r.data->o.data(), want), 1e-4);
}
INSTANTIATE_TEST_SUITE_P(Shapes, PerformerVsDirect,
                         ::testing::Combine(::testing::Values(1, 50, 100), ::testing::Bool(),
                                            ::testing::Values(7, 16, 40)));

TEST(Performer, OmegaRowsAreOrthogonalWithinBlocks) {
  const int64_t D = 16, m = 40;
  auto r = run_mechanism("performer", Shape4{1, 1, 8, D}, false, Mode::fwd, {"features=40"}, 2);
  const float* w = r.impl->dump_tensors()[0].f32;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = (i / D) * D; j < i; ++j) {
      double d = 0, ni = 0, nj = 0;
      for (int64_t k = 0; k < D; ++k) {
        d += double(w[i * D + k]) * w[j * D + k];
        ni += double(w[i * D + k]) * w[i * D + k];
        nj += double(w[j * D + k]) * w[j * D + k];
      }
      EXPECT_LT(std::abs(d) / std::sqrt(ni * nj), 1e-5) << i << "," << j;
    }
}

// A causal output never depends on a later key, also through the key stabiliser.
TEST(Performer, CausalOutputsIgnoreLaterKeys) {
  const Shape4 s{1, 2, 60, 16};
  auto r = run_mechanism("performer", s, true, Mode::fwd, {"chunk=16"}, 4);
  AttnArgs a = r.data->args();
  const std::vector<float> before(a.o.data, a.o.data + s.numel());
  // Make the last keys dominate the key stabiliser (x' = omega_0 maximises the exponent
  // omega x' - |x'|^2/2 at |omega_0|^2 / 2), and change their values too.
  const float* omega = r.impl->dump_tensors()[0].f32;
  const float root = std::pow(float(s.D), 0.25f);
  for (int64_t h = 0; h < s.H; ++h)
    for (int64_t j = 50; j < s.N; ++j)
      for (int64_t d = 0; d < s.D; ++d) {
        a.k.at(0, h, j, d) = root * omega[d];
        a.v.at(0, h, j, d) += 3.0f;
      }
  r.impl->forward(a);
  double worst = 0;
  for (int64_t h = 0; h < s.H; ++h)
    for (int64_t i = 0; i < 50; ++i)
      for (int64_t d = 0; d < s.D; ++d)
        worst = std::max(worst, double(std::abs(a.o.at(0, h, i, d) - before[ref::idx(s, 0, h, i, d)])));
  EXPECT_LT(worst, 1e-5);
  // The change is real where it is allowed to show.
  EXPECT_GT(std::abs(a.o.at(0, 0, 55, 0) - before[ref::idx(s, 0, 0, 55, 0)]), 1e-2);
}

// Positive features make every output a convex combination of the values it attends.
TEST(Performer, FeaturesArePositiveSoOutputsAreConvexCombinations) {
  for (bool causal : {false, true}) {
    const Shape4 s{1, 2, 64, 16};
    auto r = run_mechanism("performer", s, causal, Mode::fwd, {"features=32"}, 6);
    const AttnArgs a = r.data->args();
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.N; ++i)
        for (int64_t d = 0; d < s.D; ++d) {
          double lo = 1e30, hi = -1e30;
          for (int64_t j = 0; j <= (causal ? i : s.N - 1); ++j) {
            lo = std::min(lo, double(a.v.at(0, h, j, d)));
            hi = std::max(hi, double(a.v.at(0, h, j, d)));
          }
          const double o = a.o.at(0, h, i, d);
          EXPECT_GE(o, std::min(lo, 0.0) - 1e-4);
          EXPECT_LE(o, std::max(hi, 0.0) + 1e-4);
        }
  }
}

// FAVOR+ estimates exp(q.k/sqrt(D)); more features, smaller error against softmax attention.
TEST(Performer, ErrorAgainstSoftmaxFallsWithFeatures) {
  const Shape4 s{1, 4, 128, 16};
  std::vector<double> avg;
  for (int64_t m : {64, 256, 1024}) {
    double sum = 0;
    for (uint64_t seed : {1, 2, 3}) {
      auto r = run_mechanism("performer", s, false, Mode::fwd, {"features=" + std::to_string(m)}, seed);
      // Inputs of moderate norm, where the estimator's variance is finite in practice.
      AttnArgs a = r.data->args();
      for (auto* t : {&r.data->q, &r.data->k})
        for (size_t i = 0; i < t->size(); ++i) t->data()[i] *= 0.5f;
      r.impl->forward(a);
      const auto want = ref::forward(a.q, a.k, a.v, ref::dense_mask(false));
      std::vector<float> wf(want.begin(), want.end());
      sum += nmse(a.o.data, wf.data(), wf.size());
    }
    avg.push_back(sum / 3);
  }
  EXPECT_GT(avg[0], avg[1]);
  EXPECT_GT(avg[1], avg[2]);
  EXPECT_LT(avg[2], 0.05) << "1024 features should approximate softmax attention well";
}

TEST(Performer, LargeNormInputsStayFinite) {
  const Shape4 s{1, 2, 200, 64};
  for (bool causal : {false, true}) {
    auto r = run_mechanism("performer", s, causal, Mode::fwdbwd, {}, 12);
    AttnArgs a = r.data->args();
    for (auto* t : {&r.data->q, &r.data->k})
      for (int64_t i = 0; i < s.B * s.H * s.N; ++i) {
        float* row = t->data() + i * s.D;
        const float n = std::sqrt(dot(row, row, s.D));
        const float target = 5.0f + 25.0f * static_cast<float>(i % 7) / 6.0f;  // norms 5 .. 30
        scale_inplace(row, s.D, target / n);
      }
    r.impl->forward(a);
    r.impl->backward(a);
    for (const Tensor* t : {&r.data->o, &r.data->dq, &r.data->dk, &r.data->dv})
      for (size_t i = 0; i < t->size(); ++i) ASSERT_TRUE(std::isfinite(t->data()[i])) << causal;
  }
}

// ---- backward against finite differences of each mechanism's own forward ----
class KernelFiniteDifferences : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(KernelFiniteDifferences, GradientsMatch) {
  const auto [name, causal] = GetParam();
  const Shape4 s{1, 2, 13, 8};
  std::vector<std::string> params = {"chunk=5"};
  if (name == "performer") params.push_back("features=12");
  auto r = run_mechanism(name, s, causal, Mode::fwdbwd, params, 5);
  test::check_gradients_by_differences(r, 3, 3e-3, 2e-2);
}
INSTANTIATE_TEST_SUITE_P(Both, KernelFiniteDifferences,
                         ::testing::Combine(::testing::Values("linear", "performer"), ::testing::Bool()));

// ---- RoPE in RoFormer's kernel form (section 3.3): rotated feature maps in the numerator ----
AttnProblem rope_problem(const Shape4& s, bool causal) {
  AttnProblem p{s, causal, Strides3::contiguous(s), 1};
  p.rope = true;
  return p;
}

// (mechanism, N, causal, chunk): N crosses the chunk and the streaming block's edges.
using RopeKCase = std::tuple<std::string, int64_t, bool, int64_t>;
class KernelRopeVsEquation19 : public ::testing::TestWithParam<RopeKCase> {};

TEST_P(KernelRopeVsEquation19, MatchesTheDirectForm) {
  const auto [name, N, causal, chunk] = GetParam();
  const Shape4 s{2, 2, N, 16};
  std::vector<std::string> params = {"chunk=" + std::to_string(chunk)};
  if (name == "performer") params.push_back("features=24");
  auto r = test::run_problem(name, rope_problem(s, causal), Mode::fwd, params, 3);
  const AttnArgs a = r.data->args();
  auto reference = [&](bool rope) {
    return name == "linear" ? ref::linear_attention(a.q, a.k, a.v, causal, rope)
                            : ref::performer(a.q, a.k, a.v, causal, dump_tensor(*r.impl, "omega").f32, 24, rope);
  };
  const auto want = reference(true);
  EXPECT_LT(ref::rel_err(r.data->o.data(), want), name == "linear" ? 2e-5 : 1e-4);
  // The rotation reaches the outputs: without it they differ.
  const auto plain = reference(false);
  if (N > 1) {
    EXPECT_GT(ref::rel_err(r.data->o.data(), plain), 1e-3);
  }
  EXPECT_EQ(r.tracked_peak, r.declared);
}
INSTANTIATE_TEST_SUITE_P(Shapes, KernelRopeVsEquation19,
                         ::testing::Combine(::testing::Values("linear", "performer"), ::testing::Values(1, 37, 100),
                                            ::testing::Bool(), ::testing::Values(1, 16)));

TEST_P(KernelFiniteDifferences, GradientsMatchWithRope) {
  const auto [name, causal] = GetParam();
  const Shape4 s{1, 2, 13, 8};
  std::vector<std::string> params = {"chunk=5"};
  if (name == "performer") params.push_back("features=12");
  auto r = test::run_problem(name, rope_problem(s, causal), Mode::fwdbwd, params, 5);
  EXPECT_EQ(r.tracked_peak, r.declared);
  test::check_gradients_by_differences(r, 3, 3e-3, 2e-2);
}

// An odd feature count has no pairs to rotate: refused at validation, naming the count.
TEST(KernelRope, OddFeatureCountIsRefused) {
  const auto& info = find_mechanism("performer");
  auto impl = info.make(rope_problem(Shape4{1, 1, 8, 8}, false), resolve_params(info, {"features=7"}));
  try {
    impl->validate();
    FAIL() << "no error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("7 features"), std::string::npos) << e.what();
  }
}

// The chunked causal backward equals the non-chunked one (chunk >= N is one masked block).
TEST(Linear, CausalBackwardDoesNotDependOnChunk) {
  const Shape4 s{1, 2, 70, 16};
  auto one = run_mechanism("linear", s, true, Mode::fwdbwd, {"chunk=128"}, 2);
  for (int64_t chunk : {1, 7, 64}) {
    auto r = run_mechanism("linear", s, true, Mode::fwdbwd, {"chunk=" + std::to_string(chunk)}, 2);
    const auto n = static_cast<size_t>(s.numel());
    EXPECT_LT(nmse(r.data->dq.data(), one.data->dq.data(), n), 1e-10) << chunk;
    EXPECT_LT(nmse(r.data->dk.data(), one.data->dk.data(), n), 1e-10) << chunk;
    EXPECT_LT(nmse(r.data->dv.data(), one.data->dv.data(), n), 1e-10) << chunk;
  }
}

// ---- decode ----
// Feeds tokens [prefill, N) of seeded inputs one at a time to `name` set up for decode on problem
// `p` (each step twice: recomputing a position is idempotent) and returns the largest difference
// from `want`, the causal forward's outputs on the same inputs.
double decode_vs_forward(const std::string& name, const AttnProblem& p, const std::vector<std::string>& params,
                         uint64_t seed, int64_t prefill, const Tensor& want) {
  const auto& info = find_mechanism(name);
  const Shape4& s = p.shape;
  auto impl = info.make(p, resolve_params(info, params));
  Rng rng(seed, kStreamParams);
  impl->setup(Mode::decode, rng);
  AttnData d(s, seed, false);
  const AttnArgs a = d.args();
  impl->decode_prefill(a, prefill);
  double worst = 0;
  for (int64_t t = prefill; t < s.N; ++t) {
    const AttnArgs tok = a.token(t);
    impl->decode_step(tok, t);
    impl->decode_step(tok, t);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t dd = 0; dd < s.D; ++dd)
          worst = std::max(worst, double(std::abs(d.o.view().at(b, h, t, dd) - want.view().at(b, h, t, dd))));
  }
  return worst;
}

class DecodeTokenByToken : public ::testing::TestWithParam<std::string> {};

// Feeding the sequence one token at a time gives the causal forward's outputs.
TEST_P(DecodeTokenByToken, EqualsCausalForward) {
  const std::string name = GetParam();
  const Shape4 s{2, 2, 77, 16};
  std::vector<std::string> params;
  if (name == "linear" || name == "performer") params.push_back("chunk=16");
  if (name == "sliding") params.push_back("window=9");
  if (name == "local") params = {"block=8", "lookback=2"};
  auto full = run_mechanism(name, s, true, Mode::fwd, params, 13);
  for (int64_t prefill : {int64_t{0}, int64_t{40}})
    EXPECT_LT(decode_vs_forward(name, AttnProblem{s, true, Strides3::contiguous(s), 1}, params, 13, prefill, full.data->o), 2e-4)
        << name << " prefill " << prefill;
}
INSTANTIATE_TEST_SUITE_P(All, DecodeTokenByToken,
                         ::testing::Values("vanilla", "flash", "linear", "performer", "sliding", "local"));

// Token by token with RoPE equals the causal forward with RoPE (the state holds rotated keys).
TEST(KernelRope, DecodeEqualsCausalForward) {
  for (const std::string name : {"linear", "performer"}) {
    const Shape4 s{2, 2, 45, 16};
    const std::vector<std::string> params = {"chunk=16"};
    auto full = test::run_problem(name, rope_problem(s, true), Mode::fwd, params, 13);
    for (int64_t prefill : {int64_t{0}, int64_t{20}})
      EXPECT_LT(decode_vs_forward(name, rope_problem(s, true), params, 13, prefill, full.data->o), 2e-4)
          << name << " prefill " << prefill;
  }
}

// ---- memory and FLOPs ----
TEST(KernelMemory, TrackedPeakEqualsDeclared) {
  for (const std::string name : {"linear", "performer", "vanilla", "flash", "sliding", "local"})
    for (Mode mode : {Mode::fwd, Mode::fwdbwd, Mode::decode})
      for (bool causal : {false, true})
        for (int64_t n : {100, 256}) {
          if (mode == Mode::decode && !causal) continue;
          const Shape4 s{1, 2, n, 16};
          if (mode != Mode::decode) {
            auto r = run_mechanism(name, s, causal, mode, {}, 1, 2);
            EXPECT_EQ(r.tracked_peak, r.declared) << name << " " << to_string(mode) << " N=" << n;
            continue;
          }
          omp_set_num_threads(1);
          const auto& info = find_mechanism(name);
          auto impl = info.make(AttnProblem{s, true, Strides3::contiguous(s), 1}, resolve_params(info, {}));
          Shape4 in = s;
          in.N += 1;
          AttnData d(in, 1, false);
          const size_t base = MemoryMeter::current();
          MemoryMeter::reset_peak();
          Rng rng(1, kStreamParams);
          impl->setup(Mode::decode, rng);
          impl->decode_prefill(d.args(), n);
          EXPECT_EQ(MemoryMeter::peak() - base, impl->working_bytes(Mode::decode)) << name << " decode N=" << n;
        }
}

TEST(KernelMemory, DecodeStateIsConstantForKernelsAndGrowsForSoftmax) {
  auto bytes = [](const std::string& name, int64_t n) {
    const auto& info = find_mechanism(name);
    const Shape4 s{1, 8, n, 64};
    return info.make(AttnProblem{s, true, Strides3::contiguous(s), 1}, resolve_params(info, {}))
        ->working_bytes(Mode::decode);
  };
  auto flops = [](const std::string& name, int64_t n) {
    const auto& info = find_mechanism(name);
    const Shape4 s{1, 8, n, 64};
    return info.make(AttnProblem{s, true, Strides3::contiguous(s), 1}, resolve_params(info, {}))
        ->flops(Mode::decode);
  };
  for (const std::string name : {"linear", "performer", "sliding", "local"}) {
    EXPECT_EQ(bytes(name, 1024), bytes(name, 65536)) << name;
    EXPECT_EQ(flops(name, 1024), flops(name, 65536)) << name;
  }
  // The cache holds K and V of N + 1 tokens: 2 * B * H * D floats per token.
  for (const std::string name : {"vanilla", "flash"}) {
    EXPECT_GE(bytes(name, 65536) - bytes(name, 1024), size_t(2 * 8 * 64 * 4) * (65536 - 1024)) << name;
    EXPECT_DOUBLE_EQ(flops(name, 65536) / flops(name, 1024), 65537.0 / 1025.0) << name;
  }
}

TEST(KernelMemory, ForwardMemoryIsLinearInN) {
  for (const std::string name : {"linear", "performer"}) {
    std::vector<size_t> b;
    for (int64_t n : {1024, 2048, 4096}) {
      const auto& info = find_mechanism(name);
      const Shape4 s{1, 8, n, 64};
      b.push_back(info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, resolve_params(info, {}))
                      ->working_bytes(Mode::fwd));
    }
    // Equal steps: bytes = a + c N (the oneDNN scratchpad may differ by product size, so allow
    // a small constant of slack).
    const double d1 = double(b[1]) - double(b[0]), d2 = double(b[2]) - double(b[1]);
    EXPECT_NEAR(d2, 2 * d1, 64 * 1024) << name;
  }
}

TEST(KernelFlops, AnalyticCounts) {
  const Shape4 s{1, 8, 4096, 64};
  const auto& info = find_mechanism("linear");
  auto lin = info.make(AttnProblem{s, false, Strides3::contiguous(s), 1}, resolve_params(info, {}));
  EXPECT_DOUBLE_EQ(lin->flops(Mode::fwd), 8.0 * (4.0 * 4096 * 64 * 64 + 3.0 * 4096 * 64));
  auto lin_c = info.make(AttnProblem{s, true, Strides3::contiguous(s), 1}, resolve_params(info, {}));
  const double pairs = 64.0 * (64 * 65 / 2);
  EXPECT_DOUBLE_EQ(lin_c->flops(Mode::fwd), 8.0 * (4.0 * 4096 * 64 * 64 + 3.0 * 4096 * 64 + pairs * 256));
}

}  // namespace
}  // namespace ab
