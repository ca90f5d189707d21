// Reading result files back: `table` (comparison tables), `compare` (the regression gate) and
// `merge` (joining shards).
#pragma once
#include <string>
#include <vector>

#include "bench/result_file.hpp"

namespace ab {

struct TableOptions {
  std::string metric = "time";
  std::string baseline = "vanilla";
  std::string format = "md";  // md | csv | latex
  bool growth = false;        // ratios to the same row's previous N instead of to `baseline`
};
std::string table_metric_names();  // the metric names `--metric` accepts, for --help
// One table per point group (level, mode, task, B, H, D, causal, threads): rows mechanisms,
// columns N, cells "value (ratio)" where the ratio says how many times better than the baseline
// the value is (baseline/value for time and memory, value/baseline for rates); with `growth`,
// the value over the row's value at the previous N instead.
std::string make_table(const std::vector<ResultFile>& files, const TableOptions& o);
int cmd_table(const std::vector<std::string>& paths, const TableOptions& o);

// The LRA efficiency table (published.md) from model-level train points: steps/s with the
// ratio to `baseline`, peak memory, and at the longest N each mechanism's measured speed-up
// against the speed-up its analytic FLOPs predict, with the time per layer type.
std::string lra_efficiency_report(const std::vector<PointResult>& rs, const std::string& baseline);

struct CompareOptions {
  std::string metric = "time";  // time | instructions | memory
  double max_regress = 0.05;
  double alpha = 0.05;
  std::string format = "md";
  bool any_machine = false;  // time: compare files measured on different machines anyway
};
struct CompareOutcome {
  std::string table;
  int regressions = 0;
  int untestable = 0;  // points whose repetitions are too few to ever reach p < alpha
};
CompareOutcome compare_files(const ResultFile& base, const ResultFile& next, const CompareOptions& o);
int cmd_compare(const std::string& base, const std::string& next, const CompareOptions& o);

// Joins files; the same point in two files, or files from different CPU models (unless
// allowed), is refused.
nlohmann::json merge_files(const std::vector<ResultFile>& files, bool allow_mixed_cpus, const std::string& command);
int cmd_merge(const std::vector<std::string>& paths, const std::string& out, bool allow_mixed_cpus,
              const std::string& command);

}  // namespace ab
