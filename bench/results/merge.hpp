// `attnbench merge`: join result files (the shards of a sweep) into one.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/results/result_reader.hpp"

namespace ab {

// Joins files. A point in two files with the same result is kept once; a point with two
// different results, one file given twice, or files from different CPU models (unless allowed)
// is refused.
nlohmann::json merge_files(const std::vector<ResultFile>& files, bool allow_mixed_cpus, const std::string& command);
int cmd_merge(const std::vector<std::string>& paths, const std::string& out, bool allow_mixed_cpus,
              const std::string& command);

}  // namespace ab
