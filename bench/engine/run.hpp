// `attnbench run`: a grid of points in this process, validated first, then timed point by point
// (and pass by pass with --rounds), printed and written as one result file.
#pragma once
#include <string>
#include <vector>

#include "bench/points/grid.hpp"
#include "bench/engine/runner.hpp"

namespace CLI {
class App;
}

namespace ab {

// The measuring options shared by run and sweep (--reps, --min-time, --warmup, --error,
// --mem-limit, --count), registered on a verb; finish() resolves their texts once parsed.
struct MeasureOptions {
  RunOptions run;
  std::string mem_limit;
  void add_to(CLI::App* app);
  // Copies the seed and data directory from the grid's options and checks every value.
  void finish(const GridOptions& grid);
};

// `run --preset NAME`: the options of a published protocol; the options the user gave win.
void apply_run_preset(const std::string& preset, GridOptions& grid, RunOptions& opts);

// width: the stdout table's width (0: every column in full).
int cmd_run(const std::vector<PointId>& grid, const RunOptions& opts, const std::string& out_path,
            const std::string& format, const std::string& command, const std::string& preset, int width);

}  // namespace ab
