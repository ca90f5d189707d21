// The model level: gradients of every parameter against finite differences, learning on `copy`,
// the arena's exact memory, and one training step of every mechanism.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "attention_impls/registry.hpp"
#include "core/memory.hpp"
#include "helpers.hpp"
#include "model/transformer.hpp"
#include "tasks/task.hpp"

using namespace ab;

namespace {

// A task's model shrunk to test size.
ModelConfig tiny(const std::string& task, const std::string& mech, std::vector<std::string> params, int64_t seq) {
  ModelConfig c = model_config_for_task(find_task(task), seq);
  c.layers = 2;
  c.dmodel = 16;
  c.heads = 2;
  c.mlp = 24;
  c.batch = 2;
  c.mechanism = mech;
  c.params = resolve_params(find_mechanism(mech), params);
  return c;
}

Batch batch_of(const std::string& task, int64_t seq, int64_t first, int64_t size, uint64_t seed = 7) {
  TaskOptions o;
  o.seq = seq;
  o.seed = seed;
  return make_task(task, o)->batch(first, size);
}

// Central differences of the loss against the backward pass, on up to `per_slice` elements of
// every parameter slice (spread over the slice). Returns the number of elements checked.
int check_model_gradients(TransformerModel& m, const Batch& b, int per_slice, double tol_abs, double tol_rel) {
  m.step(b);  // fwdbwd: gradients of this batch's loss
  const int64_t n = m.parameter_count();
  std::vector<float> grad(m.gradients(), m.gradients() + n);
  const float eps = 1e-2f;
  int checked = 0;
  for (const auto& s : m.parameters()) {
    const int64_t stride = std::max<int64_t>(1, s.count / per_slice);
    for (int64_t i = s.offset + stride / 2; i < s.offset + s.count; i += stride) {
      float& w = m.weights()[i];
      const float saved = w;
      w = saved + eps;
      const double lp = m.loss(b);
      w = saved - eps;
      const double lm = m.loss(b);
      w = saved;
      const double fd = (lp - lm) / (2.0 * eps);
      const double an = grad[static_cast<size_t>(i)];
      EXPECT_NEAR(fd, an, tol_abs + tol_rel * std::abs(an)) << s.name << " element " << i - s.offset;
      ++checked;
    }
  }
  return checked;
}

struct GradCase {
  std::string task, mech;
  std::vector<std::string> params;
  int64_t seq;
};

void PrintTo(const GradCase& g, std::ostream* os) { *os << g.task << "/" << g.mech << "/N=" << g.seq; }

class ModelGradients : public ::testing::TestWithParam<GradCase> {};

TEST_P(ModelGradients, EveryParameterMatchesFiniteDifferences) {
  const GradCase& g = GetParam();
  ModelConfig c = tiny(g.task, g.mech, g.params, g.seq);
  TransformerModel m(c, Mode::fwdbwd);
  m.setup(3);
  const Batch b = batch_of(g.task, g.seq, 0, c.batch);
  const int checked = check_model_gradients(m, b, 4, 2e-3, 3e-2);
  EXPECT_GE(checked, static_cast<int>(m.parameters().size()));
}

// One mechanism per family, on a CLS classifier (listops); then the other heads.
INSTANTIATE_TEST_SUITE_P(
    Families, ModelGradients,
    ::testing::Values(GradCase{"listops", "flash", {}, 32}, GradCase{"listops", "local", {"block=8"}, 32},
                      GradCase{"listops", "linformer", {"k=8"}, 32},
                      GradCase{"listops", "sinkhorn", {"block=8"}, 32},
                      GradCase{"listops", "performer", {"features=16"}, 32},
                      GradCase{"listops", "synthesizer", {}, 32},
                      // causal LM head (copy), mean pooling (image), two towers (retrieval)
                      GradCase{"copy", "flash", {}, 32}, GradCase{"copy", "linear", {}, 32},
                      GradCase{"image", "flash", {}, 1024}, GradCase{"retrieval", "flash", {}, 64}),
    [](const auto& info) { return info.param.task + "_" + info.param.mech; });

}  // namespace
