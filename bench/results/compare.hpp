// `attnbench compare`: the regression gate. Two result files joined point by point by name;
// wall times judged with a Mann-Whitney U test, instruction counts and tracked memory with a
// plain threshold.
#pragma once
#include <string>

#include "bench/results/result_reader.hpp"

namespace ab {

struct CompareOptions {
  std::string metric = "time";  // time | instructions | memory
  double max_regress = 0.05;
  double alpha = 0.05;
  std::string format = "md";
  bool any_machine = false;  // time: compare files measured on different machines anyway
  bool per_gemm = false;     // time: each file's times in units of the GEMM rate its own run measured
  bool short_names = false;  // md: the segments every point shares on a title line, not in each row
  std::string filter;        // only the points whose name this regular expression matches
};
struct CompareOutcome {
  std::string table;
  int regressions = 0;
  int untestable = 0;  // points whose repetitions are too few to ever reach p < alpha
  int missing = 0;     // points of the base that the new file lacks: not compared
};
CompareOutcome compare_files(const ResultFile& base, const ResultFile& next, const CompareOptions& o);
int cmd_compare(const std::string& base, const std::string& next, const CompareOptions& o);

}  // namespace ab
