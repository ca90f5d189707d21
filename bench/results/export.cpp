#include "bench/results/export.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "bench/points/point.hpp"
#include "bench/results/result_reader.hpp"
#include "bench/results/result_writer.hpp"

namespace ab {

namespace {
using Row = LongTable::Row;

// Context fields copied onto every row: which machine and build measured it, and when.
const std::vector<std::string> kContextColumns = {"machine_id", "git_commit", "cpu_model", "date"};
// Entry fields first in every export; the rest follow sorted.
const std::vector<std::string> kLeadColumns = {"name",      "run_name",  "run_type",  "aggregate_name", "repetition_index",
                                               "real_time", "cpu_time",  "time_unit", "iterations"};

void flatten(const nlohmann::json& j, const std::string& prefix, Row& row) {
  for (const auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object() && !v.empty()) flatten(v, key, row);
    else if (v.is_object()) row[key] = "";  // an empty object (a mechanism without parameters)
    else row[key] = v;
  }
}

std::string cell_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array() || v.is_object()) return v.dump();
  return v.dump();  // numbers: the shortest round-trip text; true/false
}

std::string csv_quote(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// SQL text literals ('...', quotes doubled) and identifiers ("...", double quotes doubled) hold
// every byte but NUL, which ends a string for sqlite3 and is refused by other databases: a field
// holding one is refused, naming it, rather than written as SQL that does not load.
std::string sql_quoted(const std::string& s, char quote, const std::string& what) {
  if (s.find('\0') != std::string::npos)
    throw InvalidInput(fmt::format("export --format sql: {} holds a NUL byte, which SQL text cannot hold; export it as "
                                   "csv or jsonl",
                                   what));
  std::string q(1, quote);
  for (char c : s) q += c == quote ? std::string(2, c) : std::string(1, c);
  return q + quote;
}
}  // namespace

LongTable export_table(const std::vector<std::string>& paths, const std::string& filter) {
  const NameFilter keep(filter);
  LongTable t;
  std::set<std::string> keys;
  for (const auto& path : paths) {
    read_result_file(path);  // a file that is not a result file is refused (exit 2) before anything is written
    std::ifstream in(path, std::ios::binary);
    const nlohmann::json doc = nlohmann::json::parse(in);
    // A file without a context (table and compare read it too) has no context columns.
    const nlohmann::json ctx = doc.contains("context") ? doc.at("context") : nlohmann::json::object();
    for (const auto& entry : doc.at("benchmarks")) {
      // Aggregate entries are not checked by the reader (it derives them): read their name warily.
      std::string name;
      for (const char* key : {"run_name", "name"})
        if (name.empty() && entry.contains(key) && entry.at(key).is_string()) name = entry.at(key).get<std::string>();
      if (!keep(name)) continue;
      LongTable::Row row;
      flatten(entry, "", row);
      for (const auto& [k, v] : row) keys.insert(k);
      row["file"] = path;
      for (const auto& c : kContextColumns)
        if (ctx.contains(c)) row[c] = ctx[c];
      t.rows.push_back(std::move(row));
    }
  }
  if (t.rows.empty() && !filter.empty()) throw InvalidInput(fmt::format("--filter '{}' matches no point", filter));
  t.columns = {"file"};
  for (const auto& c : kContextColumns) t.columns.push_back(c);
  for (const auto& c : kLeadColumns)
    if (keys.erase(c)) t.columns.push_back(c);
  for (const auto& c : keys)
    if (std::find(t.columns.begin(), t.columns.end(), c) == t.columns.end()) t.columns.push_back(c);
  return t;
}

std::string export_files(const std::vector<std::string>& paths, const ExportOptions& o) {
  if (o.format != "csv" && o.format != "jsonl" && o.format != "sql")
    throw unknown_name("--format for export", o.format, {"csv", "jsonl", "sql"}, "formats");
  const LongTable t = export_table(paths, o.filter);
  const auto& columns = t.columns;
  const auto& rows = t.rows;
  std::string out;
  if (o.format == "csv") {
    for (size_t i = 0; i < columns.size(); ++i) out += (i ? "," : "") + csv_quote(columns[i]);
    out += "\n";
    for (const auto& row : rows) {
      for (size_t i = 0; i < columns.size(); ++i) {
        const auto it = row.find(columns[i]);
        out += (i ? "," : "") + (it == row.end() ? std::string() : csv_quote(cell_text(it->second)));
      }
      out += "\n";
    }
  } else if (o.format == "jsonl") {
    for (const auto& row : rows) {
      nlohmann::ordered_json j;
      for (const auto& c : columns) {
        const auto it = row.find(c);
        if (it != row.end()) j[c] = it->second;
      }
      out += j.dump() + "\n";
    }
  } else {  // sql: what sqlite3 (or any SQL database) reads: `attnbench export --format sql F | sqlite3 r.db`
    std::map<std::string, bool> numeric;
    for (const auto& c : columns) {
      bool all_numbers = true;
      for (const auto& row : rows) {
        const auto it = row.find(c);
        if (it != row.end() && !it->second.is_number() && !it->second.is_boolean()) all_numbers = false;
      }
      numeric[c] = all_numbers;
    }
    out += "CREATE TABLE IF NOT EXISTS results (";
    for (size_t i = 0; i < columns.size(); ++i)
      out += fmt::format("{}{} {}", i ? ", " : "", sql_quoted(columns[i], '"', fmt::format("the field name '{}'", columns[i])),
                         numeric[columns[i]] ? "REAL" : "TEXT");
    out += ");\nBEGIN TRANSACTION;\n";
    for (const auto& row : rows) {
      out += "INSERT INTO results VALUES (";
      for (size_t i = 0; i < columns.size(); ++i) {
        const auto it = row.find(columns[i]);
        std::string v = "NULL";
        if (it != row.end()) {
          if (it->second.is_boolean()) v = it->second.get<bool>() ? "1" : "0";
          else if (numeric[columns[i]]) v = cell_text(it->second);
          else v = sql_quoted(cell_text(it->second), '\'', fmt::format("field '{}' of a row of {}", columns[i],
                                                                           row.at("file").get<std::string>()));
        }
        out += (i ? ", " : "") + v;
      }
      out += ");\n";
    }
    out += "COMMIT;\n";
  }
  return out;
}

int cmd_export(const std::vector<std::string>& paths, const ExportOptions& o) {
  const bool to_stdout = o.out.empty() || o.out == "-";
  if (!to_stdout) {
    refuse_overwriting_inputs(o.out, paths);
    prepare_output_path(o.out, o.force);
  }
  const std::string text = export_files(paths, o);
  if (to_stdout) std::cout << text;
  else write_file_atomic(o.out, text);
  return 0;
}

}  // namespace ab
