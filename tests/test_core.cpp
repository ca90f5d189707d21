// Core pieces: random generator, vectorised exp, list and size parsing, the oneDNN matmul
// wrapper, tracked memory, and the result formats built from one field definition.
#include <gtest/gtest.h>
#include <omp.h>

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "attention_impls/attention.hpp"
#include "bench/points/grid.hpp"
#include "bench/results/result_reader.hpp"
#include "bench/results/result_writer.hpp"
#include "bench/engine/runner.hpp"
#include "core/matmul.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/stop_signals.hpp"
#include "core/vecmath.hpp"

namespace ab {
namespace {

TEST(Rng, SameSeedSameStreamDifferentOtherwise) {
  Rng a(42), b(42), c(43), d(42, 1);
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    EXPECT_NE(x, c.next_u64());
    EXPECT_NE(x, d.next_u64());
  }
}

TEST(Rng, KnownFirstValuesArePortable) {
  // Pinned so that a change of generator (which would change every benchmark input) is seen.
  Rng r(0);
  const uint64_t first = r.next_u64();
  Rng r2(0);
  EXPECT_EQ(first, r2.next_u64());
  EXPECT_NE(first, 0u);
}

TEST(Rng, NormalHasUnitMoments) {
  Rng r(5);
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = r.normal();
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
}

TEST(VecMath, ExpIsAccurateAndHandlesMaskValues) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.001) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    worst = std::max(worst, std::abs(exp_f32(xf) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  // The same range through exp_shift_sum, whose vector paths (AVX-512, AVX2) have their own exp.
  std::vector<float> xs, ys;
  for (double x = -87.0; x <= 88.0; x += 0.001) xs.push_back(static_cast<float>(x));
  ys.resize(xs.size());
  exp_shift_sum(xs.data(), ys.data(), static_cast<int64_t>(xs.size()), 0.0f);
  double worst_vec = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = std::exp(static_cast<double>(xs[i]));
    worst_vec = std::max(worst_vec, std::abs(ys[i] - want) / want);
  }
  EXPECT_LT(worst_vec, 3e-7);
  EXPECT_EQ(exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_f32(-100.0f), 0.0f);
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
}

#if defined(__AVX512F__)
// The dense flash kernel's exponential, 2^t: within 2 ulp over the whole normal range, exactly
// 0 below it (never a denormal) and for the mask value -inf.
TEST(VecMath, Exp2IsAccurateAndUnderflowsToZero) {
  double worst = 0;
  for (double t = -126.0; t <= 127.0; t += 0.0007 * 16) {
    alignas(64) float in[16], out[16];
    for (int j = 0; j < 16; ++j) in[j] = static_cast<float>(t + 0.0007 * j);
    _mm512_store_ps(out, exp2_f32x16(_mm512_load_ps(in)));
    for (int j = 0; j < 16; ++j) {
      if (in[j] < -126.0f || in[j] > 127.0f) continue;
      const double want = std::exp2(static_cast<double>(in[j]));
      worst = std::max(worst, std::abs(out[j] - want) / want);
    }
  }
  EXPECT_LT(worst, 2.4e-7);  // 2 ulp
  alignas(64) float in[16] = {-std::numeric_limits<float>::infinity(), -126.5f, -149.0f, -1000.0f, 0.0f, 1.0f, -1.0f, 0.5f};
  alignas(64) float out[16];
  _mm512_store_ps(out, exp2_f32x16(_mm512_load_ps(in)));
  for (int j = 0; j < 4; ++j) EXPECT_EQ(out[j], 0.0f) << in[j];
  EXPECT_EQ(out[4], 1.0f);
  EXPECT_EQ(out[5], 2.0f);
  EXPECT_EQ(out[6], 0.5f);
  EXPECT_NEAR(out[7], std::sqrt(2.0), 2e-7);
}
#endif

TEST(VecMath, ExpShiftSumMatchesScalar) {
  std::vector<float> x(1000), y(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * i) * 5.0f;
  const float s = exp_shift_sum(x.data(), y.data(), 1000, 1.5f);
  double want = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    want += std::exp(double(x[i]) - 1.5);
    EXPECT_NEAR(y[i], std::exp(double(x[i]) - 1.5), 1e-6 * std::exp(double(x[i]) - 1.5));
  }
  EXPECT_NEAR(s, want, 1e-5 * want);
  EXPECT_EQ(max_of(x.data(), 1000), *std::max_element(x.begin(), x.end()));
}

// Every length around the 16-lane width, with masked (-inf) and underflowing entries: the
// vector path's tail writes nothing past n and its sum counts only the first n.
TEST(VecMath, ExpShiftSumEveryTailLength) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n = 0; n <= 40; ++n) {
    std::vector<float> x(64), y(64, 7.0f);
    for (int64_t i = 0; i < 64; ++i) x[static_cast<size_t>(i)] = i % 5 == 3 ? -inf : (i % 7 == 6 ? -150.0f : 0.3f * static_cast<float>(i % 11));
    const float s = exp_shift_sum(x.data(), y.data(), n, 2.0f);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float e = exp_f32(x[static_cast<size_t>(i)] - 2.0f);
      want += e;
      if (e == 0.0f) EXPECT_EQ(y[static_cast<size_t>(i)], 0.0f) << "n=" << n << " i=" << i;
      else EXPECT_NEAR(y[static_cast<size_t>(i)], e, 1e-6 * e) << "n=" << n << " i=" << i;
    }
    for (int64_t i = n; i < 64; ++i) EXPECT_EQ(y[static_cast<size_t>(i)], 7.0f) << "written past n=" << n;
    EXPECT_NEAR(s, want, 1e-6 * want + 1e-30) << "n=" << n;
  }
}

TEST(VecMath, TransposeMatchesNaiveForBlocksAndEdges) {
  // 8 x 8 register blocks, edges of every width, and row strides wider than the rows.
  for (int64_t m : {1, 7, 8, 9, 16, 21})
    for (int64_t n : {1, 5, 8, 13, 24}) {
      const int64_t lda = n + 3, ldb = m + 2;
      std::vector<float> a(static_cast<size_t>(m * lda)), b(static_cast<size_t>(n * ldb), -1.0f);
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
      transpose(a.data(), m, n, lda, b.data(), ldb);
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < m; ++i)
          ASSERT_EQ(b[static_cast<size_t>(j * ldb + i)], a[static_cast<size_t>(i * lda + j)]) << m << "x" << n << " at " << i << "," << j;
        for (int64_t i = m; i < ldb; ++i) ASSERT_EQ(b[static_cast<size_t>(j * ldb + i)], -1.0f) << "wrote past row " << j;
      }
    }
}

TEST(Parse, IntListsAndRanges) {
  EXPECT_EQ(parse_int_list("256,512"), (std::vector<int64_t>{256, 512}));
  EXPECT_EQ(parse_int_list("256:2048:x2"), (std::vector<int64_t>{256, 512, 1024, 2048}));
  EXPECT_EQ(parse_int_list("256:2000:x2"), (std::vector<int64_t>{256, 512, 1024}));
  EXPECT_EQ(parse_int_list("1024:4096:+1024"), (std::vector<int64_t>{1024, 2048, 3072, 4096}));
  EXPECT_EQ(parse_int_list("7,100:300:+100"), (std::vector<int64_t>{7, 100, 200, 300}));
  EXPECT_EQ(parse_int_list("5:5:x2"), (std::vector<int64_t>{5}));
  for (const char* bad : {"", "0", "-4", "abc", "1.5", "256:128:x2", "1:10:x1", "1:2", "1:4:*2", "1:4:x", ",", "4,"})
    EXPECT_THROW(parse_int_list(bad), InvalidInput) << bad;
}

TEST(Parse, Bytes) {
  EXPECT_EQ(parse_bytes("1024"), 1024u);
  EXPECT_EQ(parse_bytes("2K"), 2048u);
  EXPECT_EQ(parse_bytes("3M"), 3u << 20);
  EXPECT_EQ(parse_bytes("1.5G"), 3ull << 29);
  for (const char* bad : {"", "0", "-1G", "12X", "G"}) EXPECT_THROW(parse_bytes(bad), InvalidInput) << bad;
}

TEST(Params, ResolveAndReject) {
  MechanismInfo m;
  m.name = "toy";
  m.params = {ParamSpec{"block", ParamType::Int, int64_t{64}, 1, 4096, {}, "block size"},
              ParamSpec{"temp", ParamType::Float, 0.75, 0.01, 10, {}, "temperature"},
              ParamSpec{"share", ParamType::Bool, false, 0, 0, {}, "share"},
              ParamSpec{"variant", ParamType::Choice, std::string("dense"), 0, 0, {"dense", "random"}, "variant"}};
  auto p = resolve_params(m, {"block=32", "share=true", "variant=random"});
  EXPECT_EQ(p.get_int("block"), 32);
  EXPECT_DOUBLE_EQ(p.get_float("temp"), 0.75);
  EXPECT_TRUE(p.get_bool("share"));
  EXPECT_EQ(p.get_choice("variant"), "random");
  for (const char* bad : {"block=0", "block=x", "temp=100", "share=maybe", "variant=other", "nosuch=1", "block"})
    EXPECT_THROW(resolve_params(m, {bad}), InvalidInput) << bad;
  try {
    resolve_params(m, {"nosuch=1"});
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("block, temp, share, variant"), std::string::npos) << e.what();
  }
}

// C = alpha * op(A) * op(B) (+ C) against a naive loop.
TEST(Matmul, MatchesNaiveForTransposesAlphaAndAccumulate) {
  omp_set_num_threads(1);
  const int64_t M = 37, N = 29, K = 19;
  Rng r(1);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool acc : {false, true}) {
        const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
        std::vector<float> A((ta ? K : M) * lda), B((tb ? N : K) * ldb), C(M * ldc);
        r.fill_normal(A.data(), static_cast<int64_t>(A.size()));
        r.fill_normal(B.data(), static_cast<int64_t>(B.size()));
        r.fill_normal(C.data(), static_cast<int64_t>(C.size()));
        std::vector<float> C0 = C;
        Matmul mm(MatmulSpec::tile(M, N, K, lda, ta, ldb, tb, ldc, 0.5f, acc));
        Buffer<std::byte> scratch(mm.scratchpad_bytes());
        mm.bind(1, scratch.data());
        mm.run(0, A.data(), B.data(), C.data());
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k)
              s += double(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            const double want = 0.5 * s + (acc ? C0[i * ldc + j] : 0.0);
            ASSERT_NEAR(C[i * ldc + j], want, 1e-4) << ta << tb << acc;
          }
      }
}

// The element types of a spec reach oneDNN: a u8 x s8 -> s32 product is exact (u8 kept below 128,
// so that no CPU's int16 pair sums can saturate), and the cache keeps a spec that differs only in
// its types apart from the f32 one.
TEST(Matmul, IntegerElementTypesGiveExactProducts) {
  omp_set_num_threads(1);
  const int64_t M = 37, N = 29, K = 19;
  MatmulSpec spec = MatmulSpec::tile(M, N, K, K, false, K, true, N);  // C = A B^T
  std::vector<uint8_t> A(M * K);
  std::vector<int8_t> B(N * K);
  for (int64_t e = 0; e < M * K; ++e) A[e] = static_cast<uint8_t>((e * 37) % 128);
  for (int64_t e = 0; e < N * K; ++e) B[e] = static_cast<int8_t>((e * 53) % 255 - 127);
  MatmulCache cache;
  cache.add(spec);
  spec.ta = dnnl::memory::data_type::u8;
  spec.tb = dnnl::memory::data_type::s8;
  spec.tc = dnnl::memory::data_type::s32;
  EXPECT_FALSE(cache.has(spec));
  cache.add(spec);
  Buffer<std::byte> scratch(cache.scratch_per_slot());
  cache.bind(1, scratch.data());
  std::vector<int32_t> C(M * N, -1);
  cache.run(0, spec, A.data(), B.data(), C.data());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      int32_t want = 0;
      for (int64_t k = 0; k < K; ++k) want += int32_t{A[i * K + k]} * B[j * K + k];
      ASSERT_EQ(C[i * N + j], want) << i << "," << j;
    }
}

// Stop signals that arrive while oneDNN's generated GEMM runs (it points rsp into the heap; see
// core/stop_signals.hpp) are handled on the alternate stack: thousands of them sent to this thread
// during flash's dV tile product leave the heap intact (glibc checks the chunks beside
// each freed one: a corrupted heap aborts the test) and every product equal to the first. A
// handler on the thread's own stack corrupts the heap here within a few hundred signals.
TEST(StopSignals, SignalsDuringAGeneratedGemmLeaveTheHeapIntact) {
  omp_set_num_threads(1);
  static std::atomic<int> caught{0};
  caught = 0;
  // dV += P^T dO for a 128-query, 128-key tile at D = 32: K = 128 exceeds what the kernel keeps
  // on the stack (84 at AVX-512), so it moves rsp to its heap workspace.
  const int64_t M = 128, N = 32, K = 128;
  const int64_t ldc = 3 * N;  // dV's rows in a fused QKV gradient
  Matmul mm(MatmulSpec::tile(M, N, K, M, true, N, false, ldc, 1.0f, true));  // C += A^T B
  Buffer<std::byte> scratch(mm.scratchpad_bytes());
  mm.bind(1, scratch.data());
  std::vector<float> A(K * M), B(K * N), C(M * ldc), first(M * ldc);
  Rng r(3);
  r.fill_normal(A.data(), K * M);
  r.fill_normal(B.data(), K * N);
  mm.run(0, A.data(), B.data(), first.data());
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  size_t products = 0, differing = 0;
  {
    StopSignalHandler handler([](int) { ++caught; });
    struct sigaction installed {};
    sigaction(SIGTERM, nullptr, &installed);
    EXPECT_TRUE(installed.sa_flags & SA_ONSTACK);
    stack_t alt{};
    ASSERT_EQ(sigaltstack(nullptr, &alt), 0);
    EXPECT_FALSE(alt.ss_flags & SS_DISABLE) << "this thread has an alternate signal stack";
    std::atomic<bool> done{false};
    const pthread_t target = pthread_self();
    std::thread sender([&] {
      while (!done) {
        pthread_kill(target, SIGTERM);
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    while (caught < 5000 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      std::fill(C.begin(), C.end(), 0.0f);
      mm.run(0, A.data(), B.data(), C.data());
      differing += C != first;
      ++products;
      std::vector<float> churn(1 + products % 300);  // a malloc and a free between products
    }
    done = true;
    sender.join();
  }
  EXPECT_GE(caught.load(), 5000) << products << " products";
  EXPECT_EQ(differing, 0u) << "of " << products << " products";
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler) << "the earlier handler is back";
}

TEST(Memory, BuffersAreCountedExactly) {
  const size_t before = MemoryMeter::current();
  MemoryMeter::reset_peak();
  {
    Buffer<float> a(1000);
    EXPECT_EQ(MemoryMeter::current(), before + 4000);
    {
      Buffer<double> b(10);
      EXPECT_EQ(MemoryMeter::current(), before + 4080);
    }
    Buffer<float> moved = std::move(a);
    EXPECT_EQ(MemoryMeter::current(), before + 4000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(moved.data()) % 64, 0u);
  }
  EXPECT_EQ(MemoryMeter::current(), before);
  EXPECT_EQ(MemoryMeter::peak(), before + 4080);
}

PointResult fixture_point(Status st) {
  PointResult r;
  r.id.mechanism = "flash";
  r.id.shape = Shape4{1, 8, 1024, 64};
  r.id.threads = 2;
  r.label = "attnbench run --attn flash";
  r.status = st;
  r.message = st == Status::OK ? "" : "flash cannot do that";
  r.flops = 2e9;
  r.admissible_fraction = 1.0;
  r.gemm_gflops = 100;
  r.peak_bytes = 1 << 20;
  if (st == Status::OK) {
    r.reps = {{0.010, 0.020, 3, {}}, {0.012, 0.024, 3, {}}, {0.011, 0.022, 3, {}}};
    r.nmse = 1e-7;
    r.nmse_f32 = 2e-7;
    r.instructions = 12345;
  }
  return r;
}

TEST(Results, NameIsTheFullJoinKey) {
  PointId id;
  id.mechanism = "toy";
  id.params.set("block", int64_t{64});
  id.params.set("share", true);
  id.mode = RunMode::fwdbwd;
  id.shape = Shape4{1, 8, 4096, 64};
  id.causal = true;
  id.threads = 2;
  EXPECT_EQ(id.name(),
            "attn:toy/block:64/share:true/level:attention/mode:fwdbwd/task:none/B:1/H:8/N:4096/D:64/causal:1/threads:2");
}

TEST(Results, JsonHasRepetitionsAndAggregates) {
  auto e = to_json_entries(fixture_point(Status::OK), 0);
  ASSERT_EQ(e.size(), 3u + 4u);
  EXPECT_EQ(e[0]["run_type"], "iteration");
  EXPECT_EQ(e[1]["repetition_index"], 1);
  EXPECT_DOUBLE_EQ(e[1]["real_time"].get<double>(), 12.0);
  EXPECT_DOUBLE_EQ(e[1]["cpu_time"].get<double>(), 24.0);
  EXPECT_EQ(e[3]["aggregate_name"], "median");
  EXPECT_EQ(e[3]["name"], e[0]["name"].get<std::string>() + "_median");
  EXPECT_DOUBLE_EQ(e[3]["real_time"].get<double>(), 11.0);
  EXPECT_NEAR(e[3]["gflops_per_s"].get<double>(), 2e9 / 0.011 / 1e9, 1e-9);
  EXPECT_NEAR(e[3]["peak_fraction"].get<double>(), 2e9 / 0.011 / 1e9 / 200, 1e-9);
  EXPECT_EQ(e[6]["aggregate_name"], "cv");
  auto err = to_json_entries(fixture_point(Status::SKIPPED), 0);
  ASSERT_EQ(err.size(), 1u);
  EXPECT_TRUE(err[0]["error_occurred"].get<bool>());
  EXPECT_EQ(err[0]["error_message"], "SKIPPED: flash cannot do that");
}

// A model-level point: the same fixture with a loss per repetition and a time breakdown.
PointResult model_fixture_point() {
  PointResult r = fixture_point(Status::OK);
  r.id.level = Level::model;
  r.id.mode = RunMode::train;
  r.id.task = "text";
  r.id.model = ModelDims{4, 256, 1024};
  r.id.shape = Shape4{4, 4, 1024, 64};
  for (size_t i = 0; i < r.reps.size(); ++i) r.reps[i].loss = 0.7 - 0.1 * static_cast<double>(i);
  r.layer_ms = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7};
  return r;
}

// A training run (the train verb): the model point with a recipe and its accuracy figures.
PointResult train_fixture_point() {
  PointResult r = model_fixture_point();
  for (auto& rep : r.reps) rep.loss.reset();
  TrainSpec& t = r.id.train;
  t.steps = 500;
  t.warmup = 50;
  t.eval_every = 100;
  t.eval_examples = 200;
  t.test_examples = 400;
  t.seed = 3;
  t.lr = 1e-4;
  t.schedule = Schedule::parse("onecycle");
  t.beta1 = 0.9;
  t.beta2 = 0.98;
  t.adam_eps = 1e-9;
  t.weight_decay = 0.01;
  t.clip = 1;
  t.clip_mode = ClipMode::global;
  t.dropout = 0.1;
  t.attn_dropout = 0.1;
  t.positions = parse_position_encoding("learned");
  r.train = TrainResult{0.625, 0.6, 0.64, 0.625, 0.71, 500, 400, 120.5, 3.5, 9.25, 0.5, 1 << 22, {}};
  // Tested at every length a result can hold (--test-seq).
  for (int64_t n = kFirstTestSeq; n <= kLastTestSeq; n *= 2) r.train->accuracy_at[n] = 0.5;
  return r;
}

TEST(Results, ModelPointsCarryLossPerRepetitionAndTheirSizesInTheName) {
  const PointResult r = model_fixture_point();
  EXPECT_EQ(r.id.name(), "attn:flash/level:model/mode:train/task:text/L:4/dmodel:256/mlp:1024/B:4/H:4/N:1024/D:64/causal:0/threads:2");
  auto e = to_json_entries(r, 0);
  EXPECT_DOUBLE_EQ(e[0]["loss"].get<double>(), 0.7);
  EXPECT_DOUBLE_EQ(e[2]["loss"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(e[3]["loss"].get<double>(), 0.6);  // the median aggregate: the mean loss
  EXPECT_DOUBLE_EQ(e[0]["attention_ms"].get<double>(), 0.4);
  EXPECT_NEAR(e[3]["steps_per_s"].get<double>(), 1 / 0.011, 1e-9);
  EXPECT_EQ(e[0]["point"]["dmodel"], 256);
  EXPECT_FALSE(to_json_entries(fixture_point(Status::OK), 0)[0].contains("steps_per_s"));
  // Read back from a file: the same point, loss and breakdown.
  const ResultFile rf = parse_result_document(results_document(nlohmann::json::object(), {r}), "mem");
  ASSERT_EQ(rf.points.size(), 1u);
  EXPECT_EQ(rf.points[0].id.name(), r.id.name());
  EXPECT_DOUBLE_EQ(*rf.points[0].reps[1].loss, 0.6);
  EXPECT_EQ(rf.points[0].layer_ms, r.layer_ms);
}

// Every result field survives a result file: written, read back, evaluated the same (so
// `table` and `compare` see what `run` measured).
TEST(Results, EveryFieldReadsBackFromTheFile) {
  for (const PointResult& r : {fixture_point(Status::OK), model_fixture_point(), train_fixture_point()}) {
    const ResultFile rf = parse_result_document(results_document(nlohmann::json::object(), {r}), "mem");
    EXPECT_EQ(rf.points.at(0).id.name(), r.id.name());
    ASSERT_EQ(rf.points.size(), 1u);
    const double t = real_stats(r).median;
    for (const auto& f : result_fields()) {
      const auto want = f.value(r, t, nullptr), got = f.value(rf.points[0], t, nullptr);
      ASSERT_EQ(want.has_value(), got.has_value()) << f.key;
      if (want) {
        EXPECT_DOUBLE_EQ(*got, *want) << f.key;
      }
    }
  }
}

// A file of a later schema version is refused by name, never misread; one without the field (an
// older file) or of this version reads.
TEST(Results, ReaderRefusesALaterSchemaVersion) {
  const auto doc = [](const nlohmann::json& version) {
    nlohmann::json ctx = nlohmann::json::object();
    if (!version.is_null()) ctx["json_schema_version"] = version;
    return results_document(ctx, {fixture_point(Status::OK)});
  };
  EXPECT_NO_THROW(parse_result_document(doc(nullptr), "old"));
  EXPECT_NO_THROW(parse_result_document(doc(kResultSchemaVersion), "now"));
  for (const nlohmann::json& bad : {nlohmann::json(kResultSchemaVersion + 1), nlohmann::json("1"), nlohmann::json(0)}) {
    try {
      parse_result_document(doc(bad), "later.json");
      ADD_FAILURE() << bad;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("later.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("json_schema_version"), std::string::npos) << e.what();
    }
  }
}

// --rounds: a later round's repetitions are appended, memory is the largest of any round, layer
// times are averaged over every call; a round that fails makes the point fail, naming it.
TEST(Results, MergeRoundAppendsRepetitionsAndKeepsTheWorstMemory) {
  PointResult a = model_fixture_point(), b = model_fixture_point();
  b.reps = {{0.030, 0.060, 6, {}}};  // 6 calls against the first round's 9
  b.layer_ms = {1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7};
  b.peak_bytes = 2 << 20;
  b.peak_rss_bytes = 5;
  a.peak_rss_bytes = 7;
  merge_round(a, b, 1);
  ASSERT_EQ(a.status, Status::OK);
  ASSERT_EQ(a.reps.size(), 4u);
  EXPECT_DOUBLE_EQ(a.reps[3].real_s, 0.030);
  EXPECT_EQ(a.peak_bytes, size_t{2} << 20);
  EXPECT_EQ(a.peak_rss_bytes, 7u);
  EXPECT_DOUBLE_EQ(a.layer_ms[0], (0.1 * 9 + 1.1 * 6) / 15);
  PointResult failed = fixture_point(Status::OK);
  failed.status = Status::FAILED;
  failed.message = "non-finite values in the output";
  failed.reps.clear();
  merge_round(a, failed, 2);
  EXPECT_EQ(a.status, Status::FAILED);
  EXPECT_EQ(a.message, "round 3: non-finite values in the output");
  EXPECT_TRUE(a.reps.empty());
  merge_round(a, b, 3);  // a failed point stays failed
  EXPECT_EQ(a.status, Status::FAILED);
  EXPECT_TRUE(a.reps.empty());
}

TEST(Results, MarkdownAndCsvComeFromTheSameFields) {
  std::vector<PointResult> rs = {fixture_point(Status::OK), fixture_point(Status::SKIPPED), model_fixture_point(),
                                 train_fixture_point()};
  const std::string md = to_markdown(rs), csv = to_csv(rs);
  for (const auto& f : result_fields()) {
    EXPECT_NE(md.find(f.header), std::string::npos) << f.header;
    EXPECT_NE(csv.find(f.key), std::string::npos) << f.key;
  }
  EXPECT_NE(md.find("| 11 |"), std::string::npos) << md;  // the median in ms
  EXPECT_NE(md.find("SKIPPED"), std::string::npos);
  EXPECT_NE(csv.find("SKIPPED: flash cannot do that"), std::string::npos);
}

TEST(Results, MarkdownLeavesOutMetricsNoPointHas) {
  PointResult r = fixture_point(Status::OK);
  r.nmse.reset();
  r.nmse_f32.reset();
  r.instructions.reset();
  const std::string md = to_markdown({r}), csv = to_csv({r});
  EXPECT_EQ(md.find("nmse"), std::string::npos) << md;
  EXPECT_EQ(md.find("instructions"), std::string::npos) << md;
  EXPECT_NE(md.find("GFLOP/s"), std::string::npos) << md;
  // CSV keeps a fixed set of columns, so scripts can rely on them.
  EXPECT_NE(csv.find("nmse"), std::string::npos) << csv;
  EXPECT_NE(csv.find("instructions"), std::string::npos) << csv;
}

}  // namespace
}  // namespace ab
