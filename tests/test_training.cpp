// The attention layer's training features: attention dropout (a fixed mask per key, equal in
// flash and vanilla, differentiated exactly), the gradients of the mechanisms' own learned
// tensors against finite differences, and the redrawing of random tensors between steps.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "attention_impls/registry.hpp"
#include "bench/engine/runner.hpp"
#include "core/dropout.hpp"
#include "tests/helpers.hpp"

namespace ab {
namespace {

// A mechanism set up for forward and backward on seeded inputs, planned for training.
struct Trained {
  std::unique_ptr<AttnData> data;
  std::unique_ptr<Attention> impl;
};

Trained make(const std::string& name, const Shape4& s, bool causal, const std::vector<std::string>& params,
             bool dropout, bool param_grads, int threads = 1, uint64_t seed = 3) {
  omp_set_num_threads(threads);
  const auto& info = find_mechanism(name);
  AttnProblem p{s, causal, Strides3::contiguous(s), threads};
  p.attn_dropout = dropout;
  p.param_grads = param_grads;
  Trained t;
  t.impl = info.make(p, resolve_params(info, params));
  t.impl->validate();
  t.data = std::make_unique<AttnData>(s, seed, true);
  Rng rng(seed, kStreamParams);
  t.impl->setup(Mode::fwdbwd, rng);
  return t;
}

double loss_of(Trained& t) {  // L = sum(dO * O)
  const AttnArgs a = t.data->args();
  t.impl->forward(a);
  double l = 0;
  for (size_t i = 0; i < t.data->o.size(); ++i) l += double(t.data->o.data()[i]) * t.data->dout.data()[i];
  return l;
}

std::vector<float> copy_of(const Tensor& x) { return std::vector<float>(x.data(), x.data() + x.size()); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a.data()[i]) - b.data()[i]));
  return m;
}

TEST(AttentionDropout, MaskKeepsTheRateAndIsAFunctionOfPosition) {
  const Dropout d{0.3f, 99};
  int64_t kept = 0;
  const int64_t n = 1 << 20;
  for (int64_t i = 0; i < n; ++i) kept += d.keep(static_cast<uint64_t>(i / 1024), i % 1024) ? 1 : 0;
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.7, 0.003);
  std::vector<float> x(1024, 1.0f);
  d.apply(x.data(), 1024, 5, 0);
  for (int64_t j = 0; j < 1024; ++j) EXPECT_EQ(x[static_cast<size_t>(j)], d.keep(5, j) ? 1.0f / 0.7f : 0.0f) << j;
  // From an offset, on negative and infinite values: kept ones scaled, dropped ones +0 whatever
  // they held (a -0 or a NaN from inf * 0 would be a different result).
  std::vector<float> y(100);
  for (size_t c = 0; c < y.size(); ++c) y[c] = c % 3 == 0 ? -std::numeric_limits<float>::infinity() : -2.0f;
  const std::vector<float> y0 = y;
  d.apply(y.data(), 100, 7, 300);
  for (int64_t c = 0; c < 100; ++c) {
    const float got = y[static_cast<size_t>(c)];
    if (d.keep(7, 300 + c)) {
      EXPECT_EQ(got, y0[static_cast<size_t>(c)] * (1.0f / 0.7f)) << c;
    } else {
      EXPECT_EQ(got, 0.0f) << c;
      EXPECT_FALSE(std::signbit(got)) << c;
    }
  }
  int differ = 0;
  for (int64_t j = 0; j < 64; ++j) differ += d.keep(5, j) != Dropout{0.3f, 98}.keep(5, j) ? 1 : 0;
  EXPECT_GT(differ, 10);  // another key, another mask
}

// Both exact baselines hash the same (b, h, i, j): under one key they compute the same dropped
// attention, forward and backward; a rate of 0 is no dropout; another key is another mask.
TEST(AttentionDropout, FlashEqualsVanillaUnderTheSameMask) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    const Shape4 s{2, 3, 77, 16};
    auto v = make("vanilla", s, causal, {}, true, false);
    auto f = make("flash", s, causal, {}, true, false);
    auto plain = make("flash", s, causal, {}, true, false);
    const Dropout d{0.25f, 1234};
    for (Trained* t : {&v, &f}) {
      t->impl->set_dropout(d);
      t->impl->forward(t->data->args());
      t->impl->backward(t->data->args());
    }
    plain.impl->set_dropout(Dropout{0.0f, 1234});
    plain.impl->forward(plain.data->args());
    EXPECT_LT(max_abs_diff(v.data->o, f.data->o), 2e-5);
    EXPECT_LT(max_abs_diff(v.data->dq, f.data->dq), 2e-4);
    EXPECT_LT(max_abs_diff(v.data->dk, f.data->dk), 2e-4);
    EXPECT_LT(max_abs_diff(v.data->dv, f.data->dv), 2e-4);
    EXPECT_GT(max_abs_diff(plain.data->o, f.data->o), 1e-2);  // the mask did something
    f.impl->set_dropout(Dropout{0.25f, 1235});
    const auto before = copy_of(f.data->o);
    f.impl->forward(f.data->args());
    EXPECT_NE(before, copy_of(f.data->o));
  }
}

// Every mechanism that applies attention dropout: the same key gives the same output, and the
// backward pass is the derivative of the dropped forward (central differences, mask fixed).
TEST(AttentionDropout, EveryCapableMechanismIsDeterministicAndDifferentiable) {
  const std::map<std::string, std::vector<std::string>> params = {
      {"local", {"block=16"}}, {"sliding", {"window=9"}}, {"dilated", {"window=5", "dilation=2"}},
      {"strided", {"stride=8"}}, {"longformer", {"window=6", "global=4"}},
      {"bigbird", {"block=8", "random_blocks=1"}}, {"linformer", {"k=16"}}, {"memory_compressed", {"stride=3"}},
      {"synthesizer", {"variant=factorized", "k=4"}}};
  int checked = 0;
  for (const auto& info : mechanisms()) {
    if (!info.caps.attn_dropout) {
      EXPECT_FALSE(info.caps.no_attn_dropout.empty()) << info.name << " says why it applies no attention dropout";
      continue;
    }
    SCOPED_TRACE(info.name);
    const auto it = params.find(info.name);
    const Shape4 s{1, 2, 48, 16};
    for (bool causal : {false, true}) {
      if (causal && !info.caps.causal) continue;
      test::Run r;
      {
        Trained t = make(info.name, s, causal, it == params.end() ? std::vector<std::string>{} : it->second, true, false);
        r.data = std::move(t.data);
        r.impl = std::move(t.impl);
      }
      r.impl->set_dropout(Dropout{0.2f, 42});
      r.impl->forward(r.data->args());
      const auto first = copy_of(r.data->o);
      r.impl->forward(r.data->args());
      EXPECT_EQ(first, copy_of(r.data->o));
      r.impl->backward(r.data->args());
      EXPECT_GT(test::check_gradients_by_differences(r, 7, 2e-3, 2e-2), 0);
      ++checked;
    }
  }
  EXPECT_GE(checked, 11);
}

// Synthesizer's dense logits and sinkhorn's sorting network have a ReLU on x W1 (+ b1), x the
// query rows (synthesizer) or the block means of the queries (sinkhorn). Perturbing W1[h, c, o]
// by +-eps moves every row's pre-activation o by +-eps x_c (b1[h, o]: by +-eps); where that can
// cross zero, a central difference straddles a kink and measures neither side, so the element is
// left out (as LowRankFiniteDifferences leaves out query rows near a kink).
bool relu_kink_in_reach(Trained& t, const std::string& mech, const std::vector<std::string>& params,
                        const std::string& name, int64_t index, float eps) {
  const bool dense = mech == "synthesizer" && !params.empty() && params[0] == "variant=dense";
  if (!(dense || mech == "sinkhorn") || (name != "W1" && name != "b1")) return false;
  const Shape4 s = t.data->q.shape();
  const int64_t D = s.D;
  const float* W1 = test::tensor(*t.impl, "W1").f32;
  const float* b1 = dense ? test::tensor(*t.impl, "b1").f32 : nullptr;
  const bool bias = name == "b1";
  const int64_t h = bias ? index / D : index / (D * D), c = bias ? -1 : (index / D) % D, o = index % D;
  // The rows x of head h, all batches: queries, or block means.
  int64_t block = 1;
  for (const auto& p : params)
    if (p.rfind("block=", 0) == 0) block = std::stoll(p.substr(6));
  if (mech == "sinkhorn" && block == 1) block = 64;
  const int64_t per = dense ? 1 : block;
  std::vector<float> x(static_cast<size_t>(D));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t r0 = 0; r0 < s.N; r0 += per) {
      std::fill(x.begin(), x.end(), 0.0f);
      for (int64_t r = r0; r < r0 + per; ++r)
        for (int64_t d = 0; d < D; ++d) x[static_cast<size_t>(d)] += t.data->q.view().at(b, h, r, d) / static_cast<float>(per);
      double pre = b1 ? b1[h * D + o] : 0.0;
      for (int64_t d = 0; d < D; ++d) pre += double(x[static_cast<size_t>(d)]) * W1[(h * D + d) * D + o];
      const double reach = 1.5 * eps * (bias ? 1.0 : std::abs(x[static_cast<size_t>(c)]));
      if (std::abs(pre) < reach) return true;
    }
  return false;
}

// The gradient of every learned tensor of every mechanism that has them, against central
// differences of L = sum(dO * O), at one and two threads (the two-thread sums run in a fixed
// order and equal the one-thread ones to rounding).
TEST(LearnedTensors, GradientsMatchFiniteDifferences) {
  struct Case {
    std::string mech;
    std::vector<std::string> params;
    bool causal;
  };
  const std::vector<Case> cases = {
      {"linformer", {"k=12"}, false},          {"linformer", {"k=12", "share_kv=true"}, false},
      {"memory_compressed", {"stride=3"}, false}, {"synthesizer", {"variant=dense", "max_len=40"}, false},
      {"synthesizer", {"variant=dense"}, true}, {"synthesizer", {"variant=random"}, false},
      {"synthesizer", {"variant=random"}, true}, {"synthesizer", {"variant=factorized", "k=3"}, true},
      {"sinkhorn", {"block=8"}, false},        {"sinkhorn", {"block=4", "temperature=0.5"}, false},
      {"lightconv", {"kernel=5"}, false},      {"lightconv", {"kernel=31"}, true},
      {"dynamicconv", {"kernel=5"}, false},    {"dynamicconv", {"kernel=6"}, true}};
  std::set<std::string> covered;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.mech + " " + (c.params.empty() ? "" : c.params.back()) + (c.causal ? " causal" : ""));
    const Shape4 s{2, 2, 32, 8};
    std::vector<std::vector<float>> by_threads;
    for (int threads : {1, 2}) {
      Trained t = make(c.mech, s, c.causal, c.params, false, true, threads);
      t.impl->forward(t.data->args());
      t.impl->backward(t.data->args());
      auto learned = t.impl->learned();
      ASSERT_FALSE(learned.empty());
      std::vector<float> all;
      for (const auto& lt : learned) {
        ASSERT_NE(lt.grad, nullptr) << lt.name;
        all.insert(all.end(), lt.grad, lt.grad + lt.count);
        covered.insert(c.mech);
      }
      by_threads.push_back(all);
      if (threads != 1) continue;
      for (const auto& lt : learned) {
        const std::vector<float> grad(lt.grad, lt.grad + lt.count);
        const int64_t step = std::max<int64_t>(1, lt.count / 40);
        const float eps = 3e-3f;  // small, so that few rows have a kink in reach
        int sampled = 0, compared = 0;
        for (int64_t i = 0; i < lt.count; i += step) {
          ++sampled;
          if (relu_kink_in_reach(t, c.mech, c.params, lt.name, i, eps)) continue;
          const float keep = lt.value[i];
          lt.value[i] = keep + eps;
          const double up = loss_of(t);
          lt.value[i] = keep - eps;
          const double down = loss_of(t);
          lt.value[i] = keep;
          const double fd = (up - down) / (2 * double(eps));
          EXPECT_NEAR(grad[static_cast<size_t>(i)], fd, 2e-3 + 2e-2 * std::abs(fd)) << lt.name << "[" << i << "]";
          ++compared;
        }
        EXPECT_GE(2 * compared, sampled) << lt.name << ": most samples are away from a kink";
      }
    }
    ASSERT_EQ(by_threads[0].size(), by_threads[1].size());
    for (size_t i = 0; i < by_threads[0].size(); ++i)
      EXPECT_NEAR(by_threads[0][i], by_threads[1][i], 1e-4 + 1e-4 * std::abs(by_threads[0][i])) << i;
  }
  // Every registered mechanism with learned tensors is among the cases.
  for (const auto& info : mechanisms()) {
    Trained t = make(info.name, Shape4{1, 1, 64, 8}, false,
                     info.name == "bigbird" ? std::vector<std::string>{"block=8"} : std::vector<std::string>{},
                     false, true);
    if (!t.impl->learned().empty()) {
      EXPECT_TRUE(covered.count(info.name)) << info.name << " has learned tensors";
    }
  }
}

// Reformer draws fresh rotations every training step (redraw=step, the default) or keeps them;
// Performer draws a fresh Omega every `redraw` steps.
TEST(Redraw, ReformerEveryStepPerformerEveryRedrawSteps) {
  const Shape4 s{1, 2, 64, 16};
  auto rotations = [](Trained& t) {
    const auto d = t.impl->dump_tensors();
    return std::vector<float>(d[0].f32, d[0].f32 + d[0].shape[0] * d[0].shape[1] * d[0].shape[2] * d[0].shape[3]);
  };
  Trained r = make("reformer", s, false, {"bucket_size=16"}, false, true);
  Trained kept = make("reformer", s, false, {"bucket_size=16", "redraw=never"}, false, true);
  Rng rng(5, 77);
  const auto r0 = rotations(r), k0 = rotations(kept);
  r.impl->begin_train_step(1, rng);
  kept.impl->begin_train_step(1, rng);
  EXPECT_NE(r0, rotations(r));
  EXPECT_EQ(k0, rotations(kept));

  Trained p = make("performer", s, false, {"features=32", "redraw=3"}, false, true);
  auto omega = [](Trained& t) {
    const auto d = t.impl->dump_tensors();
    return std::vector<float>(d[0].f32, d[0].f32 + d[0].shape[0] * d[0].shape[1]);
  };
  const auto o0 = omega(p);
  for (int64_t step = 1; step <= 3; ++step) p.impl->begin_train_step(step, rng);
  EXPECT_EQ(o0, omega(p));
  p.impl->forward(p.data->args());
  const auto out3 = copy_of(p.data->o);
  p.impl->begin_train_step(4, rng);
  EXPECT_NE(o0, omega(p));
  p.impl->forward(p.data->args());
  EXPECT_NE(out3, copy_of(p.data->o));
}

}  // namespace
}  // namespace ab
