// The model level: gradients of every parameter against finite differences, learning on `copy`,
// the arena's exact memory, and one training step of every mechanism.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "bench/point.hpp"
#include "attention_impls/registry.hpp"
#include "attention_impls/tiled_softmax.hpp"
#include "core/dtype.hpp"
#include "core/memory.hpp"
#include "helpers.hpp"
#include "model/transformer.hpp"
#include "tasks/task.hpp"

using namespace ab;

namespace {

// A task's model shrunk to test size.
ModelConfig tiny(const std::string& task, const std::string& mech, std::vector<std::string> params, int64_t seq) {
  return test::tiny_model_config(task, mech, std::move(params), seq, 2);
}

Batch batch_of(const std::string& task, int64_t seq, int64_t first, int64_t size, uint64_t seed = 7) {
  TaskOptions o;
  o.seq = seq;
  o.seed = seed;
  return make_task(task, o)->batch(first, size);
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
  TransformerModel m(c, ModelMode::fwdbwd);
  m.setup(3);
  const Batch b = batch_of(g.task, g.seq, 0, c.batch);
  const int checked = test::check_model_gradients(m, b, 4, 2e-3, 3e-2);
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

namespace {

// A few hundred AdamW steps on fresh copy batches: the loss (on the separator and the copy only)
// falls well below its start. Deterministic: fixed seeds, one thread.
TEST(ModelTraining, CopyLossFallsClearly) {
  ModelConfig c = tiny("copy", "flash", {}, 32);
  c.dmodel = 32;
  c.heads = 2;
  c.mlp = 64;
  c.batch = 16;
  c.optimizer.lr = 3e-3f;
  TransformerModel m(c, ModelMode::train);
  m.setup(11);
  TaskOptions o;
  o.seq = c.seq;
  o.seed = 5;
  auto task = make_task("copy", o);
  constexpr int kSteps = 300, kWindow = 20;
  double first = 0, last = 0;
  for (int s = 0; s < kSteps; ++s) {
    const double l = m.step(task->batch(s * c.batch, c.batch));
    ASSERT_TRUE(std::isfinite(l));
    if (s < kWindow) first += l / kWindow;
    if (s >= kSteps - kWindow) last += l / kWindow;
  }
  // Guessing the symbols' frequencies alone gives ln(10) / ln(12) = 0.93 of the start.
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

// The arena and every other buffer are planned before setup: the tracked peak of setup plus a
// step equals the declared sum, in every mode, whatever the mechanism holds.
TEST(ModelMemory, TrackedPeakEqualsDeclared) {
  for (ModelMode mode : {ModelMode::fwd, ModelMode::fwdbwd, ModelMode::train})
    for (const char* mech : {"flash", "vanilla", "reformer", "linformer"}) {
      ModelConfig c = tiny("listops", mech, {}, 128);
      const size_t before = MemoryMeter::current();
      MemoryMeter::reset_peak();
      {
        TransformerModel m(c, mode);
        m.setup(1);
        m.step(batch_of("listops", 128, 0, c.batch));
        EXPECT_EQ(MemoryMeter::peak() - before, m.working_bytes()) << mech << " " << to_string(mode);
        size_t sum = 0;
        for (const auto& [name, bytes] : m.memory_parts()) sum += bytes;
        EXPECT_EQ(sum, m.working_bytes());
      }
      EXPECT_EQ(MemoryMeter::current(), before);
    }
}

// bf16 inference (a build for AVX512-BF16 on a CPU with it): the forward loss of the same
// weights and batch within what rounding every product's inputs to bf16 costs, but not equal
// to the float loss (the bf16 path ran); the tracked peak as declared, the bf16 copies included;
// training modes and mechanisms without a bf16 path refused.
TEST(ModelBf16, ForwardLossNearFloatAndMemoryAsDeclared) {
  if (!TiledSoftmax::dense_bf16_kernel(16) || !cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 build or CPU";
  struct Case {
    const char* task;
    const char* mech;
  };
  for (const Case& k : {Case{"listops", "flash"}, Case{"listops", "vanilla"}, Case{"listops", "linformer"},
                        Case{"listops", "longformer"}, Case{"listops", "bigbird"}, Case{"retrieval", "flash"},
                        Case{"copy", "flash"}}) {
    ModelConfig c = tiny(k.task, k.mech, {}, 128);
    c.dmodel = 32;  // heads of 16: the bf16 kernel's smallest
    const Batch b = batch_of(k.task, 128, 0, c.batch);
    TransformerModel f32(c, ModelMode::fwd);
    f32.setup(3);
    const double want = f32.step(b);
    c.dtype = Dtype::bf16;
    const size_t before = MemoryMeter::current();
    MemoryMeter::reset_peak();
    {
      TransformerModel m(c, ModelMode::fwd);
      m.setup(3);
      const double got = m.step(b);
      EXPECT_EQ(MemoryMeter::peak() - before, m.working_bytes()) << k.task << " " << k.mech;
      EXPECT_NEAR(got, want, 2e-2 * std::abs(want)) << k.task << " " << k.mech;
      EXPECT_NE(got, want) << k.task << " " << k.mech << ": the float loss exactly, the bf16 path did not run";
      EXPECT_EQ(m.flops(), f32.flops());
      // The mechanisms were planned in bf16: their working memory is their bf16 path's.
      auto attention_bytes = [](const TransformerModel& x) {
        for (const auto& [name, bytes] : x.memory_parts())
          if (name == "attention") return bytes;
        return size_t{0};
      };
      EXPECT_NE(attention_bytes(m), attention_bytes(f32)) << k.task << " " << k.mech;
    }
  }
  ModelConfig c = tiny("listops", "flash", {}, 128);
  c.dmodel = 32;
  c.dtype = Dtype::bf16;
  EXPECT_THROW(TransformerModel(c, ModelMode::fwdbwd), InvalidInput);
  EXPECT_THROW(TransformerModel(c, ModelMode::train), InvalidInput);
  c.mechanism = "linear";  // no bf16 path
  c.params = resolve_params(find_mechanism("linear"), {});
  EXPECT_THROW(TransformerModel(c, ModelMode::fwd), InvalidInput);
}

// Inference keeps one layer's activations; training keeps every layer's.
TEST(ModelMemory, ActivationsGrowWithLayersOnlyWhenKeptForBackward) {
  auto activations = [](ModelMode mode, int64_t layers) {
    ModelConfig c = tiny("listops", "flash", {}, 64);
    c.layers = layers;
    TransformerModel m(c, mode);
    for (const auto& [name, bytes] : m.memory_parts())
      if (name == "activations") return bytes;
    return size_t{0};
  };
  const size_t per_token_stream = 64 * 2 * 16 * sizeof(float);  // one residual-stream slot: T x d
  EXPECT_EQ(activations(ModelMode::fwd, 4) - activations(ModelMode::fwd, 2), 2 * per_token_stream);
  EXPECT_GT(activations(ModelMode::train, 4) - activations(ModelMode::train, 2), 10 * per_token_stream);
}

// Every registered mechanism runs a training step of the listops model scaled down, with its
// default parameters, and the loss is finite.
TEST(ModelTraining, EveryMechanismTrainsOneStepAtListopsScaledDown) {
  for (const auto& info : mechanisms()) {
    ModelConfig c = model_config_for_task(find_task("listops"), 256);
    c.layers = 2;
    c.dmodel = 64;
    c.heads = 2;
    c.mlp = 128;
    c.batch = 2;
    c.mechanism = info.name;
    c.params = resolve_params(info, {});
    TransformerModel m(c, ModelMode::train);
    m.setup(2);
    const Batch b = batch_of("listops", 256, 0, c.batch);
    const double l0 = m.step(b);
    const double l1 = m.loss(b);
    EXPECT_TRUE(std::isfinite(l0) && std::isfinite(l1)) << info.name;
    EXPECT_NE(l0, l1) << info.name << ": the optimizer step changed nothing";
    EXPECT_GT(m.flops(), 0) << info.name;
  }
}

// Analytic FLOPs: the products by formula, plus each layer's mechanism count.
TEST(ModelFlops, ProductsPlusMechanism) {
  ModelConfig c = tiny("text", "flash", {}, 64);
  TransformerModel fwd(c, ModelMode::fwd), train(c, ModelMode::train);
  const double T = 2 * 64, d = 16, F = 24, B = 2;
  const double products = 2 * (2 * T * d * 3 * d + 2 * T * d * d + 4 * T * d * F) + 2 * B * (d * F + F * 2);
  AttnProblem p{Shape4{2, 2, 64, 8}, false, Strides3::contiguous(Shape4{2, 2, 64, 8}), 1};
  auto f = find_mechanism("flash").make(p, ParamValues());
  EXPECT_DOUBLE_EQ(fwd.flops(), products + 2 * f->flops(Mode::fwd));
  EXPECT_DOUBLE_EQ(train.flops(), 3 * products + 2 * f->flops(Mode::fwdbwd));
}

TEST(ModelConfigErrors, ImpossibleShapesAreInvalidInput) {
  ModelConfig c = tiny("listops", "flash", {}, 64);
  c.dmodel = 18;
  c.heads = 4;
  EXPECT_THROW(TransformerModel(c, ModelMode::train), InvalidInput);
  c = tiny("listops", "bigbird", {}, 100);  // N not a multiple of the block
  EXPECT_THROW(TransformerModel(c, ModelMode::train), InvalidInput);
  c = tiny("listops", "flash", {}, 64);
  // Decoding is an attention-level mode: a model point asking for it is refused.
  EXPECT_THROW(model_mode(RunMode::decode), InvalidInput);
}

}  // namespace
