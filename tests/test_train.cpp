// Training to accuracy (model/trainer, the train verb): disjoint splits, schedules, clipping,
// dropout (off in evaluation, reproducible from the seed), learned positions, a tiny model that
// learns to copy, bit-identical resume, refused checkpoints, and the accuracy table.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <signal.h>
#include <time.h>

#include "attention_impls/registry.hpp"
#include "bench/results/result_reader.hpp"
#include "bench/results/table.hpp"
#include "bench/engine/train.hpp"
#include "bench/points/train_presets.hpp"
#include "core/stop_signals.hpp"
#include "core/sysinfo.hpp"
#include "model/trainer.hpp"
#include "tasks/task.hpp"
#include "tests/helpers.hpp"

namespace ab {
namespace {

namespace fs = std::filesystem;

// ---- splits ----
std::string key_of(const Example& e) {
  std::string k;
  for (int32_t t : e.tokens) k += std::to_string(t) + ",";
  k += "|";
  for (int32_t t : e.tokens2) k += std::to_string(t) + ",";
  return k;
}

// No validation or test example equals a training example: checked on the generated token ids
// of every generated task (the first 300 of each split).
TEST(Splits, GeneratedSplitsAreDisjoint) {
  for (const auto& [task, seq] : std::vector<std::pair<std::string, int64_t>>{
           {"copy", 64}, {"listops", 128}, {"text", 128}, {"retrieval", 128}, {"image", 0}, {"pathfinder", 0}}) {
    SCOPED_TRACE(task);
    std::set<std::string> train;
    TaskOptions o;
    o.seq = seq;
    o.seed = 11;
    const auto tr = make_task(task, o);
    for (int64_t i = 0; i < 300; ++i) train.insert(key_of(tr->example(i)));
    for (Split s : {Split::val, Split::test}) {
      o.split = s;
      const auto t = make_task(task, o);
      int shared = 0;
      for (int64_t i = 0; i < 300; ++i) shared += train.count(key_of(t->example(i))) ? 1 : 0;
      EXPECT_EQ(shared, 0) << to_string(s);
    }
    // The training split is the run's own seed: what `run` has always timed.
    EXPECT_EQ(split_seed(11, Split::train), 11u);
  }
}

// A small Fashion-MNIST-format directory: gzip IDX files of `n` train and `m` test images whose
// first pixel holds the image's index (so every image is distinct).
std::string fake_idx(int n, int m) {
  const fs::path dir = fs::path(test::temp_path("idx"));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const std::string& name, uint32_t magic, std::vector<uint32_t> dims, const std::vector<unsigned char>& data) {
    std::string bytes;
    auto be = [&](uint32_t v) {
      for (int k = 3; k >= 0; --k) bytes += static_cast<char>((v >> (8 * k)) & 0xff);
    };
    be(magic);
    for (uint32_t d : dims) be(d);
    bytes.append(data.begin(), data.end());
    gzFile f = gzopen((dir / (name + ".gz")).c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  };
  for (auto [prefix, count, base] : {std::tuple{"train", n, 0}, std::tuple{"t10k", m, 200}}) {
    std::vector<unsigned char> images(static_cast<size_t>(count) * 784, 7), labels;
    for (int i = 0; i < count; ++i) {
      images[static_cast<size_t>(i) * 784] = static_cast<unsigned char>(base + i);
      labels.push_back(static_cast<unsigned char>(i % 10));
    }
    write(std::string(prefix) + "-images-idx3-ubyte", 0x803, {static_cast<uint32_t>(count), 28, 28}, images);
    write(std::string(prefix) + "-labels-idx1-ubyte", 0x801, {static_cast<uint32_t>(count)}, labels);
  }
  return dir.string();
}

// Real files: train and validation are the two parts of the training images, test the t10k
// file; 28 x 28 is padded to 32 x 32 (the image's first pixel lands at row 2, column 2).
TEST(Splits, FashionMnistIdxSplitsByFileAndRange) {
  const std::string dir = fake_idx(30, 10);
  std::map<Split, std::set<int>> firsts;
  for (Split s : {Split::train, Split::val, Split::test}) {
    TaskOptions o;
    o.data_dir = dir;
    o.split = s;
    const auto t = make_task("image", o);
    for (int64_t i = 0; i < t->size(); ++i) {
      const Example e = t->example(i);
      ASSERT_EQ(e.tokens.size(), 1024u);
      EXPECT_EQ(e.tokens[0], 0);                      // padding
      firsts[s].insert(e.tokens[2 * 32 + 2]);          // the image's own first pixel
      EXPECT_EQ(e.label, (e.tokens[2 * 32 + 2] % 200) % 10);  // labels follow their images
    }
  }
  EXPECT_EQ(firsts[Split::train].size(), 27u);
  EXPECT_EQ(firsts[Split::val].size(), 3u);
  EXPECT_EQ(firsts[Split::test].size(), 10u);
  for (int v : firsts[Split::val]) EXPECT_FALSE(firsts[Split::train].count(v));
  for (int v : firsts[Split::test]) EXPECT_GE(v, 200);
  // A truncated file is named, not half-read.
  {
    std::ofstream f(fs::path(dir) / "t10k-images-idx3-ubyte.gz", std::ios::binary | std::ios::trunc);
    f << "not gzip at all";
  }
  TaskOptions o;
  o.data_dir = dir;
  o.split = Split::test;
  try {
    make_task("image", o);
    ADD_FAILURE() << "a corrupt IDX file was accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("t10k-images-idx3-ubyte"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// ---- schedules ----
TEST(Schedules, EachRateEqualsItsFormula) {
  const double lr = 0.05;
  auto s = Schedule::parse("linear-warmup-rsqrt", lr, 1000, 5000);
  for (int64_t step : {1, 10, 999, 1000, 1001, 4000})
    EXPECT_DOUBLE_EQ(s.at(step), lr * std::min(1.0, step / 1000.0) / std::sqrt(std::max<double>(step, 1000))) << step;
  s = Schedule::parse("constant", 1e-3, 0, 10);
  EXPECT_DOUBLE_EQ(s.at(7), 1e-3);
  s = Schedule::parse("step:3000:0.1", 1e-3, 0, 10000);
  EXPECT_DOUBLE_EQ(s.at(3000), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(3001), 1e-4);
  s = Schedule::parse("cosine", 1e-3, 100, 1100);
  EXPECT_DOUBLE_EQ(s.at(50), 1e-3 * 0.5);
  EXPECT_DOUBLE_EQ(s.at(100), 1e-3);
  EXPECT_NEAR(s.at(600), 1e-3 * 0.5, 1e-12);  // half way: cos(pi/2) = 0
  EXPECT_NEAR(s.at(1100), 0.0, 1e-12);
  // cosine:H spans H steps whatever the run's length (a run of 1100 steps sees the start).
  s = Schedule::parse("cosine:2100", 1e-3, 100, 1100);
  EXPECT_DOUBLE_EQ(s.at(100), 1e-3);
  EXPECT_NEAR(s.at(1100), 1e-3 * 0.5, 1e-12);  // half way through the 2000 steps after the warm-up
  EXPECT_NEAR(s.at(2100), 0.0, 1e-12);
  // PyTorch OneCycleLR(max_lr=1e-3, total_steps=100, pct_start=0.1, anneal_strategy='linear'),
  // its lr at step_num 0, 9 (the peak), 99 (the end): 4e-5, 1e-3, 4e-9.
  s = Schedule::parse("onecycle", 1e-3, 10, 100);
  EXPECT_NEAR(s.at(1), 4e-5, 1e-15);
  EXPECT_NEAR(s.at(10), 1e-3, 1e-15);
  EXPECT_NEAR(s.at(100), 4e-9, 1e-15);
  EXPECT_NEAR(s.at(55), 1e-3 + (4e-9 - 1e-3) * 45.0 / 90.0, 1e-15);
  for (const char* bad : {"sawtooth", "step", "step:0", "step:10:2", "step:x", "cosine:", "cosine:0", "cosine:5", "cosine:9x"})
    EXPECT_THROW(Schedule::parse(bad, 1e-3, 10, 100), InvalidInput) << bad;
  EXPECT_THROW(Schedule::parse("onecycle", 1e-3, 0, 100), InvalidInput);
  // The spelling round-trips, canonically: a step schedule names its factor.
  for (const char* text : {"constant", "linear-warmup-rsqrt", "cosine", "cosine:31250", "onecycle", "step:4500:0.1", "step:20:0.5"})
    EXPECT_EQ(Schedule::parse(text).name(), text);
  EXPECT_EQ(Schedule::parse("step:3000").name(), "step:3000:0.1");
}

// ---- the model's training step ----
ModelConfig tiny_model(const std::string& task, const std::string& mech, int64_t seq, std::vector<std::string> params = {}) {
  return test::tiny_model_config(task, mech, std::move(params), seq, 4);
}

Batch data(const std::string& task, int64_t seq, int64_t first, int64_t size) {
  TaskOptions o;
  o.seq = seq;
  o.seed = 5;
  return make_task(task, o)->batch(first, size);
}

double norm_of(const float* g, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * g[i];
  return std::sqrt(s);
}

TEST(Clipping, BoundsTheGlobalNormOrEachTensors) {
  omp_set_num_threads(1);
  for (ClipMode mode : {ClipMode::global, ClipMode::per_tensor}) {
    ModelConfig c = tiny_model("listops", "linformer", 32, {"k=8"});
    c.clip = 0.05f;
    c.clip_mode = mode;
    TransformerModel m(c, ModelMode::train);
    m.setup(3);
    const auto out = m.train_step(data("listops", 32, 0, 4), 1, 1e-3f);
    EXPECT_GT(out.grad_norm, 0.05);  // clipping had something to do
    double total = 0;
    for (const auto& s : m.parameters()) {
      const double n = norm_of(m.gradients() + s.offset, s.count);
      total += n * n;
      if (mode == ClipMode::per_tensor) {
        EXPECT_LE(n, 0.05 * (1 + 1e-5)) << s.name;
      }
    }
    if (mode == ClipMode::global) {
      EXPECT_LE(std::sqrt(total), 0.05 * (1 + 1e-5));
    }
  }
}

// Evaluation runs without dropout: twice the same, and equal to the loss without dropout; the
// training step's masks are a function of the seed and the step.
TEST(Dropout, OffInEvaluationAndReproducibleFromTheSeed) {
  omp_set_num_threads(1);
  ModelConfig c = tiny_model("listops", "flash", 32);
  c.dropout = 0.3f;
  c.attn_dropout = 0.3f;
  const Batch b = data("listops", 32, 0, 4);
  auto trained = [&](uint64_t seed, int64_t step) {
    TransformerModel m(c, ModelMode::train);
    m.setup(seed);
    const double loss = m.train_step(b, step, 1e-3f).loss;
    std::vector<float> w(m.weights(), m.weights() + m.parameter_count());
    const auto e1 = m.evaluate(b, 4), e2 = m.evaluate(b, 4);
    EXPECT_EQ(e1.loss_sum, e2.loss_sum);
    EXPECT_NEAR(e1.loss_sum / e1.predictions, m.loss(b), 1e-6);
    return std::pair{loss, w};
  };
  const auto a = trained(3, 1), again = trained(3, 1), other_step = trained(3, 2);
  EXPECT_EQ(a.first, again.first);
  EXPECT_EQ(a.second, again.second);
  EXPECT_NE(a.first, other_step.first);  // another step, other masks
  // Without dropout, the same model's first loss is the plain forward's.
  c.dropout = c.attn_dropout = 0;
  TransformerModel plain(c, ModelMode::train);
  plain.setup(3);
  const double no_drop = plain.loss(b);
  EXPECT_NE(a.first, no_drop);
  EXPECT_EQ(plain.train_step(b, 1, 1e-3f).loss, no_drop);
}

// Learned positions get their gradient (central differences), and none and learned both train.
TEST(Positions, LearnedPositionsMatchFiniteDifferences) {
  omp_set_num_threads(1);
  ModelConfig c = tiny_model("copy", "flash", 16);
  c.positions = Positions::learned;
  TransformerModel m(c, ModelMode::fwdbwd);
  m.setup(4);
  const Batch b = data("copy", 16, 0, 4);
  m.step(b);
  const TransformerModel::Slice* pos = nullptr;
  for (const auto& s : m.parameters())
    if (s.name == "positions") pos = &s;
  ASSERT_NE(pos, nullptr);
  const std::vector<float> grad(m.gradients() + pos->offset, m.gradients() + pos->offset + pos->count);
  int checked = 0;
  for (int64_t i = 0; i < pos->count; i += 7) {
    float& w = m.weights()[pos->offset + i];
    const float keep = w, eps = 1e-2f;
    w = keep + eps;
    const double up = m.loss(b);
    w = keep - eps;
    const double down = m.loss(b);
    w = keep;
    EXPECT_NEAR(grad[static_cast<size_t>(i)], (up - down) / (2 * eps), 2e-3 + 3e-2 * std::abs(grad[static_cast<size_t>(i)])) << i;
    ++checked;
  }
  EXPECT_GT(checked, 20);
  c.positions = Positions::none;
  TransformerModel none(c, ModelMode::fwdbwd);
  none.setup(4);
  EXPECT_TRUE(std::isfinite(none.loss(b)));
}

// ---- the trainer ----
TrainConfig copy_run(int64_t steps) {
  TrainConfig c;
  c.task = "copy";
  c.data.seq = 32;
  c.data.seed = 2;
  c.model = model_config_for_task(find_task("copy"), 32);
  c.model.layers = 2;
  c.model.dmodel = 32;
  c.model.heads = 2;
  c.model.mlp = 64;
  c.model.batch = 16;
  c.model.mechanism = "flash";
  c.model.params = resolve_params(find_mechanism("flash"), {});
  c.steps = steps;
  c.schedule = Schedule::parse("constant", 3e-3, 0, steps);
  c.eval_every = 100;
  c.eval_examples = 200;
  c.test_examples = 200;
  c.seed = 2;
  c.identity = "copy-test";
  return c;
}

// A tiny model learns to copy within a few hundred steps: the stated per-token accuracy on the
// test split (deterministic: seeds fixed, one thread; no time is asserted).
TEST(Trainer, TinyModelLearnsToCopy) {
  omp_set_num_threads(1);
  Trainer t(copy_run(600));
  const TrainOutcome out = t.run(false, nullptr, nullptr);
  EXPECT_EQ(out.steps_done, 600);
  EXPECT_GE(out.test_best.token_accuracy, 0.90);
  EXPECT_GT(out.test_best.accuracy, 0.30);  // whole sequences copied exactly
  EXPECT_GE(out.best_val_accuracy, out.last_val.accuracy);
  EXPECT_EQ(out.test_best.examples, 200);
}

// Validation accuracy tied (a copy model whose exact-copy rate is still 0): the parameters kept
// are those of the lowest validation loss, not the earliest evaluation (before, the copy study's
// LSH-1 row reported the step-200 parameters of a run of 3000 steps).
TEST(Trainer, TiedValidationAccuracyKeepsTheLowerLoss) {
  omp_set_num_threads(1);
  TrainConfig c = copy_run(60);
  c.eval_every = 10;
  c.eval_examples = 32;
  c.test_examples = 32;
  std::vector<std::pair<int64_t, EvalResult>> vals;
  Trainer t(c);
  const TrainOutcome out = t.run(false, [&](const CurvePoint& p) {
    if (p.val) vals.emplace_back(p.step, *p.val);
  }, nullptr);
  ASSERT_GE(vals.size(), 3u);
  for (const auto& [step, v] : vals) ASSERT_EQ(v.accuracy, 0.0) << "step " << step << ": the premise is a tie at 0";
  auto lowest = vals.front();
  for (const auto& sv : vals)
    if (sv.second.loss < lowest.second.loss) lowest = sv;
  ASSERT_NE(lowest.first, vals.front().first) << "the loss must fall for the test to tell the rules apart";
  EXPECT_EQ(out.best_step, lowest.first);
}

// A step the process was stopped and continued in (a job paused so that another can be timed)
// holds the pause in its wall time: it is counted as paused and not timed, and a checkpoint
// carries the count. Here SIGCONT comes from a timer on the process's CPU time (every 1 ms of it),
// so it fires inside every step of the first part of a run, whatever else the machine runs (a
// step of this model takes tens of ms of CPU, several scheduler ticks); the resumed part runs
// undisturbed.
TEST(Trainer, StepsAcrossAStopAreNotTimed) {
  omp_set_num_threads(1);
  StopSignalHandler handlers([](int) {});
  TrainConfig c = copy_run(8);
  c.model.dmodel = 128;
  c.model.mlp = 512;
  c.model.batch = 64;
  c.eval_every = 4;
  c.eval_examples = 16;
  c.test_examples = 16;
  const std::string dir = test::temp_path("ckpt_paused");
  fs::remove_all(dir);
  fs::create_directories(dir);
  c.checkpoint_dir = dir;
  std::atomic<bool> stop{false};
  TrainOutcome first;
  {
    timer_t timer;
    sigevent ev{};
    ev.sigev_notify = SIGEV_SIGNAL;
    ev.sigev_signo = SIGCONT;
    ASSERT_EQ(timer_create(CLOCK_PROCESS_CPUTIME_ID, &ev, &timer), 0);
    itimerspec every_ms{};
    every_ms.it_value.tv_nsec = every_ms.it_interval.tv_nsec = 1000000;
    ASSERT_EQ(timer_settime(timer, 0, &every_ms, nullptr), 0);
    Trainer t(c);
    first = t.run(false, [&](const CurvePoint& p) {
      if (p.step == 4) stop = true;
    }, &stop);
    timer_delete(timer);
  }
  ASSERT_TRUE(first.interrupted);
  EXPECT_EQ(first.steps_done, 4);
  EXPECT_EQ(first.paused_steps, 4);
  EXPECT_EQ(first.train_seconds, 0.0);
  stop = false;
  Trainer t(c);
  const TrainOutcome rest = t.run(true, nullptr, &stop);
  EXPECT_EQ(rest.steps_done, 8);
  EXPECT_EQ(rest.paused_steps, 4);  // the checkpoint's four, none of this part's
  EXPECT_GT(rest.train_seconds, 0.0);
  fs::remove_all(dir);
}

// Train 2k steps straight, or k, stop, and resume to 2k: the same parameters, bit for bit, and
// the same logged losses and validations. With dropout, attention dropout, learned positions,
// a mechanism with learned tensors (linformer), one that redraws (reformer) and one whose state
// training updates without gradients (routing's centroids, here at a fast-moving decay; the
// resumed run routes with the checkpoint's centroids or its losses part from the straight run's).
TEST(Trainer, ResumedRunIsBitIdenticalToAStraightOne) {
  omp_set_num_threads(1);
  // And a bf16 run (its products' bf16 copies are made per step from the float32 state).
  std::vector<std::tuple<std::string, std::string, std::vector<std::string>, Dtype>> cases{
      {"listops", "linformer", {"k=8"}, Dtype::f32}, {"copy", "reformer", {"bucket_size=8"}, Dtype::f32},
      {"copy", "routing", {"clusters=4", "decay=0.5"}, Dtype::f32}};
  if (cpu_has_bf16()) cases.emplace_back("copy", "flash", std::vector<std::string>{}, Dtype::bf16);
  for (const auto& [task, mech, params, dtype] : cases) {
    SCOPED_TRACE(mech + " " + to_string(dtype));
    TrainConfig c = copy_run(40);
    c.task = task;
    c.model = tiny_model(task, mech, 32, params);
    c.model.dtype = dtype;
    if (dtype == Dtype::bf16) {
      c.model.dmodel = 32;  // heads of 16: flash's bf16 kernel
      ASSERT_EQ(TransformerModel(c.model, ModelMode::train).precision().find("flash in bf16") != std::string::npos, true);
    }
    c.model.dropout = 0.1f;
    // (bf16: none, so that flash's bf16 backward runs; its attention would be float32 with it.)
    c.model.attn_dropout = find_mechanism(mech).caps.attn_dropout && dtype == Dtype::f32 ? 0.1f : 0.0f;
    c.model.positions = Positions::learned;
    c.model.clip = 1.0f;
    c.schedule = Schedule::parse("onecycle", 3e-3, 5, 40);
    c.eval_every = 10;
    c.eval_examples = 16;
    c.test_examples = 16;
    c.log_every = 1;
    auto run = [&](const std::string& dir, int64_t stop_at, bool resume, std::vector<std::string>* lines) {
      TrainConfig rc = c;
      rc.checkpoint_dir = dir;
      rc.checkpoint_every = 7;
      Trainer t(rc);
      std::atomic<bool> stop{false};
      const TrainOutcome out = t.run(resume, [&](const CurvePoint& p) {
        if (p.val) {
          lines->push_back(fmt::format("{} val {:.17g} {:.17g}", p.step, p.val->loss, p.val->accuracy));
        } else {
          lines->push_back(fmt::format("{} loss {:.17g} lr {:.17g} norm {:.17g}", p.step, p.loss, p.lr, p.grad_norm));
        }
        if (p.step == stop_at && !p.val) stop = true;
      }, &stop);
      std::vector<float> w;
      for (const auto& tt : t.model().trained_tensors()) w.insert(w.end(), tt.data, tt.data + tt.count);
      return std::pair{out, w};
    };
    const std::string a = test::temp_path("ckpt_a"), b = test::temp_path("ckpt_b");
    fs::remove_all(a);
    fs::remove_all(b);
    fs::create_directories(a);
    fs::create_directories(b);
    std::vector<std::string> straight_lines, part_lines;
    const auto straight = run(a, -1, false, &straight_lines);
    const auto first = run(b, 20, false, &part_lines);
    EXPECT_TRUE(first.first.interrupted);
    EXPECT_EQ(first.first.steps_done, 20);
    const auto resumed = run(b, -1, true, &part_lines);
    EXPECT_TRUE(resumed.first.resumed);
    EXPECT_EQ(resumed.first.resumed_at, 20);
    EXPECT_EQ(straight.second, resumed.second);  // bit-identical parameters
    EXPECT_EQ(straight_lines, part_lines);       // the same curve, line by line
    EXPECT_EQ(straight.first.test_best.accuracy, resumed.first.test_best.accuracy);
    fs::remove_all(a);
    fs::remove_all(b);
  }
}

// ---- the train verb ----
const char* kTinyTrain =
    " --task copy --seq 32 --layers 1 --dmodel 16 --heads 2 --mlp 32 --batch 8 --eval-examples 16 --test-examples 16";

// A float32 checkpoint and a bf16 run of the same recipe: refused (exit 2) with the hint, then
// continued with --convert-dtype, the result's note naming the checkpoint's run; the flag alone
// (no --resume) is bad input.
TEST(TrainCli, AnotherDtypesCheckpointResumesOnlyWhenAskedToConvert) {
  if (!cpu_has_bf16()) GTEST_SKIP() << "no AVX512-BF16 CPU";
  const std::string dir = test::temp_path("ckpt_dtype"), out = test::temp_path("ckpt_dtype.json");
  fs::remove_all(dir);
  fs::remove(out);
  // The whole f32 run: the recipe (steps included) must be the same for the checkpoint to be this run's.
  auto e = test::exec(std::string("train --steps 20 --checkpoint ") + dir + kTinyTrain);
  ASSERT_EQ(e.code, 0) << e.out;
  e = test::exec(std::string("train --steps 20 --dtype bf16 --resume --checkpoint ") + dir + kTinyTrain);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("holds this run in another --dtype"), std::string::npos) << e.out;
  e = test::exec(std::string("train --steps 20 --dtype bf16 --convert-dtype --checkpoint ") + dir + kTinyTrain);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("--convert-dtype needs --resume"), std::string::npos) << e.out;
  e = test::exec(std::string("train --steps 20 --dtype bf16 --resume --convert-dtype --checkpoint ") + dir + " --out " + out + kTinyTrain);
  ASSERT_EQ(e.code, 0) << e.out;
  const ResultFile rf = read_result_file(out);
  ASSERT_EQ(rf.points.size(), 1u);
  EXPECT_EQ(rf.points[0].id.dtype, Dtype::bf16);
  EXPECT_EQ(rf.points[0].train->train_steps, 20);
  EXPECT_NE(rf.points[0].message.find("resumed at step 20 from the checkpoint of attn:flash/level:model/mode:train/task:copy/"),
            std::string::npos) << rf.points[0].message;
  EXPECT_NE(rf.points[0].message.find("flash in f32"), std::string::npos) << rf.points[0].message;
  fs::remove_all(dir);
  fs::remove(out);
}

TEST(TrainCli, TruncatedOrMismatchedCheckpointExitsTwo) {
  const std::string dir = test::temp_path("ckpt_cli");
  fs::remove_all(dir);
  auto e = test::exec(std::string("train --steps 20 --checkpoint ") + dir + kTinyTrain);
  ASSERT_EQ(e.code, 0) << e.out;
  const std::string ck = checkpoint_path(dir);
  ASSERT_TRUE(fs::exists(ck));
  // Another recipe: refused, naming both runs.
  e = test::exec(std::string("train --steps 20 --lr 0.01 --resume --checkpoint ") + dir + kTinyTrain);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("belongs to another run"), std::string::npos) << e.out;
  // Cut short: refused, and the file is left as it was.
  const auto size = fs::file_size(ck);
  fs::resize_file(ck, size - 100);
  e = test::exec(std::string("train --steps 20 --resume --checkpoint ") + dir + kTinyTrain);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("is not a usable checkpoint"), std::string::npos) << e.out;
  EXPECT_EQ(fs::file_size(ck), size - 100);
  // One flipped byte: the checksum says so.
  e = test::exec(std::string("train --steps 20 --checkpoint ") + dir + kTinyTrain);  // rewrite a good one
  ASSERT_EQ(e.code, 0) << e.out;
  {
    std::fstream f(ck, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  e = test::exec(std::string("train --steps 20 --resume --checkpoint ") + dir + kTinyTrain);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("checksum"), std::string::npos) << e.out;
  fs::remove_all(dir);
}

// The result entry carries the accuracy fields, reads back, re-runs from its label, and
// `table --metric accuracy` draws LRA Table 1's layout.
TEST(TrainCli, AccuracyEntryReadsBackAndTableDrawsTheLraLayout) {
  const std::string out = test::temp_path("train_out.json"), log = test::temp_path("train_log.jsonl");
  fs::remove(out);
  fs::remove(log);
  auto e = test::exec(std::string("train --steps 30 --attn flash,linear --seed 1,2 --out ") + out + " --log " + log + kTinyTrain);
  ASSERT_EQ(e.code, 0) << e.out;
  const ResultFile rf = read_result_file(out);
  ASSERT_EQ(rf.points.size(), 4u);
  for (const auto& p : rf.points) {
    ASSERT_TRUE(p.train.has_value()) << p.id.name();
    EXPECT_EQ(p.train->train_steps, 30);
    EXPECT_GE(p.train->accuracy, 0.0);
    EXPECT_LE(p.train->accuracy, 1.0);
    EXPECT_GT(p.train->train_seconds, 0.0);
    EXPECT_EQ(p.label.rfind("attnbench train ", 0), 0u) << p.label;
  }
  // The label re-runs the point: the same name and, deterministic, the same accuracy.
  const std::string label = rf.points[0].label.substr(std::string("attnbench ").size());
  auto again = test::exec(label + " --format json", false);
  ASSERT_EQ(again.code, 0) << again.out;
  const auto doc = nlohmann::json::parse(again.out);
  EXPECT_EQ(doc["benchmarks"][0]["run_name"], rf.points[0].id.name());
  EXPECT_EQ(doc["benchmarks"][0]["accuracy"].get<double>(), rf.points[0].train->accuracy);
  EXPECT_EQ(doc["benchmarks"][0]["token_accuracy"].get<double>(), rf.points[0].train->token_accuracy);
  // The log: loss lines and validations of every run, named.
  std::ifstream in(log);
  std::string line;
  std::set<std::string> runs;
  int evals = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    runs.insert(j["point"].get<std::string>());
    evals += j.contains("val_accuracy") ? 1 : 0;
  }
  EXPECT_EQ(runs.size(), 4u);
  EXPECT_GE(evals, 4);
  auto t = test::exec("table " + out + " --metric accuracy", false);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("| mechanism | copy |"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("| flash | "), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("(n=2)"), std::string::npos) << t.out;  // two seeds, mean and spread
  // Losses to four significant digits, not two decimals: each cell is the seeds' mean loss.
  auto loss = test::exec("table " + out + " --metric eval_loss", false);
  ASSERT_EQ(loss.code, 0) << loss.out;
  double flash_loss = 0;
  for (const auto& p : rf.points)
    if (p.id.mechanism == "flash") flash_loss += p.train->eval_loss / 2;
  EXPECT_NE(loss.out.find("| flash | " + fmt::format("{:.4g}", flash_loss) + " ± "), std::string::npos) << loss.out;
  // Beside LRA's table, its whole layout: every mechanism, LRA's five tasks, the cells not run
  // said so, and LRA's published rows.
  auto lra = test::exec("table " + out + " --metric accuracy --published lra", false);
  ASSERT_EQ(lra.code, 0) << lra.out;
  EXPECT_NE(lra.out.find("| mechanism | copy | listops | text | retrieval | image | pathfinder | avg |"), std::string::npos) << lra.out;
  EXPECT_NE(lra.out.find("| flash | "), std::string::npos) << lra.out;
  for (const auto& m : mechanism_names()) {
    if (m == "flash" || m == "linear") continue;
    EXPECT_NE(lra.out.find("| " + m + " | not run | not run | not run | not run | not run | not run | - |"), std::string::npos) << m << "\n" << lra.out;
  }
  EXPECT_NE(lra.out.find("|   LRA: Performer |  | 18.01 | 65.40 | 53.82 | 42.77 | 77.05 |"), std::string::npos) << lra.out;
  fs::remove(out);
  fs::remove(log);
}

// Beside LRA's table, each column's Spearman correlation with LRA's order, and a note when the
// column's accuracies are too close for their test split to order them.
TEST(TrainCli, SpearmanSaysWhenAColumnRanksNoise) {
  const std::string out = test::temp_path("spearman.json"), edited = test::temp_path("spearman_edited.json");
  fs::remove(out);
  auto e = test::exec("train --task listops --seq 128 --layers 1 --dmodel 16 --heads 2 --mlp 32 --batch 4 --steps 2 "
                      "--eval-examples 8 --test-examples 100 --attn flash,linear,performer --out " + out);
  ASSERT_EQ(e.code, 0) << e.out;
  auto with_accuracies = [&](std::map<std::string, double> acc) {
    auto doc = nlohmann::json::parse(std::ifstream(out));
    for (auto& b : doc["benchmarks"])
      if (b.contains("accuracy"))
        for (const auto& [m, a] : acc)
          if (b["name"].get<std::string>().rfind("attn:" + m + "/", 0) == 0) b["accuracy"] = a;
    std::ofstream(edited) << doc.dump();
    auto t = test::exec("table " + edited + " --metric accuracy --published lra", false);
    EXPECT_EQ(t.code, 0) << t.out;
    return t.out;
  };
  // LRA's ListOps: Transformer 36.37 > Performer 18.01 > Linear 16.13; ours in the order
  // flash < linear < performer: rank differences 2, 1, 1, so rho = 1 - 6 * 6 / (3 * 8) = -0.5.
  const std::string apart = with_accuracies({{"flash", 0.10}, {"linear", 0.40}, {"performer", 0.70}});
  EXPECT_NE(apart.find("listops -0.50 (3 mechanisms)"), std::string::npos) << apart;
  // Two points apart on 100 test examples each at 31%: twice the standard error of a difference
  // is 200 sqrt(2 0.31 0.69 / 100) = 13.08 points.
  const std::string close = with_accuracies({{"flash", 0.30}, {"linear", 0.31}, {"performer", 0.32}});
  EXPECT_NE(close.find("listops -0.50 (3 mechanisms; spread 2.00 points, within 13.08, twice the standard error of "
                       "a difference on 100 examples: it ranks noise)"),
            std::string::npos)
      << close;
  // Below the table, the floor of each column: the accuracy of answering the commonest label of
  // the examples the metric was measured on (100 test examples, 8 validation ones, `train`'s
  // default seed 0).
  auto floor_of = [](Split split, int64_t examples) {
    TaskOptions o;
    o.seed = 0;
    o.seq = 128;
    o.split = split;
    const auto l = label_counts(*make_task("listops", o), 10, 0, examples);
    EXPECT_EQ(l.examples, examples);
    return fmt::format("{:.2f}", 100 * l.commonest_share());
  };
  EXPECT_NE(close.find("Answering one class for every input (the commonest label of the test set) scores: listops " +
                       floor_of(Split::test, 100) + "\n"),
            std::string::npos)
      << close;
  auto val = test::exec("table " + out + " --metric val_accuracy", false);
  ASSERT_EQ(val.code, 0) << val.out;
  EXPECT_NE(val.out.find("(the commonest label of the validation set) scores: listops " + floor_of(Split::val, 8) + "\n"),
            std::string::npos)
      << val.out;
  fs::remove(out);
  fs::remove(edited);
}

// A mechanism whose parameters differ from task to task (a preset's blocks of 50 where 64 does
// not divide N) is one row of the accuracy table, beside its published row; two configurations
// on one task make a row per configuration.
TEST(TrainCli, PerTaskParametersKeepOneRowPerMechanism) {
  const std::string out = test::temp_path("per_task_params.json");
  fs::remove(out);
  const std::string tiny = " --seq 128 --layers 1 --dmodel 16 --heads 2 --mlp 32 --batch 4 --steps 2 --eval-examples 8 "
                           "--test-examples 8 --attn local --out " + out;
  ASSERT_EQ(test::exec("train --task listops --param block=32" + tiny).code, 0);
  ASSERT_EQ(test::exec("train --task text --param block=64" + tiny).code, 0);
  auto t = test::exec("table " + out + " --metric accuracy --published lra", false);
  ASSERT_EQ(t.code, 0) << t.out;
  std::string local_row;
  for (const auto& l : test::lines_of(t.out))
    if (l.rfind("| local ", 0) == 0) local_row = l;
  EXPECT_EQ(local_row.find("block="), std::string::npos) << t.out;
  size_t not_run = 0;
  for (size_t at = local_row.find("not run"); at != std::string::npos; at = local_row.find("not run", at + 1)) ++not_run;
  EXPECT_EQ(not_run, 3u) << "listops and text filled, retrieval, image and pathfinder not run: " << t.out;
  EXPECT_NE(t.out.find("LRA: Local"), std::string::npos) << t.out;
  ASSERT_EQ(test::exec("train --task listops --param block=16" + tiny).code, 0);
  t = test::exec("table " + out + " --metric accuracy --published lra", false);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("| local block=16 | "), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("| local block=32 | "), std::string::npos) << t.out;
  // Another model size or number of steps on one task is another row too, named by what differs
  // (lra-knobs: the Transformer with more steps and at twice the width on one task).
  ASSERT_EQ(test::exec("train --task text --param block=64 --dmodel 32 --heads 4" +
                       std::regex_replace(tiny, std::regex(" --dmodel 16 --heads 2"), ""))
                .code,
            0);
  ASSERT_EQ(test::exec("train --task text --param block=64 --steps 3" + std::regex_replace(tiny, std::regex(" --steps 2"), "")).code, 0);
  t = test::exec("table " + out + " --metric accuracy", false);
  ASSERT_EQ(t.code, 0) << t.out;
  for (const char* row : {"| local dmodel=16 H=2 steps=2 | ", "| local dmodel=32 H=4 steps=2 | ", "| local dmodel=16 H=2 steps=3 | "})
    EXPECT_NE(t.out.find(row), std::string::npos) << row << "\n" << t.out;
  fs::remove(out);
}

// The MQAR table (Zoology's layout): a rate's seeds are averaged (mean ± sample std), and the rate
// is chosen by its seeds' mean validation accuracy, not by the best single seed.
TEST(TrainTable, RecallTableAveragesSeedsBeforeChoosingTheRate) {
  const std::string out = test::temp_path("recall_seeds.json");
  fs::remove(out);
  auto e = test::exec("train --task mqar --seq 64 --layers 1 --dmodel 16 --heads 1 --mlp 0 --tie-embeddings --vocab 64 "
                      "--steps 3 --eval-every 3 --eval-examples 64 --test-examples 64 --train-examples 256 "
                      "--lr 0.001,0.01 --seed 1,2 --out " + out, false);
  ASSERT_EQ(e.code, 0) << e.out;
  // The expected cell from the file: per rate, the seeds' mean validation and test accuracy.
  std::map<std::string, std::vector<std::pair<double, double>>> by_rate;  // lr -> (val, test) per seed
  std::ifstream in(out);
  const nlohmann::json file = nlohmann::json::parse(in);
  for (const auto& b : file.at("benchmarks"))
    if (b.value("run_type", "") == "iteration")
      by_rate[b.at("point").at("lr").get<std::string>()].push_back({b.at("val_accuracy").get<double>(), b.at("accuracy").get<double>()});
  ASSERT_EQ(by_rate.size(), 2u) << file.dump().substr(0, 2000);
  std::string best;
  double best_val = -1;
  for (const auto& [lr, runs] : by_rate) {
    ASSERT_EQ(runs.size(), 2u) << lr;
    const double val = (runs[0].first + runs[1].first) / 2;
    if (val > best_val) best_val = val, best = lr;
  }
  const auto& r = by_rate.at(best);
  const double mean = 50 * (r[0].second + r[1].second), sd = 100 * std::abs(r[0].second - r[1].second) / std::sqrt(2.0);
  const auto t = test::exec("table " + out + " --metric accuracy", false);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find(fmt::format("| flash | {:.2f} ± {:.2f} (n=2) (lr {}, best of 2) |", mean, sd, best)), std::string::npos)
      << best << "\n" << t.out;
  // Validation accuracies set so that the best single seed's rate (0.001: 0.9 and 0.1) is not the
  // best mean's (0.01: 0.6 and 0.6): the table takes 0.01.
  nlohmann::json edited = file;
  std::map<std::string, int> seen;
  std::map<std::string, double> val_of;  // run name -> its validation accuracy
  for (auto& b : edited["benchmarks"])
    if (b.value("run_type", "") == "iteration") {
      const std::string lr = b["point"]["lr"];
      val_of[b["run_name"]] = lr == "0.001" ? (seen[lr]++ ? 0.1 : 0.9) : 0.6;
    }
  for (auto& b : edited["benchmarks"])
    if (val_of.count(b["run_name"])) b["val_accuracy"] = val_of.at(b["run_name"]);
  const std::string edited_path = test::temp_path("recall_seeds_edited.json");
  std::ofstream(edited_path) << edited.dump();
  const auto t2 = test::exec("table " + edited_path + " --metric accuracy", false);
  ASSERT_EQ(t2.code, 0) << t2.out;
  EXPECT_NE(t2.out.find("(n=2) (lr 0.01, best of 2) |"), std::string::npos) << t2.out;
  fs::remove(edited_path);
  fs::remove(out);
}

// compare --metric accuracy gates a drop in test accuracy (deterministic: a plain threshold).
TEST(TrainCli, CompareGatesAnAccuracyDrop) {
  const std::string base = test::temp_path("acc_base.json"), next = test::temp_path("acc_next.json");
  fs::remove(base);
  auto e = test::exec(std::string("train --steps 20 --out ") + base + kTinyTrain);
  ASSERT_EQ(e.code, 0) << e.out;
  auto doc = nlohmann::json::parse(std::ifstream(base));
  for (auto& b : doc["benchmarks"])
    if (b.contains("accuracy")) b["accuracy"] = b["accuracy"].get<double>() - 0.05;
  std::ofstream(next) << doc.dump();
  e = test::exec("compare " + base + " " + base + " --metric accuracy --max-regress 0.01", false);
  EXPECT_EQ(e.code, 0) << e.out;
  e = test::exec("compare " + base + " " + next + " --metric accuracy --max-regress 0.01", false);
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("REGRESSION: less accurate"), std::string::npos) << e.out;
  e = test::exec("compare " + base + " " + next + " --metric accuracy --max-regress 0.1", false);
  EXPECT_EQ(e.code, 0) << e.out;
  fs::remove(base);
  fs::remove(next);
}

// The presets' grids: the copy comparison's runs, and LRA Table 1's grid in the order the
// table needs it (the Transformer everywhere first, then the core rows, every mechanism on
// ListOps, the Transformer's other seeds, the rest).
TEST(TrainPresets, GridsHoldTheComparisonsInOrder) {
  const auto copy = train_preset_grid("copy", TrainPresetOptions{});
  ASSERT_EQ(copy.size(), 7u);
  EXPECT_EQ(copy[0].mechanism, "flash");
  EXPECT_EQ(copy[1].mechanism, "linear");
  EXPECT_NE(params_text(copy[2].params).find("n_hashes=1"), std::string::npos);
  EXPECT_NE(params_text(copy[3].params).find("n_hashes=4"), std::string::npos);
  EXPECT_EQ(copy[4].mechanism, "lightconv");
  EXPECT_EQ(copy[5].mechanism, "dynamicconv");
  EXPECT_EQ(copy[6].mechanism, "routing");
  for (const auto& p : copy) EXPECT_TRUE(p.causal && p.training() && p.task == "copy");
  const auto lra = train_preset_grid("lra-accuracy", TrainPresetOptions{});
  const size_t mechs = mechanism_names().size();
  EXPECT_EQ(lra.size(), mechs * 5 + 2 * 5);  // every mechanism on five tasks; two more seeds of flash
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(lra[i].mechanism, "flash");
  std::set<std::string> on_listops;
  for (const auto& p : lra)
    if (p.task == "listops") on_listops.insert(p.mechanism);
  EXPECT_EQ(on_listops.size(), mechs);
  for (const auto& p : lra) {
    EXPECT_EQ(p.data_dir.empty(), p.task != "image") << p.name();  // Fashion-MNIST for the image column
    EXPECT_TRUE(p.training());
  }
  TrainPresetOptions narrow;
  narrow.mechanisms = {"linear"};
  narrow.tasks = {"listops"};
  narrow.seeds = {7};
  const auto one = train_preset_grid("lra-accuracy", narrow);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].train.seed, 7);
  EXPECT_THROW(train_preset_grid("lra-speed", TrainPresetOptions{}), InvalidInput);
}

// lra-knobs: the grid's own Transformer runs on Image and Pathfinder with 3x and 4x the steps
// (warm-up and evaluations scaled with them), and on Image at twice the width (d 128, 4 heads of
// the grid's 32, FFN 256) with the grid's steps; nothing else changed.
TEST(TrainPresets, KnobsAreTheGridsRunsWithMoreStepsOrWidth) {
  const auto knobs = train_preset_grid("lra-knobs", TrainPresetOptions{});
  ASSERT_EQ(knobs.size(), 3u);
  TrainPresetOptions flash;
  flash.mechanisms = {"flash"};
  flash.seeds = {1};
  for (size_t i = 0; i < knobs.size(); ++i) {
    const PointId& k = knobs[i];
    SCOPED_TRACE(k.name());
    flash.tasks = {k.task};
    const auto grid = train_preset_grid("lra-accuracy", flash);
    ASSERT_EQ(grid.size(), 1u);
    EXPECT_EQ(k.mechanism, "flash");
    EXPECT_EQ(k.task, i == 1 ? "pathfinder" : "image");
    PointId same = k;
    if (i < 2) {  // steps
      const int64_t times = i == 0 ? 3 : 4;
      EXPECT_EQ(k.train.steps, grid[0].train.steps * times);
      EXPECT_EQ(k.train.warmup, k.train.steps / 10);
      EXPECT_EQ(k.train.eval_every, k.train.steps / 10);
      same.train.steps = grid[0].train.steps;
      same.train.warmup = grid[0].train.warmup;
      same.train.eval_every = grid[0].train.eval_every;
    } else {  // width
      EXPECT_EQ(k.model.dmodel, 2 * grid[0].model.dmodel);
      EXPECT_EQ(k.model.mlp, 2 * grid[0].model.mlp);
      EXPECT_EQ(k.shape.H, 2 * grid[0].shape.H);
      EXPECT_EQ(k.shape.D, grid[0].shape.D);
      same.model = grid[0].model;
      same.shape = grid[0].shape;
    }
    EXPECT_EQ(same.name(), grid[0].name());  // the data and the rest of the recipe
  }
  TrainPresetOptions listops;
  listops.tasks = {"listops"};
  EXPECT_THROW(train_preset_grid("lra-knobs", listops), InvalidInput);
}

// `run --preset lra-accuracy` times the training grid's configurations: each run's point without
// its recipe (same model, batch, length, data and mechanism parameters) but with its position
// encoding, which changes a step's cost; the seeds as one.
TEST(TrainPresets, TimingPointsAreTheRunsWithoutTheirRecipe) {
  const auto runs = train_preset_grid("lra-accuracy", TrainPresetOptions{});
  const auto timed = train_preset_timing_points("lra-accuracy", TrainPresetOptions{});
  EXPECT_EQ(timed.size(), mechanism_names().size() * 5);  // flash's three seeds are one configuration
  std::set<std::string> names;
  for (const auto& t : timed) {
    EXPECT_FALSE(t.training()) << t.name();
    EXPECT_TRUE(t.level == Level::model && t.mode == RunMode::train) << t.name();
    EXPECT_TRUE(names.insert(t.name()).second) << "twice: " << t.name();
  }
  for (PointId r : runs) {
    const auto positions = r.train.positions;
    r.train = TrainSpec{};
    r.train.positions = positions;
    EXPECT_TRUE(names.count(r.name())) << "no timing point for " << r.name();
  }
}

// A preset sets its recipe and shapes: giving one is refused, not ignored.
TEST(TrainCli, PresetRefusesTheFieldsItSets) {
  for (const char* field : {"--steps 10", "--dropout 0", "--seq 64"}) {
    auto e = test::exec(std::string("train --preset copy --out never.json ") + field);
    EXPECT_EQ(e.code, 2) << field << ": " << e.out;
    const std::string option = std::string(field).substr(0, std::string(field).find(' '));
    EXPECT_NE(e.out.find("--preset copy sets " + option + " itself"), std::string::npos) << e.out;
  }
  EXPECT_FALSE(fs::exists("never.json"));
}

// --dtype bf16 turns every run of a preset into its bf16 twin (the same recipe, a name of its
// own); one precision per file.
TEST(TrainCli, PresetTakesOneDtype) {
  TrainPresetOptions o;
  const auto f32 = train_preset_grid("copy", o);
  o.dtype = Dtype::bf16;
  const auto bf16 = train_preset_grid("copy", o);
  ASSERT_EQ(f32.size(), bf16.size());
  for (size_t i = 0; i < f32.size(); ++i) {
    EXPECT_EQ(bf16[i].dtype, Dtype::bf16);
    PointId back = bf16[i];
    back.dtype = Dtype::f32;
    EXPECT_EQ(back.name(), f32[i].name());
    EXPECT_NE(bf16[i].name(), f32[i].name());
  }
  auto e = test::exec("train --preset copy --dtype f32,bf16 --out never.json --dry-run");
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("takes one --dtype"), std::string::npos) << e.out;
  // A CPU without AVX512-BF16 (simulated) refuses a bf16 preset and a bf16 run before anything runs.
  for (const std::string& cmd : {std::string("train --preset copy --dtype bf16 --out never.json --dry-run"),
                                 std::string("train --dtype bf16 --steps 2") + kTinyTrain}) {
    e = test::exec(cmd, true, "ATTNBENCH_SIMULATE_NO_BF16=1");
    EXPECT_EQ(e.code, 2) << cmd << ": " << e.out;
    EXPECT_NE(e.out.find("needs a CPU with AVX512-BF16"), std::string::npos) << e.out;
  }
  EXPECT_FALSE(fs::exists("never.json"));
}

TEST(TrainCli, BadRecipesExitTwoAndTrainNothing) {
  for (const auto& [args, msg] : std::vector<std::pair<std::string, std::string>>{
           {"train --steps 0", "--steps must be at least 1"},
           {"train --lr -1", "--lr must be positive"},
           {"train --schedule sawtooth", "unknown schedule 'sawtooth'"},
           {"train --schedule onecycle", "needs --warmup-steps"},
           {"train --dropout 1.5", "--dropout must be in [0, 1)"},
           {"train --positions spiral", "unknown positions 'spiral'"},
           {"train --clip-mode sometimes", "unknown --clip-mode 'sometimes'"},
           {"train --resume", "--resume needs --checkpoint"}}) {
    auto e = test::exec(args + kTinyTrain);
    EXPECT_EQ(e.code, 2) << args << ": " << e.out;
    EXPECT_NE(e.out.find(msg), std::string::npos) << args << ": " << e.out;
  }
}

}  // namespace
}  // namespace ab
