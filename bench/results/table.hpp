// `attnbench table`: result files as comparison tables (rows mechanisms, columns N), in the
// LRA efficiency table's cell layout "value (ratio)".
#pragma once
#include <string>
#include <vector>

#include "bench/results/result_reader.hpp"

namespace ab {

struct TableOptions {
  std::string metric = "time";
  std::string baseline = "vanilla";
  std::string format = "md";  // md | csv | latex
  bool growth = false;        // ratios to the same row's previous N instead of to `baseline`
  std::string published;      // accuracy metrics: "lra" prints LRA Table 1's rows beside ours
  std::string filter;         // only the points whose name this regular expression matches
};
std::string table_metric_names();  // the metric names `--metric` accepts, for --help
// One table per group of points (equal in the point schema's grouping fields: level, mode, task,
// every size but N, causal, threads): rows mechanisms, columns N, cells "value (ratio)" where the
// ratio says how many times better than the baseline the value is (baseline/value for time and
// memory, value/baseline for rates); with `growth`, the value over the row's value at the
// previous N instead.
std::string make_table(const std::vector<ResultFile>& files, const TableOptions& o);
int cmd_table(const std::vector<std::string>& paths, const TableOptions& o);

}  // namespace ab
