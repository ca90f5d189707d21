// attnbench history add | report: results across commits in a SQLite store.
#include <memory>

#include "bench/results/history.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct HistoryVerbOptions {
  std::vector<std::string> files;
  HistoryOptions history;
};

VerbMain add_history(CLI::App& app, SharedOptions&) {
  auto o = std::make_shared<HistoryVerbOptions>();
  HistoryOptions& h = o->history;
  app.require_subcommand(1);
  auto* add = app.add_subcommand("add", "append result files to the history (a file already there is recorded once)");
  add->add_option("files", o->files, "result files")->required();
  add->add_option("--db", h.db, "the history's SQLite file (made if missing)")->capture_default_str();
  set_examples(*add, {"attnbench history add results/ci/new.json --db history.db"});
  auto* report = app.add_subcommand("report", "one HTML page: per machine, each point's median time against the runs, the "
                                              "regressions marked");
  report->add_option("--db", h.db, "the history's SQLite file")->capture_default_str();
  report->add_option("--out", h.out_dir, "the directory the page goes to (DIR/index.html)")->required();
  report->add_option("--max-regress", h.max_regress, "slowdown a regression must exceed (0.05 = 5%)")->capture_default_str();
  report->add_option("--alpha", h.alpha, "significance level of the Mann-Whitney U test")->capture_default_str();
  report->add_flag("--force", h.force, "replace DIR/index.html when it exists");
  set_examples(*report, {"attnbench history report --db history.db --out history/ --force"});
  return [o, add](const std::string&) { return add->parsed() ? cmd_history_add(o->files, o->history) : cmd_history_report(o->history); };
}

}  // namespace

Verb history_verb() {
  return {"history", "results across commits: a SQLite store of result files, and a page of each point's time against the runs",
          {"attnbench history add results/ci/new.json --db history.db", "attnbench history report --db history.db --out history/"},
          add_history};
}

}  // namespace ab
