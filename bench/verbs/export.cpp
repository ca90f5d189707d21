// attnbench export: result files as one long table.
#include <memory>

#include "bench/results/export.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct ExportVerbOptions {
  std::vector<std::string> files;
  ExportOptions exporter;
};

VerbMain add_export(CLI::App& app, SharedOptions&) {
  auto o = std::make_shared<ExportVerbOptions>();
  ExportOptions& e = o->exporter;
  app.add_option("files", o->files, "result files")->required();
  app.add_option("--format", e.format, "csv | jsonl | sql (CREATE TABLE and INSERTs, e.g. for sqlite3)")->capture_default_str();
  app.add_option("--out", e.out, "write here instead of stdout");
  app.add_option("--filter", e.filter, "only the points whose name this regular expression matches");
  app.add_flag("--force", e.force, "overwrite --out when it exists");
  return [o](const std::string&) { return cmd_export(o->files, o->exporter); };
}

}  // namespace

Verb export_verb() {
  return {"export", "result files as one long table: a row per repetition, every field, full precision (for spreadsheets, pandas, SQL)",
          {"attnbench export sweep.json --out sweep.csv", "attnbench export sweep.json --format sql | sqlite3 results.db",
           "attnbench export a.json b.json --format jsonl --filter 'attn:flash/'"},
          add_export};
}

}  // namespace ab
