// attnbench table: comparison tables from result files (rows mechanisms, columns N).
#include <memory>

#include "bench/results/table.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct TableVerbOptions {
  std::vector<std::string> files;
  TableOptions table;
};

VerbMain add_table(CLI::App& app, SharedOptions&) {
  auto o = std::make_shared<TableVerbOptions>();
  TableOptions& t = o->table;
  app.add_option("files", o->files, "result files")->required();
  app.add_option("--metric", t.metric, "time | cpu_time | " + table_metric_names())->capture_default_str();
  auto* baseline = app.add_option("--baseline", t.baseline, "mechanism the ratios are taken against ('none' for no ratios)")
                       ->capture_default_str();
  app.add_option("--format", t.format, "md | csv | latex")->capture_default_str();
  app.add_option("--published", t.published,
                 "with --metric accuracy: 'lra' draws LRA Table 1's layout (a row per mechanism, LRA's five tasks, "
                 "'not run' where there is no run), its published row under each mechanism's, and the rank "
                 "correlation per task");
  app.add_flag("--growth", t.growth,
               "in brackets: each value over the same row's value at the previous N (how a time grows with N), "
               "instead of the ratio to --baseline")
      ->excludes(baseline);
  app.add_option("--filter", t.filter, "only the points whose name this regular expression matches");
  return [o](const std::string&) { return cmd_table(o->files, o->table); };
}

}  // namespace

Verb table_verb() {
  return {"table", "comparison tables from result files: rows mechanisms, columns N",
          {"attnbench table sweep.json --metric time --baseline flash", "attnbench table sweep.json --metric memory --format csv",
           "attnbench table lra.json --metric accuracy --published lra"},
          add_table};
}

}  // namespace ab
