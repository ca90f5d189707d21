// attnbench report: result files as one self-contained HTML page.
#include <memory>

#include "bench/results/report.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct ReportVerbOptions {
  std::vector<std::string> files;
  ReportOptions report;
  bool no_plots = false;
};

VerbMain add_report(CLI::App& app, SharedOptions&) {
  auto o = std::make_shared<ReportVerbOptions>();
  ReportOptions& r = o->report;
  app.add_option("files", o->files, "result files")->required();
  app.add_option("--out", r.out_dir, "the directory the page goes to (DIR/index.html; made if missing)")->required();
  app.add_option("--image", r.images, "a further PNG to embed (learning curves, a frontier); repeatable");
  app.add_option("--title", r.title, "the page's title")->capture_default_str();
  app.add_flag("--no-plots", o->no_plots, "leave out the plots (they need /usr/bin/python3 with matplotlib)");
  app.add_flag("--force", r.force, "replace DIR/index.html when it exists");
  return [o](const std::string&) {
    o->report.plots = !o->no_plots;
    return cmd_report(o->files, o->report);
  };
}

}  // namespace

Verb report_verb() {
  return {"report", "result files as one self-contained HTML page: machine, tables, plots, every point's command; sortable tables, no network",
          {"attnbench report results/main/default_sweep.json --out report/",
           "attnbench report sweep.json lra.json --image curves.png --title 'LRA on this machine' --out report/ --force"},
          add_report};
}

}  // namespace ab
