// attnbench compare: the regression gate.
#include <memory>

#include "bench/results/compare.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct CompareVerbOptions {
  std::string base, fresh;
  CompareOptions compare;
  bool wide = false;
};

VerbMain add_compare(CLI::App& app, SharedOptions&) {
  auto o = std::make_shared<CompareVerbOptions>();
  CompareOptions& c = o->compare;
  app.add_option("base", o->base, "the baseline result file")->required();
  app.add_option("new", o->fresh, "the result file to judge")->required();
  app.add_option("--metric", c.metric,
                 "time (real time and tracked memory) | instructions | memory | accuracy (training runs' test "
                 "accuracy)")
      ->capture_default_str();
  app.add_option("--max-regress", c.max_regress,
                 "worsening tolerated: relative (0.05 = 5%), or for accuracy the drop (0.01 = one point)")
      ->capture_default_str();
  app.add_option("--alpha", c.alpha, "significance level of the Mann-Whitney U test")->capture_default_str();
  app.add_option("--format", c.format, "md | csv")->capture_default_str();
  app.add_flag("--wide", o->wide, "every point's whole name in its row");
  app.add_flag("--any-machine", c.any_machine, "compare wall times measured on different machines (exit 3 without it)");
  app.add_flag("--per-gemm", c.per_gemm,
               "time: each file's times in units of the GEMM rate measured in its own run (a uniformly slower "
               "machine cancels out)");
  app.add_option("--filter", c.filter, "only the points whose name this regular expression matches");
  return [o](const std::string&) {
    o->compare.short_names = !o->wide;
    return cmd_compare(o->base, o->fresh, o->compare);
  };
}

}  // namespace

Verb compare_verb() {
  return {"compare", "the regression gate: exit 1 when NEW is significantly worse than BASE",
          {"attnbench compare base.json new.json", "attnbench compare base.json new.json --metric instructions --max-regress 0.01",
           "attnbench compare base.json new.json --metric accuracy --max-regress 0.01"},
          add_compare};
}

}  // namespace ab
