// `attnbench sweep`: a grid of points, each run isolated in a child process, appended to one
// result file as it finishes.
#pragma once
#include <string>
#include <vector>

#include "bench/results/result.hpp"
#include "bench/engine/runner.hpp"

namespace ab {

struct SweepOptions {
  std::string out;            // the result file (required)
  bool resume = false;        // keep the points already in `out`, run only the others
  // With resume: run again the points recorded as failed (any status but OK and SKIPPED); the
  // earlier attempt's status and message stay in the context's "retried" list.
  bool retry_failed = false;
  double time_limit_s = 900;  // per point; 0 = none
  int shard_index = 1, shard_count = 1;  // run the shard_index-th of shard_count parts (1-based)
  // Points run at the same time, each job's children pinned to their own CPUs; more than one
  // only for training runs (timings would disturb each other). The file is still one.
  int jobs = 1;
  std::string command;        // the sweep's own command line, for the context block
  // --verb train: training runs, each checkpointing in train_dir/checkpoints/RUN and logging to
  // train_dir/logs/RUN.jsonl, resumed from there by the next `sweep --resume`.
  std::string verb = "run";
  std::string train_dir;
  int64_t checkpoint_every = 0, log_every = 10;
};

// "i/n" with 1 <= i <= n. Throws InvalidInput.
void parse_shard(const std::string& text, int* index, int* count);

// The points of shard i of n: every n-th point of the grid, starting at the (i-1)-th, so each
// shard gets a share of every sequence length.
// `sweep --out -`: the sweep into a temporary file (removed afterwards), which is then printed
// to stdout. Refuses --resume (there is nothing to resume).
int run_sweep_to_stdout(const std::vector<PointId>& grid, const RunOptions& opts, SweepOptions so);

std::vector<PointId> shard_of(const std::vector<PointId>& grid, int index, int count);

// Returns the exit code: 0 when every point was attempted (failed points are recorded, not
// fatal), 130 when interrupted (finished points kept). Bad input throws InvalidInput before
// anything runs.
int run_sweep(const std::vector<PointId>& grid, const RunOptions& opts, const SweepOptions& so);

// Whether `sweep --resume` keeps a point already in the file: always, but with --retry-failed
// not one that failed (any status but OK and SKIPPED), which runs again.
bool kept_on_resume(const PointResult& r, const SweepOptions& so);

// `--dry-run` of a sweep (or a training preset): the shard's points as cmd_dry_run shows them;
// with --resume and an existing --out, only the points the run would still make (the others
// are counted in the last line), so the time is what is left.
int cmd_sweep_dry_run(const std::vector<PointId>& grid, const RunOptions& opts, const SweepOptions& so, int width);

// `--status`: how far the sweep of `so` (its shard of `grid`, its file `so.out`) has come, read
// from the file alone (it is replaced atomically after every point, so this is safe while the
// sweep runs, on any host that sees the file). Nothing is run, locked or written.
struct SweepProgress {
  size_t points = 0;  // the shard's planned points
  size_t done = 0;    // in the file with status OK
  size_t failed = 0;  // in the file with any other status (OOM, TIMEOUT, CRASHED, FAILED, SKIPPED)
  size_t left = 0;    // planned, not yet in the file
  size_t foreign = 0; // in the file but not in this grid (the file belongs to another sweep)
};
SweepProgress sweep_progress(const std::vector<PointId>& grid, const SweepOptions& so);
// Prints one line: "shard 2/3: 4 points, 3 done, 1 failed, 0 left (FILE)". Returns 0.
// scripts/slurm/submit.sh reads the numbers by their position in it.
int cmd_sweep_status(const std::vector<PointId>& grid, const SweepOptions& so);

}  // namespace ab
