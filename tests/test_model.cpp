// The model level: gradients of every parameter against finite differences, learning on `copy`,
// the arena's exact memory, and one training step of every mechanism.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <set>
#include <vector>

#include "bench/points/point.hpp"
#include "attention_impls/registry.hpp"
#include "attention_impls/tiled_softmax.hpp"
#include "core/dtype.hpp"
#include "core/memory.hpp"
#include "helpers.hpp"
#include "core/vecmath.hpp"
#include "model/layers.hpp"
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
                      GradCase{"image", "flash", {}, 1024}, GradCase{"retrieval", "flash", {}, 64},
                      // ETC's learned global rows before the tokens: CLS, mean pooling, two towers
                      GradCase{"listops", "etc", {"radius=3", "global=3"}, 32},
                      GradCase{"image", "etc", {"radius=40", "global=2"}, 1024},
                      GradCase{"retrieval", "etc", {"radius=5", "global=4"}, 64}),
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
    for (const char* mech : {"flash", "vanilla", "reformer", "linformer", "etc"}) {
      ModelConfig c = tiny("listops", mech, std::string(mech) == "etc" ? std::vector<std::string>{"radius=8", "global=4"}
                                                                       : std::vector<std::string>{}, 128);
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
  c.mechanism = "linear";  // no bf16 path: inference refuses it, a training step runs it in float32
  c.params = resolve_params(find_mechanism("linear"), {});
  EXPECT_THROW(TransformerModel(c, ModelMode::fwd), InvalidInput);
  EXPECT_NE(TransformerModel(c, ModelMode::train).precision().find("linear in f32 (no bf16 path)"), std::string::npos);
}

// A bf16 training step (PyTorch's CPU autocast: the products' inputs in bf16, everything else in
// float) on the same weights and batch as a float32 step: every parameter's gradient within
// kBf16GradTolerance of the float32 one in relative Frobenius norm, ||g16 - g32|| / ||g32|| (one
// step's rounding of each product's inputs to 8 significant bits; measured at most 1.3% over
// these cases), and not equal to it (the bf16 products ran); the tracked peak as declared. Under
// attention dropout (a training step, the same masks in both precisions) the attention of flash,
// the sparse patterns and linformer runs in bf16 too, and the result's precision note says so.
TEST(ModelBf16, TrainingGradientsNearFloatPerTensor) {
  if (!cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 CPU";
  constexpr double kBf16GradTolerance = 3e-2;
  struct Case {
    const char* task;
    const char* mech;
    float attn_dropout = 0;
  };
  for (const Case& k : {Case{"listops", "flash"}, Case{"copy", "flash"}, Case{"copy", "linear"}, Case{"retrieval", "flash"},
                        Case{"image", "local"}, Case{"listops", "linformer"}, Case{"listops", "flash", 0.1f},
                        Case{"image", "local", 0.1f}, Case{"listops", "linformer", 0.1f}}) {
    ModelConfig c = tiny(k.task, k.mech, {}, std::string(k.task) == "image" ? 1024 : 64);
    c.dmodel = 32;
    c.attn_dropout = k.attn_dropout;
    const ModelMode mode = k.attn_dropout > 0 ? ModelMode::train : ModelMode::fwdbwd;  // dropout trains
    const Batch b = batch_of(k.task, c.seq, 0, c.batch);
    TransformerModel f32(c, mode);
    f32.setup(3);
    f32.step(b);
    c.dtype = Dtype::bf16;
    const size_t before = MemoryMeter::current();
    MemoryMeter::reset_peak();
    {
      TransformerModel m(c, mode);
      m.setup(3);
      m.step(b);
      if (mode == ModelMode::fwdbwd) EXPECT_EQ(MemoryMeter::peak() - before, m.working_bytes()) << k.task << " " << k.mech;
      if (k.attn_dropout > 0)
        EXPECT_NE(m.precision().find(std::string(k.mech) + " in bf16"), std::string::npos) << m.precision();
      double worst = 0;
      std::string worst_name;
      bool any_differs = false;
      for (const auto& s : m.parameters()) {
        double diff = 0, norm = 0;
        for (int64_t i = s.offset; i < s.offset + s.count; ++i) {
          const double g16 = m.gradients()[i], g32 = f32.gradients()[i];
          diff += (g16 - g32) * (g16 - g32);
          norm += g32 * g32;
          any_differs |= g16 != g32;
        }
        if (norm == 0) continue;  // e.g. an embedding row no token used
        const double rel = std::sqrt(diff / norm);
        EXPECT_LE(rel, kBf16GradTolerance) << k.task << " " << k.mech << " " << s.name;
        if (rel > worst) worst = rel, worst_name = s.name;
      }
      EXPECT_TRUE(any_differs) << k.task << " " << k.mech << ": the float32 gradients exactly, no bf16 product ran";
      std::printf("[ bf16     ] %s %s: worst gradient %.4f (%s)\n", k.task, k.mech, worst, worst_name.c_str());
    }
  }
}

// A linear layer's bias: added inside the forward product (Y equals the product without a bias
// plus b), and its gradient db the column sums of dY, each thread's static share of the rows
// summed in row order and the shares added in thread order (exactly that, at one and two
// threads); a bf16 layer rounds dY in the same pass, and its products read exactly that.
TEST(Layers, LinearBiasInsideTheProductAndItsGradientInAFixedOrder) {
  constexpr int64_t M = 301, K = 16, N = 272;  // N: a full chunk of 256 columns and a part
  std::vector<float> X(M * K), W(K * N), b(N), dY(M * N);
  Rng rng(5, 0);
  rng.fill_normal(X.data(), M * K, 1.0f);
  rng.fill_normal(W.data(), K * N, 1.0f);
  rng.fill_normal(b.data(), N, 1.0f);
  rng.fill_normal(dY.data(), M * N, 1.0f);
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Linear with(M, K, N, true), without(M, K, N, true, false, false, false);
    std::vector<std::byte> scratch(std::max(with.scratchpad_bytes(), without.scratchpad_bytes()) + 64);
    with.bind(scratch.data());
    without.bind(scratch.data());
    std::vector<float> Y(M * N), Y0(M * N), dX(M * K), dW(K * N), db(N);
    with.forward(X.data(), W.data(), b.data(), Y.data());
    without.forward(X.data(), W.data(), nullptr, Y0.data());
    for (int64_t i = 0; i < M * N; ++i) ASSERT_NEAR(Y[i], Y0[i] + b[i % N], 1e-5f * (1 + std::abs(Y[i]))) << i;
    with.backward(X.data(), W.data(), dY.data(), dX.data(), dW.data(), db.data());
    for (int64_t c = 0; c < N; ++c) {
      float want = 0;
      for (int t = 0; t < threads; ++t) {
        float share = 0;
        for (int64_t r = M * t / threads; r < M * (t + 1) / threads; ++r) share += dY[r * N + c];
        want = t == 0 ? share : want + share;
      }
      ASSERT_EQ(db[c], want) << "column " << c << " at " << threads << " threads";
    }
    if (!cpu_has_bf16()) continue;
    Linear half(M, K, N, true, true);
    std::vector<std::byte> s16(half.scratchpad_bytes() + 64);
    half.bind(s16.data());
    std::vector<uint16_t> Xb(M * K), Wb(K * N), dYb(M * N), want_dYb(M * N);
    to_bf16(X.data(), Xb.data(), M * K);
    to_bf16(W.data(), Wb.data(), K * N);
    to_bf16(dY.data(), want_dYb.data(), M * N);
    std::vector<float> db16(N);
    half.backward(Xb.data(), Wb.data(), dY.data(), dYb.data(), dX.data(), dW.data(), db16.data());
    EXPECT_EQ(dYb, want_dYb);
    EXPECT_EQ(db16, db);  // db sums the float dY
    EXPECT_THROW(half.backward(Xb.data(), Wb.data(), dY.data(), nullptr, dX.data(), dW.data(), db16.data()), std::logic_error);
  }
  omp_set_num_threads(saved);
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

// ETC's global rows. With none, the model is Longformer's at dilation 1 without global tokens,
// step for step. With g of them: a parameter "globals" (g, d) beside the embedding, every layer's
// mechanism sees N + g rows, the loss reads only the token rows (the compact language-model head
// of mqar included: its gradients against finite differences), and the globals change the loss.
TEST(ModelEtc, GlobalRowsPrependedToEverySequence) {
  {
    ModelConfig e = tiny("listops", "etc", {"radius=3", "global=0"}, 32);
    ModelConfig l = tiny("listops", "longformer", {"window=3", "global=0"}, 32);
    TransformerModel a(e, ModelMode::train), b(l, ModelMode::train);
    a.setup(4);
    b.setup(4);
    const Batch batch = batch_of("listops", 32, 0, e.batch);
    for (int step = 0; step < 3; ++step) EXPECT_EQ(a.step(batch), b.step(batch)) << "step " << step;
    EXPECT_EQ(a.flops(), b.flops());
  }
  ModelConfig c = tiny("listops", "etc", {"radius=3", "global=5"}, 32);
  TransformerModel m(c, ModelMode::fwdbwd);
  ModelConfig none = tiny("listops", "etc", {"radius=3", "global=0"}, 32);
  TransformerModel m0(none, ModelMode::fwdbwd);
  EXPECT_EQ(m.parameter_count() - m0.parameter_count(), 5 * c.dmodel);
  bool named = false;
  for (const auto& s : m.parameters()) named = named || (s.name == "globals" && s.count == 5 * c.dmodel);
  EXPECT_TRUE(named);
  // The mechanism's problem is N + g rows: its FLOPs are those of that pattern.
  const Shape4 s{c.batch, c.heads, 37, c.dmodel / c.heads};
  auto mech = find_mechanism("etc").make(AttnProblem{s, false, Strides3::contiguous(s), 1}, c.params);
  ModelConfig flash = tiny("listops", "flash", {}, 32);
  TransformerModel mf(flash, ModelMode::fwd), me(c, ModelMode::fwd);
  const Shape4 sf{c.batch, c.heads, 32, c.dmodel / c.heads};
  auto fm = find_mechanism("flash").make(AttnProblem{sf, false, Strides3::contiguous(sf), 1}, flash.params);
  // The products grow by the global rows' share of the projections and MLP (the head reads tokens).
  const double rows = double(c.batch) * 5, d = double(c.dmodel), F = double(c.mlp);
  const double more = double(c.layers) * (2 * rows * d * 3 * d + 2 * rows * d * d + 4 * rows * d * F);
  EXPECT_DOUBLE_EQ(me.flops() - c.layers * mech->flops(Mode::fwd), mf.flops() - flash.layers * fm->flops(Mode::fwd) + more);
  m.setup(2);
  const Batch b = batch_of("listops", 32, 0, c.batch);
  const double l0 = m.loss(b);
  for (const auto& p : m.parameters())
    if (p.name == "globals") m.weights()[p.offset] += 1.0f;
  EXPECT_NE(m.loss(b), l0) << "the global rows do not reach the loss";

  // mqar: a language model with a compact head; ETC runs it bidirectionally, as the preset does.
  ModelConfig r = test::recall_model_config("mqar", 32, "etc", {"radius=4", "global=3"});
  r.causal = false;
  TaskOptions o;
  o.seq = 32;
  o.vocab = 40;
  o.seed = 4;
  TransformerModel lm(r, ModelMode::fwdbwd);
  lm.setup(6);
  const Batch rb = make_task("mqar", o)->batch(0, r.batch);
  EXPECT_GT(test::check_model_gradients(lm, rb, 5, 2e-3, 3e-2), 20);
  const auto ev = lm.evaluate(rb, r.batch);
  EXPECT_EQ(ev.predictions, r.batch * r.loss_positions) << "only the queries are counted, no global row";
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
