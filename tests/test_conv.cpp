// lightconv and dynamicconv against the float64 formula beside their kernels (the kernel's softmax
// over the taps, zero padding, causal left padding), their gradients by finite
// differences, kernel 1 as the identity, dynamicconv with a zero predictor as lightconv, FLOPs
// and tracked memory as declared. The causal-prefix and decode checks of every causal mechanism
// (tests/test_recall.cpp) and the parameter gradients of every learned tensor
// (tests/test_training.cpp) cover them too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "attention_impls/softmax_conv.hpp"
#include "tests/helpers.hpp"
#include "tests/reference.hpp"

namespace ab {
namespace {

using test::run_mechanism;
using test::tensor;

struct ConvCase {
  std::string mech;
  int64_t kernel;
  bool causal;
};

std::ostream& operator<<(std::ostream& os, const ConvCase& c) {
  return os << c.mech << " kernel=" << c.kernel << (c.causal ? " causal" : "");
}

class SoftmaxConvFormula : public ::testing::TestWithParam<ConvCase> {};

// O_i = sum_t w_{i,t} V_{i-pad+t}, the formula beside the kernel (ref::lightconv,
// ref::dynamicconv); and dV = A^T dO, with A (N, N) the formula's mixing matrix of each head, read
// off by applying the formula to the identity in place of V. Keys are not used: dK = 0.
TEST_P(SoftmaxConvFormula, OutputAndValueGradientEqualTheFormula) {
  const ConvCase c = GetParam();
  const Shape4 s{2, 3, 23, 8};
  const std::vector<std::string> ps = {"kernel=" + std::to_string(c.kernel)};
  auto r = run_mechanism(c.mech, s, c.causal, Mode::fwdbwd, ps, 11);
  const AttnArgs a = r.data->args();
  const auto want_o = test::formula(c.mech, ps, *r.impl, a, c.causal);
  Tensor eye(Shape4{s.B, s.H, s.N, s.N});
  eye.zero();
  for (int64_t bh = 0; bh < s.B * s.H; ++bh)
    for (int64_t i = 0; i < s.N; ++i) eye.data()[(bh * s.N + i) * s.N + i] = 1.0f;
  AttnArgs mixing = a;
  mixing.v = eye.view();
  const auto A = test::formula(c.mech, ps, *r.impl, mixing, c.causal);  // (B, H, N, N)
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t j = 0; j < s.N; ++j)
        for (int64_t d = 0; d < s.D; ++d) {
          double want_dv = 0;
          for (int64_t i = 0; i < s.N; ++i) want_dv += A[((b * s.H + h) * s.N + i) * s.N + j] * a.dout.at(b, h, i, d);
          ASSERT_NEAR(a.o.at(b, h, j, d), want_o[ref::idx(s, b, h, j, d)], 1e-5) << "O b=" << b << " h=" << h << " i=" << j;
          ASSERT_NEAR(a.dv.at(b, h, j, d), want_dv, 1e-5) << "dV b=" << b << " h=" << h << " j=" << j;
          ASSERT_EQ(a.dk.at(b, h, j, d), 0.0f) << "keys are not used";
        }
}

// dQ (dynamicconv's predictor reads the query), dK, dV by central differences of sum(dO * O).
TEST_P(SoftmaxConvFormula, InputGradientsMatchFiniteDifferences) {
  const ConvCase c = GetParam();
  auto r = run_mechanism(c.mech, Shape4{1, 2, 19, 8}, c.causal, Mode::fwdbwd, {"kernel=" + std::to_string(c.kernel)}, 5);
  EXPECT_GT(test::check_gradients_by_differences(r, 3, 1e-3, 1e-2), 100);
}

INSTANTIATE_TEST_SUITE_P(Cases, SoftmaxConvFormula,
                         ::testing::Values(ConvCase{"lightconv", 5, false}, ConvCase{"lightconv", 5, true},
                                           ConvCase{"lightconv", 4, false}, ConvCase{"lightconv", 31, false},
                                           ConvCase{"lightconv", 31, true}, ConvCase{"dynamicconv", 5, false},
                                           ConvCase{"dynamicconv", 4, true}, ConvCase{"dynamicconv", 6, false},
                                           ConvCase{"dynamicconv", 31, true}));

// A kernel of one tap is softmax of one logit = 1: the output is V itself.
TEST(LightConv, KernelOfOneIsTheIdentity) {
  for (const char* mech : {"lightconv", "dynamicconv"})
    for (bool causal : {false, true}) {
      auto r = run_mechanism(mech, Shape4{2, 2, 17, 8}, causal, Mode::fwd, {"kernel=1"});
      ASSERT_EQ(std::memcmp(r.data->o.data(), r.data->v.data(), r.data->v.size() * sizeof(float)), 0) << mech;
    }
}

// dynamicconv whose predictor weights are zero has the kernel softmax(b_h) at every position:
// lightconv with theta = b.
TEST(DynamicConv, ZeroPredictorIsLightconv) {
  const Shape4 s{2, 2, 29, 8};
  for (bool causal : {false, true}) {
    auto light = run_mechanism("lightconv", s, causal, Mode::fwd, {"kernel=7"}, 3);
    auto dyn = run_mechanism("dynamicconv", s, causal, Mode::fwd, {"kernel=7"}, 3);
    const DumpTensor theta = tensor(*light.impl, "theta"), W = tensor(*dyn.impl, "W"), b = tensor(*dyn.impl, "b");
    std::fill_n(W.f32, s.H * s.D * 7, 0.0f);
    std::copy_n(theta.f32, s.H * 7, b.f32);
    dyn.impl->forward(dyn.data->args());
    for (size_t i = 0; i < light.data->o.size(); ++i)
      ASSERT_NEAR(dyn.data->o.data()[i], light.data->o.data()[i], 1e-6) << i;
  }
}

// FLOPs count the taps inside the sequence: N = 10, K = 3 centred has 9 + 10 + 9 = 28; causal
// 8 + 9 + 10 = 27; a kernel wider than the sequence reaches N^2 (centred) at most.
TEST(LightConv, FlopsCountTheTapsInsideTheSequence) {
  EXPECT_EQ(softmax_conv_taps(10, 3, false), 28);
  EXPECT_EQ(softmax_conv_taps(10, 3, true), 27);
  EXPECT_EQ(softmax_conv_taps(10, 4, false), 9 + 10 + 9 + 8);
  EXPECT_EQ(softmax_conv_taps(4, 31, false), 16);
  EXPECT_EQ(softmax_conv_taps(4, 31, true), 10);
  const Shape4 s{2, 3, 10, 8};
  const double BH = 6, D = 8, K = 3, N = 10;
  for (bool learn : {false, true}) {
    AttnProblem p{s, false, Strides3::contiguous(s), 1};
    p.param_grads = learn;
    ParamValues v = resolve_params(find_mechanism("lightconv"), {"kernel=3"});
    auto light = find_mechanism("lightconv").make(p, v);
    auto dyn = find_mechanism("dynamicconv").make(p, v);
    EXPECT_EQ(light->flops(Mode::fwd), BH * 2 * 28 * D);
    EXPECT_EQ(light->flops(Mode::fwdbwd), BH * (learn ? 6 : 4) * 28 * D);
    EXPECT_EQ(dyn->flops(Mode::fwd), BH * (2 * 28 * D + 2 * N * D * K));
    EXPECT_EQ(dyn->flops(Mode::fwdbwd), BH * (6 * 28 * D + (learn ? 6 : 4) * N * D * K));
    EXPECT_EQ(light->flops(Mode::decode), BH * 2 * K * D);
    EXPECT_EQ(dyn->flops(Mode::decode), BH * 4 * K * D);
  }
}

// Tracked bytes equal the declaration in every mode, at one and two threads, and grow with N
// only through dynamicconv's per-position kernels (N K per head), never N^2.
TEST(LightConv, TrackedMemoryAsDeclared) {
  for (const char* mech : {"lightconv", "dynamicconv"})
    for (int threads : {1, 2})
      for (Mode mode : {Mode::fwd, Mode::fwdbwd})
        for (int64_t n : {64, 256}) {
          auto r = run_mechanism(mech, Shape4{2, 2, n, 16}, true, mode, {}, 7, threads);
          EXPECT_EQ(r.tracked_peak, r.declared) << mech << " " << to_string(mode) << " N=" << n << " threads=" << threads;
          if (std::string(mech) == "lightconv") {
            EXPECT_EQ(r.declared, 2 * 2 * 31 * sizeof(float)) << "theta and its softmax, nothing per position";
          }
        }
  // Training (the kernels' gradients): the gradients and each thread's partial sums, declared.
  for (const char* mech : {"lightconv", "dynamicconv"})
    for (int threads : {1, 2}) {
      const Shape4 s{2, 2, 100, 16};
      omp_set_num_threads(threads);
      AttnProblem p{s, true, Strides3::contiguous(s), threads};
      p.param_grads = true;
      auto impl = find_mechanism(mech).make(p, resolve_params(find_mechanism(mech), {}));
      const size_t declared = impl->working_bytes(Mode::fwdbwd);
      AttnData data(s, 3, true);
      const size_t base = MemoryMeter::current();
      MemoryMeter::reset_peak();
      Rng rng(1, kStreamParams);
      impl->setup(Mode::fwdbwd, rng);
      impl->forward(data.args());
      impl->backward(data.args());
      EXPECT_EQ(MemoryMeter::peak() - base, declared) << mech << " threads=" << threads;
    }
  // Decode: a ring of K rows per head, the same at every context length.
  for (const char* mech : {"lightconv", "dynamicconv"}) {
    size_t first = 0;
    for (int64_t n : {64, 1024}) {
      const Shape4 s{1, 2, n, 16};
      auto impl = find_mechanism(mech).make(AttnProblem{s, true, Strides3::contiguous(s), 1}, resolve_params(find_mechanism(mech), {}));
      const size_t declared = impl->working_bytes(Mode::decode), base = MemoryMeter::current();
      MemoryMeter::reset_peak();
      Rng rng(1, kStreamParams);
      impl->setup(Mode::decode, rng);
      EXPECT_EQ(MemoryMeter::peak() - base, declared) << mech;
      if (!first) first = declared;
      EXPECT_EQ(declared, first) << mech << ": decode state independent of the context";
    }
  }
}

}  // namespace
}  // namespace ab
