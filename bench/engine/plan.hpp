// `--dry-run`: the points a command would run, each with what it would cost, without running any.
#pragma once
#include <string>
#include <vector>

#include "bench/points/point.hpp"
#include "bench/engine/runner.hpp"

namespace ab {

// Validates and prepares every point (as the run would, so a bad grid fails the same way, exit 2)
// and prints one row per point: its columns, GFLOP per call, the predicted peak memory, and a
// lower bound on its time: its FLOPs at this machine's GEMM rate times the calls the protocol
// makes (warm-up and repetitions, each at least --min-time; a training run's steps). Then the
// totals. `isolated`: each point in its own process (sweep), which adds a start-up per point.
// `totals_note` is added to the totals' point count (what a resumed sweep leaves out); `jobs`
// points at a time (sweep --jobs) divide the time's bound.
int cmd_dry_run(const std::vector<PointId>& grid, const RunOptions& opts, bool isolated, int width,
                const std::string& totals_note = "", int jobs = 1);

}  // namespace ab
