#include "bench/results/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

#include "bench/results/stats.hpp"

namespace ab {

namespace {
// One point's line of the comparison.
struct CompareRow {
  std::string name, base, next, change, p, verdict;
};
std::string percent_change(double c) { return fmt::format("{:+.1f}%", 100 * c); }

// Each metric's comparison of a point both files hold (OK in both): fills the row, returns
// whether it regressed.

// A training run's test accuracy: deterministic for a seed and thread count, so a plain
// threshold on the drop (absolute, in accuracy units: 0.01 is one percentage point).
bool compare_accuracy(const PointResult& b, const PointResult& n, const CompareOptions& o, CompareRow& row) {
  if (!b.train) {
    row.verdict = "not a training run in base";
    return false;
  }
  if (!n.train) {
    row.verdict = "REGRESSION: no accuracy";
    return true;
  }
  const double drop = b.train->accuracy - n.train->accuracy;
  row.base = fmt::format("{:.2f}%", 100 * b.train->accuracy);
  row.next = fmt::format("{:.2f}%", 100 * n.train->accuracy);
  row.change = fmt::format("{:+.2f} pt", -100 * drop);
  const bool regression = drop > o.max_regress;
  row.verdict = regression ? "REGRESSION: less accurate" : drop < -o.max_regress ? "more accurate" : "same";
  return regression;
}

// Counted instructions: deterministic, a plain threshold.
bool compare_instructions(const PointResult& b, const PointResult& n, const CompareOptions& o, CompareRow& row) {
  if (!b.instructions) {
    row.verdict = "not counted in base";
    return false;
  }
  if (!n.instructions) {
    row.verdict = "REGRESSION: no instruction count";
    return true;
  }
  const double c = *n.instructions / *b.instructions - 1;
  row.base = fmt::format("{:.0f}", *b.instructions);
  row.next = fmt::format("{:.0f}", *n.instructions);
  row.change = percent_change(c);
  const bool regression = c > o.max_regress;
  row.verdict = regression ? "REGRESSION: more instructions" : c < -o.max_regress ? "fewer" : "same";
  return regression;
}

// Time (a one-sided Mann-Whitney test over the repetitions, beyond the threshold) and, with it
// or alone, tracked memory (deterministic: a plain threshold).
bool compare_time_and_memory(const PointResult& b, const PointResult& n, const CompareOptions& o, const ResultFile& base,
                             const ResultFile& next, CompareRow& row, CompareOutcome& out) {
  std::vector<std::string> verdicts;
  bool regression = false;
  if (o.metric == "time") {
    // --per-gemm: a time times the GEMM rate (per thread, on the point's threads) measured in
    // the same run is the GFLOP oneDNN's GEMM would have done meanwhile. A machine that is
    // uniformly slower today (a busy host, a lower clock) cancels out; a slower kernel does not.
    const double scale_b = o.per_gemm ? b.gemm_gflops : 1, scale_n = o.per_gemm ? n.gemm_gflops : 1;
    if (o.per_gemm && !(scale_b > 0 && scale_n > 0))
      throw InvalidInput(fmt::format("--per-gemm: {} has no GEMM rate in {}", row.name, scale_b > 0 ? next.path : base.path));
    std::vector<double> a, bb;
    for (const auto& rep : b.reps) a.push_back(rep.real_s * scale_b);
    for (const auto& rep : n.reps) bb.push_back(rep.real_s * scale_n);
    const MannWhitney mw = mann_whitney(a, bb);
    const double mb = real_stats(b).median * scale_b, mn = real_stats(n).median * scale_n;
    const double c = mn / mb - 1;
    row.base = o.per_gemm ? fmt::format("{:.4g} GEMM GFLOP", mb) : fmt::format("{:.4g} ms", mb * 1e3);
    row.next = o.per_gemm ? fmt::format("{:.4g} GEMM GFLOP", mn) : fmt::format("{:.4g} ms", mn * 1e3);
    row.change = percent_change(c);
    row.p = fmt::format("{:.3g}", std::min(mw.p_greater, mw.p_less));
    if (mw.min_p >= o.alpha) {
      verdicts.push_back(fmt::format("untestable: {} and {} repetitions cannot reach p < {}", a.size(), bb.size(), o.alpha));
      ++out.untestable;
    } else if (c > o.max_regress && mw.p_greater < o.alpha) {
      regression = true;
      verdicts.push_back("REGRESSION: slower");
    } else if (c < -o.max_regress && mw.p_less < o.alpha) {
      verdicts.push_back("faster");
    }
  }
  const double pb = static_cast<double>(b.peak_bytes), pn = static_cast<double>(n.peak_bytes);
  const double cm = pb > 0 ? pn / pb - 1 : (pn > 0 ? 1.0 : 0.0);
  if (o.metric == "memory") {
    row.base = fmt::format("{:.1f} MiB", pb / (1 << 20));
    row.next = fmt::format("{:.1f} MiB", pn / (1 << 20));
    row.change = percent_change(cm);
  }
  if (cm > o.max_regress) {
    regression = true;
    verdicts.push_back(fmt::format("REGRESSION: memory {}", percent_change(cm)));
  } else if (o.metric == "memory" && cm < -o.max_regress) {
    verdicts.push_back("smaller");
  }
  if (verdicts.empty()) verdicts.push_back("same");
  for (size_t i = 0; i < verdicts.size(); ++i) row.verdict += (i ? "; " : "") + verdicts[i];
  return regression;
}

// The rows as csv, or as markdown whose shared name segments go to a title line (a name of 15
// segments would not fit a terminal).
std::string render_compare(const std::vector<CompareRow>& rows, const CompareOptions& o) {
  const std::string base_h = o.metric == "instructions" ? "base instructions" : "base",
                    new_h = o.metric == "instructions" ? "new instructions" : "new";
  std::string table;
  if (o.format == "csv") {
    table = fmt::format("point,{},{},change,p,verdict\n", base_h, new_h);
    for (const auto& r : rows) table += fmt::format("{},{},{},{},{},{}\n", r.name, r.base, r.next, r.change, r.p, r.verdict);
    return table;
  }
  std::vector<std::string> names;
  for (const auto& r : rows) names.push_back(r.name);
  std::string common;
  if (o.short_names) {
    ShortNames sn = short_point_names(names);
    common = std::move(sn.shared);
    names = std::move(sn.names);
  }
  table = common.empty() ? "" : "every point: " + common + "\n\n";
  table += fmt::format("| point | {} | {} | change | p | verdict |\n|---|---:|---:|---:|---:|---|\n", base_h, new_h);
  for (size_t i = 0; i < rows.size(); ++i) {
    const CompareRow& r = rows[i];
    table += fmt::format("| {} | {} | {} | {} | {} | {} |\n", names[i], r.base, r.next, r.change, r.p, r.verdict);
  }
  return table;
}
}  // namespace

CompareOutcome compare_files(const ResultFile& base, const ResultFile& next, const CompareOptions& o) {
  if (o.metric != "time" && o.metric != "instructions" && o.metric != "memory" && o.metric != "accuracy")
    throw unknown_name("--metric for compare", o.metric, {"time", "instructions", "memory", "accuracy"}, "metrics");
  if (!(o.max_regress >= 0)) throw InvalidInput("--max-regress must be >= 0");
  if (o.per_gemm && o.metric != "time") throw InvalidInput("--per-gemm applies to --metric time only");
  if (!(o.alpha > 0 && o.alpha < 1)) throw InvalidInput("--alpha must be in (0, 1)");
  if (o.format != "md" && o.format != "csv") throw InvalidInput(fmt::format("unknown format '{}'; formats: md, csv", o.format));
  std::map<std::string, const PointResult*> in_next;
  for (const auto& r : next.points) in_next[r.id.name()] = &r;
  std::vector<CompareRow> rows;
  CompareOutcome out;
  size_t common = 0;
  std::set<std::string> base_names;
  for (const auto& b : base.points) {
    CompareRow row{b.id.name(), "", "", "", "", ""};
    base_names.insert(row.name);
    const auto it = in_next.find(row.name);
    if (it == in_next.end()) {
      row.verdict = "missing in new";
      ++out.missing;
      rows.push_back(row);
      continue;
    }
    ++common;
    const PointResult& n = *it->second;
    bool regression = false;
    if (b.status != Status::OK || n.status != Status::OK) {
      row.base = to_string(b.status);
      row.next = to_string(n.status);
      regression = b.status == Status::OK;
      row.verdict = regression                ? fmt::format("REGRESSION: now {}", to_string(n.status))
                    : n.status == Status::OK ? "fixed"
                                             : "both failed";
    } else if (o.metric == "accuracy") {
      regression = compare_accuracy(b, n, o, row);
    } else if (o.metric == "instructions") {
      regression = compare_instructions(b, n, o, row);
    } else {
      regression = compare_time_and_memory(b, n, o, base, next, row, out);
    }
    out.regressions += regression ? 1 : 0;
    rows.push_back(row);
  }
  for (const auto& r : next.points)
    if (!base_names.count(r.id.name())) rows.push_back(CompareRow{r.id.name(), "", to_string(r.status), "", "", "new"});
  if (common == 0)
    throw InvalidInput(fmt::format("{} and {} have no point in common (points are joined by name)", base.path, next.path));
  out.table = render_compare(rows, o);
  return out;
}

int cmd_compare(const std::string& base, const std::string& next, const CompareOptions& o) {
  std::vector<ResultFile> files = read_result_files({base, next});
  filter_result_files(files, o.filter);
  require_points(files);
  const ResultFile &bf = files[0], &nf = files[1];
  // A gate on instruction counts whose base has none would pass everything: an input error.
  if (o.metric == "instructions" &&
      std::none_of(bf.points.begin(), bf.points.end(), [](const PointResult& r) { return r.instructions.has_value(); }))
    throw InvalidInput(fmt::format("{} has no instruction counts (run it with --instructions) to compare against", base));
  // Bad options and files without a common point are input errors (exit 2) whatever the machines.
  const CompareOutcome c = compare_files(bf, nf, o);
  // Wall times from two machines measure the machines: such a pair is refused (exit 3, so a gate
  // can look for the baseline of its own machine), and so is a file that does not say its machine
  // (older than machine_id): comparing it would report the machine as a regression.
  const auto machine_of = [](const ResultFile& f) {
    const auto it = f.context.find("machine_id");
    return it != f.context.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const std::string bm = machine_of(bf), nm = machine_of(nf);
  if (o.metric == "time" && !o.any_machine && (bm.empty() || nm.empty())) {
    std::cerr << fmt::format("compare: {} does not name its machine (no machine_id: written before attnbench recorded "
                             "it); wall times of an unknown machine are not comparable (--any-machine compares them "
                             "anyway)\n",
                             bm.empty() ? base : next);
    return 3;
  }
  if (o.metric == "time" && !o.any_machine && bm != nm) {
    std::cerr << fmt::format("compare: {} was measured on {} and {} on {}: wall times from different machines are not "
                             "comparable (--any-machine compares them anyway; instructions and memory do not depend "
                             "on the machine)\n",
                             base, bm, next, nm);
    return 3;
  }
  if (o.per_gemm) {
    const auto rate = [](const ResultFile& f) { return f.context.value("gemm_gflops_per_s_1thread", 0.0); };
    std::cerr << fmt::format("compare: times in units of each run's own GEMM rate (1 thread: {:.1f} GFLOP/s in {}, "
                             "{:.1f} GFLOP/s in {})\n", rate(bf), base, rate(nf), next);
  }
  std::cout << c.table;
  std::cerr << fmt::format("compare ({}, max regression {:.0f}%{}): {}\n", o.metric, 100 * o.max_regress,
                           o.metric == "time" ? fmt::format(", alpha {}", o.alpha) : "",
                           c.regressions ? fmt::format("{} regression(s)", c.regressions) : "no regression");
  // A base point the new file lacks is not gated: a gate must not lose a point silently.
  if (c.missing)
    std::cerr << fmt::format("compare: warning: {} point(s) of {} are missing in {} and were not compared (the "
                             "table's 'missing in new' rows)\n", c.missing, base, next);
  if (c.untestable)
    std::cerr << fmt::format("compare: warning: {} point(s) have too few repetitions for the test to detect anything; "
                             "run them with more --reps (5 against 5 reach p = 0.004)\n", c.untestable);
  return c.regressions ? 1 : 0;
}

}  // namespace ab
