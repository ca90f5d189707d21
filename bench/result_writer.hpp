// Writing results: Google Benchmark's JSON format (one entry per repetition plus the median,
// mean, stddev and cv aggregates), and `run`'s markdown and CSV tables.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/result.hpp"

namespace ab {

nlohmann::json to_json_entries(const PointResult& r, int family_index);
nlohmann::json results_document(const nlohmann::json& context, const std::vector<PointResult>& rs);

// `width` > 0: fitted to that many columns (bench/text_table.hpp), 0: every column in full.
std::string to_markdown(const std::vector<PointResult>& rs, int width = 0);
std::string to_csv(const std::vector<PointResult>& rs);

// Writes through a temporary file and a rename, so the destination is never partial.
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace ab
