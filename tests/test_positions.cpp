// Position encodings that act inside attention: RoPE's rotation (norms kept, q·k a function of
// the offset only, the inverse undoes it), the model's gradients through it against finite
// differences, its effect reaching the logits, exact mechanisms agreeing under it, and the
// combinations that are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "attention_impls/registry.hpp"
#include "core/rng.hpp"
#include "core/rope.hpp"
#include "helpers.hpp"
#include "model/layers.hpp"
#include "model/transformer.hpp"
#include "tasks/task.hpp"

using namespace ab;

namespace {

ModelConfig tiny_rope(const std::string& task, const std::string& mech, std::vector<std::string> params, int64_t seq,
                      Positions positions = Positions::rope) {
  ModelConfig c = test::tiny_model_config(task, mech, std::move(params), seq, 2);
  c.positions = positions;
  return c;
}

Batch batch_of(const std::string& task, int64_t seq, int64_t size) {
  TaskOptions o;
  o.seq = seq;
  o.seed = 7;
  return make_task(task, o)->batch(0, size);
}

double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace

// One query and one key, each placed at every position of a (1, 1, N, Dh) tensor and rotated:
// the rotation keeps each row's norm, q_m·k_n depends on m - n only, and the inverse rotation
// gives the rows back.
TEST(Rope, RotationKeepsNormsAndMakesTheProductAFunctionOfTheOffset) {
  const int64_t N = 64, Dh = 16;
  std::vector<float> table(static_cast<size_t>(N * Dh));
  rope_table(N, Dh, table.data());
  std::vector<float> q0(Dh), k0(Dh);
  Rng rng(3, 0);
  rng.fill_normal(q0.data(), Dh, 1.0f);
  rng.fill_normal(k0.data(), Dh, 1.0f);
  std::vector<float> q(static_cast<size_t>(N * Dh)), k(q.size());
  for (int64_t n = 0; n < N; ++n) {
    std::copy(q0.begin(), q0.end(), q.begin() + n * Dh);
    std::copy(k0.begin(), k0.end(), k.begin() + n * Dh);
  }
  const std::vector<float> q_before = q;
  rope_rotate(q.data(), 1, 1, N, Dh, table.data(), false);
  rope_rotate(k.data(), 1, 1, N, Dh, table.data(), false);
  const double norm_q = std::sqrt(dot(q0.data(), q0.data(), Dh));
  for (int64_t n = 0; n < N; ++n)
    EXPECT_NEAR(std::sqrt(dot(&q[n * Dh], &q[n * Dh], Dh)), norm_q, 1e-5 * norm_q) << "position " << n;
  // Row 0 is not rotated; later rows are.
  EXPECT_EQ(std::vector<float>(q.begin(), q.begin() + Dh), q0);
  EXPECT_GT(std::abs(q[5 * Dh] - q0[0]) + std::abs(q[5 * Dh + 1] - q0[1]), 1e-3);
  for (int64_t offset : {-20, -3, 0, 1, 7, 31}) {
    const int64_t m0 = std::max<int64_t>(0, offset);  // q at m, k at m - offset
    const double ref = dot(&q[m0 * Dh], &k[(m0 - offset) * Dh], Dh);
    for (int64_t m = m0; m < N && m - offset < N; m += 5)
      EXPECT_NEAR(dot(&q[m * Dh], &k[(m - offset) * Dh], Dh), ref, 2e-5 * (1 + std::abs(ref)))
          << "offset " << offset << " at m " << m;
  }
  // Different offsets give different products (the rotation is not the identity).
  EXPECT_GT(std::abs(dot(&q[10 * Dh], &k[10 * Dh], Dh) - dot(&q[10 * Dh], &k[3 * Dh], Dh)), 1e-3);
  rope_rotate(q.data(), 1, 1, N, Dh, table.data(), true);
  for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(q[i], q_before[i], 1e-5) << i;
}

// RoFormer's angles: pair i of position n turns by n · 10000^(-2i/Dh).
TEST(Rope, TableHoldsRoFormersAngles) {
  const int64_t N = 9, Dh = 8;
  std::vector<float> table(static_cast<size_t>(N * Dh));
  rope_table(N, Dh, table.data());
  for (int64_t n : {0, 1, 8})
    for (int64_t i : {0, 1, 3}) {
      const double angle = n * std::pow(10000.0, -2.0 * i / Dh);
      EXPECT_NEAR(table[n * 4 + i], std::cos(angle), 1e-6);
      EXPECT_NEAR(table[N * 4 + n * 4 + i], std::sin(angle), 1e-6);
    }
}

struct RopeCase {
  std::string task, mech;
  std::vector<std::string> params;
};
void PrintTo(const RopeCase& c, std::ostream* os) { *os << c.task << "/" << c.mech; }

class RopeGradients : public ::testing::TestWithParam<RopeCase> {};

// The gradients of every parameter through the rotation (the inverse rotation of dq, dk).
TEST_P(RopeGradients, EveryParameterMatchesFiniteDifferences) {
  const RopeCase& g = GetParam();
  ModelConfig c = tiny_rope(g.task, g.mech, g.params, 32);
  TransformerModel m(c, ModelMode::fwdbwd);
  m.setup(3);
  const int checked = test::check_model_gradients(m, batch_of(g.task, 32, c.batch), 4, 2e-3, 3e-2);
  EXPECT_GE(checked, static_cast<int>(m.parameters().size()));
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, RopeGradients,
                         ::testing::Values(RopeCase{"copy", "flash", {}}, RopeCase{"listops", "flash", {}},
                                           RopeCase{"listops", "sliding", {"window=8"}},
                                           RopeCase{"copy", "local", {"block=8"}},
                                           RopeCase{"copy", "linear", {"chunk=8"}},
                                           RopeCase{"listops", "performer", {"features=8"}}));

// The kernel family takes RoPE inside (its feature maps, RoFormer section 3.3): the model leaves
// q and k alone, the mechanism's rotation changes the loss.
TEST(Rope, KernelMechanismsRotateTheirFeatureMapsInside) {
  const Batch b = batch_of("copy", 32, 2);
  for (const std::string mech : {"linear", "performer"}) {
    auto loss_of = [&](Positions p) {
      TransformerModel m(tiny_rope("copy", mech, {}, 32, p), ModelMode::fwdbwd);
      m.setup(3);
      return m.loss(b);
    };
    EXPECT_GT(std::abs(loss_of(Positions::rope) - loss_of(Positions::none)), 1e-4) << mech;
    EXPECT_TRUE(find_mechanism(mech).caps.rope_feature_maps) << mech;
    // The rotation is the mechanism's: its working memory holds the angle table, and the model's
    // activations hold no q, k table (as they do for a mechanism that takes rotated q and k).
    auto part = [&](Positions p, const std::string& name) {
      TransformerModel m(tiny_rope("copy", mech, {}, 32, p), ModelMode::fwdbwd);
      for (const auto& [n, bytes] : m.memory_parts())
        if (n == name) return bytes;
      return size_t{0};
    };
    EXPECT_GT(part(Positions::rope, "attention"), part(Positions::none, "attention")) << mech;
    EXPECT_EQ(part(Positions::rope, "activations"), part(Positions::none, "activations")) << mech;
  }
}

// The rotation reaches the logits: the same weights give another loss than without positions;
// and exact mechanisms stay equal under it (flash, vanilla, a local window covering every key).
TEST(Rope, ChangesTheLossAndExactMechanismsAgreeUnderIt) {
  const Batch b = batch_of("listops", 32, 2);
  auto loss_of = [&](const std::string& mech, std::vector<std::string> params, Positions p) {
    TransformerModel m(tiny_rope("listops", mech, params, 32, p), ModelMode::fwdbwd);
    m.setup(3);
    return m.loss(b);
  };
  const double rope = loss_of("flash", {}, Positions::rope);
  EXPECT_GT(std::abs(rope - loss_of("flash", {}, Positions::none)), 1e-4);
  EXPECT_NEAR(loss_of("vanilla", {}, Positions::rope), rope, 1e-5 * std::abs(rope));
  EXPECT_NEAR(loss_of("local", {"block=32", "lookback=0", "lookahead=0"}, Positions::rope), rope, 1e-5 * std::abs(rope));
}

// Mechanisms whose logits a rotation does not reach in RoFormer's sense are refused with the
// reason; so is an odd head size. Exit 2 through the command line, naming both.
TEST(Rope, RefusedCombinationsExitTwoNamingTheMechanism) {
  for (const auto& m : mechanisms()) {
    if (m.caps.rope) continue;
    const auto e = test::exec("train --task copy --seq 16 --layers 1 --dmodel 16 --heads 2 --mlp 16 --batch 4 --steps 1 --attn " +
                              m.name + " --positions rope --out " + test::temp_path("rope_refused.json"));
    EXPECT_EQ(e.code, 2) << m.name << ": " << e.out;
    EXPECT_NE(e.out.find("--positions rope with " + m.name), std::string::npos) << e.out;
  }
  const auto e = test::exec("train --task copy --seq 16 --layers 1 --dmodel 18 --heads 2 --mlp 16 --batch 4 --steps 1 "
                            "--attn flash --positions rope --out " + test::temp_path("rope_odd.json"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("odd"), std::string::npos) << e.out;
}

// Trains 4 steps with --positions `saved` into a checkpoint, then resumes it with `resumed`:
// exit 2 naming the resumed point's encoding. Removes only the test's own temporary paths.
static void expect_checkpoint_refuses(const std::string& name, const std::string& saved, const std::string& resumed) {
  const std::string dir = test::temp_path(name), out = test::temp_path(name + ".json");
  std::filesystem::remove_all(dir);
  std::filesystem::remove(out);
  const std::string run = "train --task copy --seq 16 --layers 1 --dmodel 16 --heads 2 --mlp 16 --batch 4 --steps 4 "
                          "--attn flash --checkpoint " + dir + " --out " + out;
  auto e = test::exec(run + " --positions " + saved);
  ASSERT_EQ(e.code, 0) << e.out;
  std::filesystem::remove(out);
  e = test::exec(run + " --positions " + resumed + " --resume");
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("positions:" + resumed), std::string::npos) << e.out;
  std::filesystem::remove_all(dir);
}

// A checkpoint belongs to its encoding: one saved without positions does not resume with rope.
TEST(Rope, ACheckpointRefusesAnotherEncoding) { expect_checkpoint_refuses("rope_ck", "none", "rope"); }

// ---- the additive encodings (alibi, bias, shaw) at the model level ----

class AdditiveGradients : public ::testing::TestWithParam<std::tuple<RopeCase, Positions>> {};

// Every model parameter through the encoding inside the mechanism (its own table's gradient is
// checked against the reference in test_position_bias.cpp).
TEST_P(AdditiveGradients, EveryParameterMatchesFiniteDifferences) {
  const auto& [g, p] = GetParam();
  ModelConfig c = tiny_rope(g.task, g.mech, g.params, 32, p);
  TransformerModel m(c, ModelMode::fwdbwd);
  m.setup(3);
  const int checked = test::check_model_gradients(m, batch_of(g.task, 32, c.batch), 4, 2e-3, 3e-2);
  EXPECT_GE(checked, static_cast<int>(m.parameters().size()));
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, AdditiveGradients,
                         ::testing::Values(std::tuple{RopeCase{"copy", "flash", {}}, Positions::alibi},
                                           std::tuple{RopeCase{"listops", "sliding", {"window=8"}}, Positions::bias},
                                           std::tuple{RopeCase{"copy", "local", {"block=8"}}, Positions::shaw},
                                           std::tuple{RopeCase{"listops", "vanilla", {}}, Positions::shaw}));

// The encoding reaches the logits, exact mechanisms agree under it (their tables are drawn alike
// from the layer's seed), and a training step moves the learned table.
TEST(AdditivePositions, ChangeTheLossExactMechanismsAgreeAndTablesTrain) {
  const Batch b = batch_of("listops", 32, 2);
  for (Positions p : {Positions::alibi, Positions::bias, Positions::shaw}) {
    SCOPED_TRACE(to_string(p));
    auto loss_of = [&](const std::string& mech, std::vector<std::string> params, Positions pp) {
      TransformerModel m(tiny_rope("listops", mech, params, 32, pp), ModelMode::fwdbwd);
      m.setup(3);
      return m.loss(b);
    };
    const double with = loss_of("flash", {}, p);
    EXPECT_GT(std::abs(with - loss_of("flash", {}, Positions::none)), 1e-4);
    EXPECT_NEAR(loss_of("vanilla", {}, p), with, 1e-5 * std::abs(with));
    EXPECT_NEAR(loss_of("local", {"block=32", "lookback=0", "lookahead=0"}, p), with, 1e-5 * std::abs(with));
    if (p == Positions::alibi) continue;
    TransformerModel m(tiny_rope("listops", "flash", {}, 32, p), ModelMode::train);
    m.setup(3);
    const auto tensors = m.trained_tensors();
    auto table = std::find_if(tensors.begin(), tensors.end(), [](const auto& t) { return t.name.find("mechanism.") != std::string::npos; });
    ASSERT_NE(table, tensors.end());
    const std::vector<float> before(table->data, table->data + table->count);
    m.step(b);
    EXPECT_NE(std::vector<float>(table->data, table->data + table->count), before) << table->name;
  }
}

// A checkpoint belongs to its encoding's parameters too: shaw:8 does not resume shaw:4.
TEST(AdditivePositions, ACheckpointRefusesOtherParameters) { expect_checkpoint_refuses("shaw_ck", "shaw:4", "shaw:8"); }
