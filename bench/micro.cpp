// Google Benchmark micro benchmarks of the kernels' building blocks: the tile matmul through the
// oneDNN wrapper and the vectorised exp. `attnbench run` is the suite's benchmark; these exist to
// see, in isolation, what the attention kernels are built from.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <limits>

#include "attention_impls/lsh_hash.hpp"
#include "attention_impls/tiled_softmax.hpp"
#include "core/matmul.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"
#include "core/vecmath.hpp"

namespace {

// Times one tile product C = A B (zero inputs: the speed does not depend on the values) and
// reports GFLOP/s.
void time_tile(benchmark::State& state, const ab::MatmulSpec& spec, int64_t a_floats, int64_t b_floats,
               int64_t c_floats) {
  omp_set_num_threads(1);
  ab::Buffer<float> a(a_floats), b(b_floats), c(c_floats);
  a.zero();
  b.zero();
  ab::Matmul mm(spec);
  ab::Buffer<std::byte> scratch(mm.scratchpad_bytes());
  mm.bind(1, scratch.data());
  for (auto _ : state) {
    mm.run(0, a.data(), b.data(), c.data());
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * spec.M * spec.N * spec.K,
                                                 benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

constexpr int64_t kD = 64;

// S(rows, cols) = 0.125 Q(rows, D) K(cols, D)^T, the tile's first product.
void BM_TileMatmulQK(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  time_tile(state, ab::MatmulSpec::tile(rows, cols, kD, kD, false, kD, true, cols, 0.125f), rows * kD, cols * kD,
            rows * cols);
}
// (48, 176): a band tile of the sparse engine (48 rows, window ±64).
BENCHMARK(BM_TileMatmulQK)->Args({128, 256})->Args({64, 128})->Args({256, 512})->Args({48, 176});

// The logits of a strip of 16 queries (Longformer's global queries) against 2048-key tiles of
// 8 heads' keys at N = 16384 (32 MiB, so the keys come from memory as in a run), through
// QKLogits: arg 0 computes Q K^T, arg 1 keys-major (K Q^T, then transposed into the tile).
void BM_StripLogits(benchmark::State& state) {
  const bool keys_major = state.range(0) != 0;
  constexpr int64_t kRows = 16, kCols = 2048, kKeys = 8 * 16384;
  omp_set_num_threads(1);
  ab::Tensor q(ab::Shape4{1, 1, kRows, kD}), k(ab::Shape4{1, 1, kKeys, kD});
  q.zero();
  k.zero();
  ab::Buffer<float> S(kRows * kCols);
  ab::QKLogits qk(kD, kD, kD, 0.125f, keys_major);
  ab::MatmulCache mm;
  qk.plan_tile(mm, kRows, kCols, kCols, false);
  ab::Buffer<std::byte> scratch(mm.scratch_per_slot());
  mm.bind(1, scratch.data());
  qk.setup(1);
  qk.bind(q.view(), k.view());
  int64_t c0 = 0;
  for (auto _ : state) {
    qk.logits(mm, 0, 0, 0, 0, kRows, c0, kCols, S.data(), kCols);
    benchmark::DoNotOptimize(S.data());
    c0 = (c0 + kCols) % kKeys;
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kRows * kCols * kD, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_StripLogits)->Arg(0)->Arg(1);

// O(rows, D) = P(rows, cols) V(cols, D), the tile's second product.
void BM_TileMatmulPV(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  time_tile(state, ab::MatmulSpec::tile(rows, kD, cols, cols, false, kD, false, kD), rows * cols, cols * kD, rows * kD);
}
BENCHMARK(BM_TileMatmulPV)->Args({128, 256})->Args({64, 128})->Args({48, 176});

void BM_ExpShiftSum(benchmark::State& state) {
  const int64_t n = state.range(0);
  ab::Buffer<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -0.01f * static_cast<float>(i % 700);
  for (auto _ : state) {
    float s = ab::exp_shift_sum(x.data(), y.data(), n, 0.5f);
    benchmark::DoNotOptimize(s);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_ExpShiftSum)->Arg(256)->Arg(4096);

// A masked softmax row: every third logit -inf (the mask value), as in reformer's chunks and at
// the edges of the sparse bands. Masked lanes must not cost more than the others (a clamp to the
// underflow limit once made each vector build a denormal).
void BM_ExpShiftSumMasked(benchmark::State& state) {
  const int64_t n = state.range(0);
  ab::Buffer<float> x(n), y(n);
  for (int64_t i = 0; i < n; ++i)
    x[i] = i % 3 == 0 ? -std::numeric_limits<float>::infinity() : -0.01f * static_cast<float>(i % 700);
  for (auto _ : state) {
    float s = ab::exp_shift_sum(x.data(), y.data(), n, 0.5f);
    benchmark::DoNotOptimize(s);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_ExpShiftSumMasked)->Arg(128)->Arg(4096);

// Reformer's hash product at its default shape for N = 16384 (one head): 4 rounds of n_buckets/2
// = 128 rotation columns against 64 blocks of 256 query rows, D = 64, as reformer.cpp runs it
// (projT(512, 256) = Rcat^T Q^T, Q read through its row stride), in the three element types
// oneDNN offers for it: f32 (what reformer runs), bf16 inputs with f32 output, and u8 x s8 ->
// s32. The lower-precision forms would need an exact correction to give the spec's buckets
// (README, "Reformer"); this measures only how fast the product itself could be.
void BM_HashProduct(benchmark::State& state) {
  using dt = dnnl::memory::data_type;
  omp_set_num_threads(1);
  constexpr int64_t n = 16384, rows = 256, cols = 4 * 128;
  const int type = static_cast<int>(state.range(0));
  ab::MatmulSpec spec = ab::MatmulSpec::tile(cols, rows, kD, cols, true, kD, true, rows);
  size_t in_bytes = sizeof(float), out_bytes = sizeof(float);
  if (type == 1) {
    spec.ta = spec.tb = dt::bf16;
    in_bytes = 2;
    state.SetLabel("bf16 x bf16 -> f32");
  } else if (type == 2) {
    spec = ab::MatmulSpec::tile(cols, rows, kD, kD, false, kD, true, rows);  // A as u8 rows
    spec.ta = dt::u8;
    spec.tb = dt::s8;
    spec.tc = dt::s32;
    in_bytes = 1;
    out_bytes = sizeof(int32_t);
    state.SetLabel("u8 x s8 -> s32");
  } else {
    state.SetLabel("f32");
  }
  ab::Buffer<std::byte> a(cols * kD * in_bytes), q(n * kD * in_bytes), c(cols * rows * out_bytes);
  a.zero();
  q.zero();
  ab::Matmul mm;
  try {
    mm = ab::Matmul(spec);
  } catch (const dnnl::error& e) {
    state.SkipWithError((std::string("oneDNN has no such product on this CPU: ") + e.what()).c_str());
    return;
  }
  ab::Buffer<std::byte> scratch(mm.scratchpad_bytes());
  mm.bind(1, scratch.data());
  for (auto _ : state) {
    for (int64_t i0 = 0; i0 < n; i0 += rows) mm.run(0, a.data(), q.data() + i0 * kD * in_bytes, c.data());
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * kD * cols, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
BENCHMARK(BM_HashProduct)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

// Reformer's whole exact hash for one head at its defaults for N (n_buckets = N/64, 4 rounds):
// quantisation, the int16 products, the argmax and the exact path, on standard normal queries
// (the rows' inverse norms, which reformer computes for its keys anyway, are taken once outside).
// Arg: N. Counters: the rate on the 2·N·D·half·rounds operations the f32 product would take
// (comparable with BM_HashProduct at 16384), and the share of (row, round) pairs that took the
// exact path.
void BM_RotationHash(benchmark::State& state) {
  const int64_t n = state.range(0), half = n / 64 / 2, rounds = 4;
  ab::Rng rng(7);
  ab::Buffer<float> rot(rounds * kD * half), q(n * kD);
  rng.fill_normal(rot.data(), static_cast<int64_t>(rot.size()));
  rng.fill_normal(q.data(), static_cast<int64_t>(q.size()));
  const ab::RotationHash hash(rot.data(), kD * half, rounds, kD, half);
  ab::Buffer<std::byte> scratch(ab::RotationHash::scratch_bytes(kD, half));
  ab::Buffer<int64_t> buckets(rounds * n);
  ab::Buffer<float> inv(n);
  ab::inverse_norms(q.data(), kD, n, kD, inv.data());
  int64_t exact = 0, calls = 0;
  for (auto _ : state) {
    exact += hash.assign(q.data(), kD, n, inv.data(), scratch.data(), buckets.data(), n);
    ++calls;
    benchmark::DoNotOptimize(buckets.data());
  }
  state.counters["Gop/s"] = benchmark::Counter(2.0 * n * kD * half * rounds, benchmark::Counter::kIsIterationInvariantRate,
                                               benchmark::Counter::kIs1000);
  state.counters["exact_share"] = static_cast<double>(exact) / static_cast<double>(std::max<int64_t>(1, calls * n * rounds));
}
BENCHMARK(BM_RotationHash)->Arg(4096)->Arg(16384)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
