// Reading result files back: `table`, `compare`, `merge` and `sweep --resume` all start here.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/results/result.hpp"

namespace ab {

struct ResultFile {
  std::string path;
  nlohmann::json context;
  std::vector<PointResult> points;  // one per distinct point name, in file order
};

// Parses a Google-Benchmark-format file written by attnbench. A missing, truncated or malformed
// file, or an entry without the fields of a point, throws InvalidInput naming the file and the
// entry; nothing is returned partially.
ResultFile read_result_file(const std::string& path);
std::vector<ResultFile> read_result_files(const std::vector<std::string>& paths);

// --filter on files: keeps the points whose name matches `regex` (point.hpp NameFilter) in each
// file. InvalidInput when a non-empty filter leaves no point in any of them.
// An empty result file is an error for the verbs that compare points (table, compare).
void require_points(const std::vector<ResultFile>& files);

void filter_result_files(std::vector<ResultFile>& files, const std::string& regex);
ResultFile parse_result_document(const nlohmann::json& doc, const std::string& path);

// The error message of a failed point begins with its status word.
Status parse_status(const std::string& error_message, std::string* rest);

}  // namespace ab
