// `attnbench export`: result files in a long, flat form for spreadsheets, pandas and SQL: one
// row per entry of the file (each repetition of each point, and the aggregates Google Benchmark
// writes, told apart by run_type), every field, numbers at full precision.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ab {

struct ExportOptions {
  std::string format = "csv";  // csv | jsonl | sql
  std::string out;             // "" or "-": stdout
  std::string filter;          // only the points whose name this regular expression matches
  bool force = false;          // overwrite an existing --out
};

// The export's columns: "file" and the context's machine_id, git_commit, cpu_model and
// date, then every key of the entries (nested objects flattened with dots: point.seq,
// point.params.block; arrays as JSON text), in a fixed order (name and timing first, then the
// rest sorted). A cell is the value as JSON writes it (the shortest text that reads back to the
// same double), a string as is, empty when the entry has no such key.
std::string export_files(const std::vector<std::string>& paths, const ExportOptions& o);

// The same table as data (what `history add` stores): the columns in that order, and each
// entry's cells by column (a missing cell absent).
struct LongTable {
  using Row = std::map<std::string, nlohmann::json>;
  std::vector<std::string> columns;
  std::vector<Row> rows;
};
LongTable export_table(const std::vector<std::string>& paths, const std::string& filter = "");
int cmd_export(const std::vector<std::string>& paths, const ExportOptions& o);

}  // namespace ab
