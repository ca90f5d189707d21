// Google Benchmark micro benchmarks of the kernels' building blocks: the tile matmul through the
// oneDNN wrapper and the vectorised exp. `attnbench run` is the suite's benchmark; these exist to
// see, in isolation, what the attention kernels are built from.
#include <benchmark/benchmark.h>
#include <omp.h>

#include "core/matmul.hpp"
#include "core/memory.hpp"
#include "core/vecmath.hpp"

namespace {

void BM_TileMatmulQK(benchmark::State& state) {
  omp_set_num_threads(1);
  const int64_t rows = state.range(0), cols = state.range(1), D = 64;
  ab::Buffer<float> q(rows * D), k(cols * D), s(rows * cols);
  q.zero();
  k.zero();
  ab::Matmul mm(ab::MatmulSpec::tile(rows, cols, D, D, false, D, true, cols, 0.125f));
  ab::Buffer<std::byte> scratch(mm.scratchpad_bytes());
  mm.bind(1, scratch.data());
  for (auto _ : state) {
    mm.run(0, q.data(), k.data(), s.data());
    benchmark::DoNotOptimize(s.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * D, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}
// (48, 176): a band tile of the sparse engine (48 rows, window ±64).
BENCHMARK(BM_TileMatmulQK)->Args({128, 256})->Args({64, 128})->Args({256, 512})->Args({48, 176});

// O(rows, D) = P(rows, cols) V(cols, D), the tile's second product.
void BM_TileMatmulPV(benchmark::State& state) {
  omp_set_num_threads(1);
  const int64_t rows = state.range(0), cols = state.range(1), D = 64;
  ab::Buffer<float> p(rows * cols), v(cols * D), o(rows * D);
  p.zero();
  v.zero();
  ab::Matmul mm(ab::MatmulSpec::tile(rows, D, cols, cols, false, D, false, D));
  ab::Buffer<std::byte> scratch(mm.scratchpad_bytes());
  mm.bind(1, scratch.data());
  for (auto _ : state) {
    mm.run(0, p.data(), v.data(), o.data());
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * D, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
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

}  // namespace

BENCHMARK_MAIN();
