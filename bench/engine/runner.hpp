// Running one benchmark point: validate, set up (untimed), warm up, time, measure memory.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "attention_impls/registry.hpp"
#include "bench/results/result.hpp"
#include "model/transformer.hpp"

namespace ab {

struct RunOptions {
  int reps = 5;             // repetitions kept and reported (per round)
  // `run`: passes over the whole list of points, one after another, every repetition of every
  // pass kept (see merge_round).
  int rounds = 1;
  double min_time = 0.05;   // seconds per repetition (iterations are added to reach it)
  int warmup = 1;           // untimed calls before timing
  uint64_t seed = 0;
  bool error = false;       // compute nmse against flash
  size_t mem_limit = 0;     // bytes; 0 = no limit
  bool count_instructions = false;  // also count each point's instructions under callgrind
  bool callgrind_child = false;     // this process runs under callgrind: collect one call only
  double gemm_gflops = 0;           // the per-thread GEMM rate to judge against; 0 = measure it
  bool oom_as_status = false;       // a point predicted above mem_limit is an OOM result, not an error
  // --error: a directory where flash's reference outputs are kept by input shape, so the
  // points of a sweep on the same inputs compute the reference once (at N = 16384 one flash
  // call is seconds). Empty: computed every time.
  std::string reference_dir;
  // The backward pass also writes the gradients of the mechanism's own learned tensors
  // (AttnProblem::param_grads; `dump` writes them beside the tensors).
  bool param_grads = false;
};

// Model level: distinct batches generated before timing and cycled through by the steps.
constexpr int64_t kModelBatches = 8;

// Q, K, V, O and (for backward) dO, dQ, dK, dV of one problem, filled from the seed:
// Q, K, V and dO standard normal from independent streams of the generator.
struct AttnData {
  Tensor q, k, v, o, dout, dq, dk, dv;
  AttnData(const Shape4& s, uint64_t seed, bool with_grad);
  AttnArgs args() const;
  size_t bytes() const;
};

// Random-stream ids, so every consumer of the seed draws from its own stream.
enum RngStream : uint64_t { kStreamQ = 1, kStreamK = 2, kStreamV = 3, kStreamDout = 4, kStreamParams = 100 };

// A point ready to run: the mechanism constructed and validated, its analytic cost known.
struct PreparedPoint {
  PointId id;
  const MechanismInfo* info = nullptr;
  std::unique_ptr<Attention> impl;          // attention level
  std::unique_ptr<TransformerModel> model;  // model level
  std::unique_ptr<Task> task;               // model level: the data source, made (and read) once
  Status status = Status::OK;  // SKIPPED when a capability is missing
  std::string message;
  double flops = 0;
  std::optional<double> admissible_fraction;  // fwd and fwdbwd: see Attention::admissible_fraction
  size_t working_bytes = 0;
  size_t predicted_bytes = 0;  // working bytes + inputs/outputs (+ the nmse reference)
};

// Throws InvalidInput for impossible shapes and parameters; a missing capability is returned
// as SKIPPED; a point predicted above opts.mem_limit throws InvalidInput naming the sizes.
PreparedPoint prepare_point(const PointId& id, const RunOptions& opts);

// Runs a prepared point. Allocation failure gives OOM, any other failure FAILED; the error is
// recorded in the result, never thrown.
PointResult run_point(PreparedPoint& pp, const RunOptions& opts, const std::string& label,
                      double gemm_gflops);

// Adds round `round` (0-based, > 0) of a point to its earlier rounds: the repetitions are
// appended, memory is the largest of any round, model-level layer times are averaged over every
// measured call; a round that did not end OK makes the point that status, without repetitions
// (as run_point reports a failure), its message naming the round.
void merge_round(PointResult& into, PointResult next, int round);

double nmse(const float* out, const float* ref, size_t n);

// The commit the binary was built from, "-dirty" when tracked files differed from it, or
// "unknown" outside a git checkout (generated at build time by cmake/git_commit.cmake).
const char* build_git_commit();

// "g++ 12.2.0": the compiler that built this binary.
std::string compiler_name();

// The GEMM reference a run's GFLOP/s are read against: the one-thread rate and, for each other
// thread count the run's points use, the rate on that many threads, so that a point on t threads
// is compared with GEMM on t threads (two cores of a machine do not give twice one core's rate).
struct GemmReference {
  double one_thread = 0;              // GFLOP/s on one thread
  std::map<int, double> on_threads;   // t > 1: GFLOP/s on t threads
  int other_runnable = -1;            // other runnable tasks while it was measured; -1: not measured here
  // What a point on t threads is judged against, per thread: the t-thread rate / t, or the
  // one-thread rate where t was not measured (PointResult::gemm_gflops holds it).
  double per_thread(int threads) const;
  // The context's gemm_gflops_per_s_1thread, gemm_gflops_per_s_on_threads ({"2": rate}, when
  // measured) and gemm_other_runnable.
  void record(nlohmann::json& context) const;
};
// `given` > 0 (--gemm-gflops: a sweep's child, given its point's per-thread rate): that rate
// for every thread count. Otherwise measured: one thread and each count above 1 in `threads`.
GemmReference gemm_reference(double given, const std::set<int>& threads);

// The result file's context block: Google Benchmark's machine fields plus the suite's build,
// library, threading and reproduction facts.
nlohmann::json run_context(const std::string& command, uint64_t seed, int threads, double gemm_gflops);

// The user's --context KEY=VALUE pairs: run_context adds them to every context this process
// writes (as Google Benchmark's --benchmark_context does). InvalidInput for a malformed pair or
// a key attnbench writes itself.
void set_user_context(const std::vector<std::string>& pairs);

// A test hook (docs/cli.md): ATTNBENCH_FAULT=KIND:TEXT makes `run` and `train` misbehave on the
// points whose name contains TEXT, so the sweep's isolation and its --retry-failed can be
// tested. KIND: crash (SIGSEGV), kill (SIGKILL, as the out-of-memory killer does), hang, exit
// (exit code 3).
void inject_fault(const PointId& id);

// The arguments of the `attnbench run` (or `train`) command that reproduces one point (without
// the program name), and that command as one line: the label of every result entry.
std::vector<std::string> point_args(const PointId& id, const RunOptions& o);
std::string point_label(const PointId& id, const RunOptions& o);

}  // namespace ab
