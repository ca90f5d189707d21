#include "bench/analysis.hpp"

#include "model/transformer.hpp"  // layer_type_names

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

#include "attention_impls/registry.hpp"
#include "bench/stats.hpp"

namespace ab {

namespace {

// ---- metrics: timing plus every result Field, under one name each ----
struct Metric {
  std::string name, unit;
  Better better = Better::Lower;
  const Field* field = nullptr;  // nullptr: a time statistic
  bool cpu = false;
  std::optional<double> value(const PointResult& r) const {
    if (r.status != Status::OK) return std::nullopt;
    const double t = real_stats(r).median;
    if (!field) return (cpu ? cpu_stats(r).median : t) * 1e3;
    return field->value(r, t, nullptr);
  }
  std::string format(double v) const {
    if (field) return field->format(v);
    if (v >= 100) return fmt::format("{:.0f}", v);
    if (v >= 10) return fmt::format("{:.1f}", v);
    if (v >= 1) return fmt::format("{:.2f}", v);
    return fmt::format("{:.3g}", v);
  }
};

const std::map<std::string, std::string>& metric_aliases() {
  static const std::map<std::string, std::string> a = {
      {"gflops", "gflops_per_s"}, {"tokens", "tokens_per_s"}, {"steps", "steps_per_s"},
      {"memory", "peak_bytes"},   {"rss", "peak_rss_bytes"},  {"peak", "peak_fraction"}};
  return a;
}

Metric find_metric(const std::string& name) {
  if (name == "time" || name == "real_time") return Metric{"time", "median ms", Better::Lower, nullptr, false};
  if (name == "cpu_time") return Metric{"cpu_time", "median process CPU ms", Better::Lower, nullptr, true};
  const auto it = metric_aliases().find(name);
  const std::string key = it == metric_aliases().end() ? name : it->second;
  if (const Field* f = find_field(key)) return Metric{f->key, f->header, f->better, f, false};
  throw InvalidInput(fmt::format("unknown metric '{}'; metrics: time, cpu_time, {}", name, table_metric_names()));
}

std::string group_key(const PointId& id) {
  const std::string model =
      id.level == "model" ? fmt::format(" · L={} d_model={} mlp={}", id.model.layers, id.model.dmodel, id.model.mlp) : "";
  return fmt::format("level {} · mode {} · task {}{} · B={} H={} D={} · {} · {} thread{}", id.level, to_string(id.mode),
                     id.task, model, id.shape.B, id.shape.H, id.shape.D, id.causal ? "causal" : "non-causal", id.threads,
                     id.threads == 1 ? "" : "s");
}

std::string params_text(const PointId& id) {
  std::string s;
  for (const auto& [k, v] : id.params.items()) s += (s.empty() ? "" : " ") + k + "=" + format_param_value(v);
  return s;
}

std::string ratio_text(double r) {
  if (r >= 10) return fmt::format("{:.0f}x", r);
  if (r >= 0.1) return fmt::format("{:.1f}x", r);
  return fmt::format("{:.2f}x", r);
}

struct Cell {
  std::string text;               // value and ratio, or the status word
  std::string value_text;         // the value alone, formatted
  std::optional<double> value, ratio;
  std::string ratio_text;         // the ratio alone, formatted ("4.6x")
  void set_ratio(double r, std::string formatted) {
    ratio = r;
    ratio_text = std::move(formatted);
    text += " (" + ratio_text + ")";
  }
};

struct Table {
  std::string title;
  std::vector<int64_t> ns;
  std::vector<std::string> rows;
  std::map<std::pair<std::string, int64_t>, Cell> cells;
  std::vector<std::string> notes;  // failed points with their reasons
};

std::vector<Table> build_tables(const std::vector<ResultFile>& files, const TableOptions& o) {
  const Metric m = find_metric(o.metric);
  if (o.baseline != "none") find_mechanism(o.baseline);  // an unknown name is an error, not an empty column
  std::vector<const PointResult*> all;
  std::set<std::string> seen;
  for (const auto& f : files)
    for (const auto& r : f.points) {
      if (!seen.insert(r.id.name()).second)
        throw InvalidInput(fmt::format("point {} is in more than one file; merge them first or pass one", r.id.name()));
      all.push_back(&r);
    }
  std::vector<std::string> group_order;
  std::map<std::string, std::vector<const PointResult*>> groups;
  for (const auto* r : all) {
    const std::string g = group_key(r->id);
    if (!groups.count(g)) group_order.push_back(g);
    groups[g].push_back(r);
  }
  std::vector<Table> tables;
  for (const auto& g : group_order) {
    const auto& pts = groups[g];
    Table t;
    // A mechanism measured with several parameter values gets one row per value.
    std::map<std::string, std::set<std::string>> variants;
    for (const auto* r : pts) variants[r->id.mechanism].insert(params_text(r->id));
    auto row_of = [&](const PointResult& r) {
      return variants[r.id.mechanism].size() > 1 ? r.id.mechanism + " " + params_text(r.id) : r.id.mechanism;
    };
    std::set<int64_t> ns;
    for (const auto* r : pts) {
      ns.insert(r->id.shape.N);
      const std::string row = row_of(*r);
      if (std::find(t.rows.begin(), t.rows.end(), row) == t.rows.end()) t.rows.push_back(row);
    }
    t.ns.assign(ns.begin(), ns.end());
    std::map<int64_t, double> base;
    for (const auto* r : pts)
      if (r->id.mechanism == o.baseline && !base.count(r->id.shape.N))
        if (auto v = m.value(*r)) base[r->id.shape.N] = *v;
    for (const auto* r : pts) {
      Cell c;
      if (r->status != Status::OK) {
        c.text = to_string(r->status);
        t.notes.push_back(fmt::format("{} N={}: {}: {}", row_of(*r), r->id.shape.N, to_string(r->status), r->message));
      } else if (auto v = m.value(*r)) {
        c.value = v;
        c.text = c.value_text = m.format(*v);
        const auto b = base.find(r->id.shape.N);
        if (!o.growth && m.better != Better::Neither && b != base.end() && *v > 0 && b->second > 0) {
          const double r = m.better == Better::Lower ? b->second / *v : *v / b->second;
          c.set_ratio(r, ratio_text(r));
        }
      } else {
        c.text = "-";
      }
      t.cells[{row_of(*r), r->id.shape.N}] = c;
    }
    // --growth: each value over the same row's value at the previous N (for a time, how many
    // times longer the longer sequence takes), two decimals: growth targets sit close to 4x.
    if (o.growth)
      for (const auto& row : t.rows)
        for (size_t i = 1; i < t.ns.size(); ++i) {
          const auto prev = t.cells.find({row, t.ns[i - 1]});
          const auto here = t.cells.find({row, t.ns[i]});
          if (prev == t.cells.end() || here == t.cells.end() || !prev->second.value || !here->second.value ||
              !(*prev->second.value > 0))
            continue;
          const double r = *here->second.value / *prev->second.value;
          here->second.set_ratio(r, fmt::format("{:.2f}x", r));
        }
    t.title = fmt::format("{} ({}{}) · {}", m.name, m.unit,
                          o.growth ? "; in brackets: growth from the previous N (value at N / value there)"
                          : o.baseline == "none" || m.better == Better::Neither
                              ? ""
                              : fmt::format("; in brackets: times better than {}", o.baseline),
                          g);
    tables.push_back(std::move(t));
  }
  return tables;
}

std::string latex_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '_' || ch == '&' || ch == '%' || ch == '#' || ch == '$') o += '\\';
    o += ch;
  }
  return o;
}

std::string render(const std::vector<Table>& tables, const std::string& format) {
  std::string out;
  auto cell = [](const Table& t, const std::string& row, int64_t n) -> const Cell* {
    auto it = t.cells.find({row, n});
    return it == t.cells.end() ? nullptr : &it->second;
  };
  if (format == "csv") {
    std::set<int64_t> all_ns;
    for (const auto& t : tables) all_ns.insert(t.ns.begin(), t.ns.end());
    out += "table,mechanism";
    for (int64_t n : all_ns) out += fmt::format(",N={0},N={0} ratio", n);
    out += "\n";
    for (const auto& t : tables)
      for (const auto& row : t.rows) {
        out += "\"" + t.title + "\"," + row;
        for (int64_t n : all_ns) {
          const Cell* c = cell(t, row, n);
          std::string v, r;
          if (c) v = c->value ? fmt::format("{:.6g}", *c->value) : c->text;
          if (c && c->ratio) r = fmt::format("{:.4g}", *c->ratio);
          out += "," + v + "," + r;
        }
        out += "\n";
      }
    return out;
  }
  for (size_t ti = 0; ti < tables.size(); ++ti) {
    const Table& t = tables[ti];
    if (format == "latex") {
      out += "% " + t.title + "\n\\begin{tabular}{l" + std::string(t.ns.size(), 'r') + "}\n\\toprule\nmechanism";
      for (int64_t n : t.ns) out += fmt::format(" & {}", n);
      out += " \\\\\n\\midrule\n";
      for (const auto& row : t.rows) {
        out += latex_escape(row);
        for (int64_t n : t.ns) {
          const Cell* c = cell(t, row, n);
          std::string text = "--";
          if (c && c->value) text = latex_escape(c->value_text);
          else if (c) text = latex_escape(c->text);
          if (c && c->ratio) {
            const std::string& r = c->ratio_text;
            text += " (" + r.substr(0, r.size() - 1) + "$\\times$)";
          }
          out += " & " + text;
        }
        out += " \\\\\n";
      }
      out += "\\bottomrule\n\\end{tabular}\n";
    } else {
      out += (ti ? "\n" : "") + std::string("**") + t.title + "**\n\n| mechanism |";
      for (int64_t n : t.ns) out += fmt::format(" N={} |", n);
      out += "\n|---|";
      for (size_t i = 0; i < t.ns.size(); ++i) out += "---:|";
      out += "\n";
      for (const auto& row : t.rows) {
        out += "| " + row + " |";
        for (int64_t n : t.ns) {
          const Cell* c = cell(t, row, n);
          out += " " + (c ? c->text : std::string("-")) + " |";
        }
        out += "\n";
      }
      if (!t.notes.empty()) {
        out += "\n";
        for (const auto& n : t.notes) out += "- " + n + "\n";
      }
    }
  }
  return out;
}

std::vector<ResultFile> read_all(const std::vector<std::string>& paths) {
  std::vector<ResultFile> files;
  for (const auto& p : paths) files.push_back(read_result_file(p));
  return files;
}

}  // namespace

std::string table_metric_names() {
  std::string s;
  for (const auto& f : result_fields()) s += (s.empty() ? "" : " | ") + std::string(f.key);
  for (const auto& [alias, key] : metric_aliases()) s += " | " + alias;
  return s;
}

std::string make_table(const std::vector<ResultFile>& files, const TableOptions& o) {
  if (o.format != "md" && o.format != "csv" && o.format != "latex")
    throw InvalidInput(fmt::format("unknown format '{}'; formats: md, csv, latex", o.format));
  return render(build_tables(files, o), o.format);
}

int cmd_table(const std::vector<std::string>& paths, const TableOptions& o) {
  find_metric(o.metric);  // bad options are reported before any file is read
  std::cout << make_table(read_all(paths), o);
  return 0;
}

// ---- compare ----
CompareOutcome compare_files(const ResultFile& base, const ResultFile& next, const CompareOptions& o) {
  if (o.metric != "time" && o.metric != "instructions" && o.metric != "memory")
    throw InvalidInput(fmt::format("unknown --metric '{}' for compare; metrics: time, instructions, memory", o.metric));
  if (!(o.max_regress >= 0)) throw InvalidInput("--max-regress must be >= 0");
  if (!(o.alpha > 0 && o.alpha < 1)) throw InvalidInput("--alpha must be in (0, 1)");
  if (o.format != "md" && o.format != "csv") throw InvalidInput(fmt::format("unknown format '{}'; formats: md, csv", o.format));
  std::map<std::string, const PointResult*> in_next;
  for (const auto& r : next.points) in_next[r.id.name()] = &r;
  struct Row {
    std::string name, base, next, change, p, verdict;
  };
  std::vector<Row> rows;
  CompareOutcome out;
  size_t common = 0;
  auto pct = [](double c) { return fmt::format("{:+.1f}%", 100 * c); };
  std::set<std::string> base_names;
  for (const auto& b : base.points) {
    const std::string name = b.id.name();
    base_names.insert(name);
    const auto it = in_next.find(name);
    Row row{name, "", "", "", "", ""};
    if (it == in_next.end()) {
      row.verdict = "missing in new";
      rows.push_back(row);
      continue;
    }
    ++common;
    const PointResult& n = *it->second;
    bool regression = false;
    if (b.status != Status::OK || n.status != Status::OK) {
      row.base = to_string(b.status);
      row.next = to_string(n.status);
      if (b.status == Status::OK) {
        regression = true;
        row.verdict = fmt::format("REGRESSION: now {}", to_string(n.status));
      } else {
        row.verdict = n.status == Status::OK ? "fixed" : "both failed";
      }
    } else if (o.metric == "instructions") {
      if (!b.instructions) {
        row.verdict = "not counted in base";
      } else if (!n.instructions) {
        regression = true;
        row.verdict = "REGRESSION: no instruction count";
      } else {
        const double c = *n.instructions / *b.instructions - 1;
        row.base = fmt::format("{:.0f}", *b.instructions);
        row.next = fmt::format("{:.0f}", *n.instructions);
        row.change = pct(c);
        regression = c > o.max_regress;
        row.verdict = regression ? "REGRESSION: more instructions" : c < -o.max_regress ? "fewer" : "same";
      }
    } else {
      std::vector<std::string> verdicts;
      if (o.metric == "time") {
        std::vector<double> a, bb;
        for (const auto& rep : b.reps) a.push_back(rep.real_s);
        for (const auto& rep : n.reps) bb.push_back(rep.real_s);
        const MannWhitney mw = mann_whitney(a, bb);
        const double mb = real_stats(b).median, mn = real_stats(n).median;
        const double c = mn / mb - 1;
        row.base = fmt::format("{:.4g} ms", mb * 1e3);
        row.next = fmt::format("{:.4g} ms", mn * 1e3);
        row.change = pct(c);
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
      // Tracked memory is deterministic: a plain threshold, no test.
      const double pb = static_cast<double>(b.peak_bytes), pn = static_cast<double>(n.peak_bytes);
      const double cm = pb > 0 ? pn / pb - 1 : (pn > 0 ? 1.0 : 0.0);
      if (o.metric == "memory") {
        row.base = fmt::format("{:.1f} MiB", pb / (1 << 20));
        row.next = fmt::format("{:.1f} MiB", pn / (1 << 20));
        row.change = pct(cm);
      }
      if (cm > o.max_regress) {
        regression = true;
        verdicts.push_back(fmt::format("REGRESSION: memory {}", pct(cm)));
      } else if (o.metric == "memory" && cm < -o.max_regress) {
        verdicts.push_back("smaller");
      }
      if (verdicts.empty()) verdicts.push_back("same");
      for (size_t i = 0; i < verdicts.size(); ++i) row.verdict += (i ? "; " : "") + verdicts[i];
    }
    out.regressions += regression ? 1 : 0;
    rows.push_back(row);
  }
  for (const auto& r : next.points)
    if (!base_names.count(r.id.name())) rows.push_back(Row{r.id.name(), "", to_string(r.status), "", "", "new"});
  if (common == 0)
    throw InvalidInput(fmt::format("{} and {} have no point in common (points are joined by name)", base.path, next.path));

  const std::string base_h = o.metric == "instructions" ? "base instructions" : "base", new_h = o.metric == "instructions" ? "new instructions" : "new";
  if (o.format == "csv") {
    out.table = fmt::format("point,{},{},change,p,verdict\n", base_h, new_h);
    for (const auto& r : rows)
      out.table += fmt::format("{},{},{},{},{},{}\n", r.name, r.base, r.next, r.change, r.p, r.verdict);
  } else {
    out.table = fmt::format("| point | {} | {} | change | p | verdict |\n|---|---:|---:|---:|---:|---|\n", base_h, new_h);
    for (const auto& r : rows)
      out.table += fmt::format("| {} | {} | {} | {} | {} | {} |\n", r.name, r.base, r.next, r.change, r.p, r.verdict);
  }
  return out;
}

int cmd_compare(const std::string& base, const std::string& next, const CompareOptions& o) {
  const ResultFile bf = read_result_file(base), nf = read_result_file(next);
  // Wall times from two machines measure the machines: such a pair is refused (exit 3, so a gate
  // can look for the baseline of its own machine). Files older than machine_id are compared.
  const std::string bm = bf.context.value("machine_id", ""), nm = nf.context.value("machine_id", "");
  if (o.metric == "time" && !o.any_machine && !bm.empty() && !nm.empty() && bm != nm) {
    std::cerr << fmt::format("compare: {} was measured on {} and {} on {}: wall times from different machines are not "
                             "comparable (--any-machine compares them anyway; instructions and memory do not depend "
                             "on the machine)\n",
                             base, bm, next, nm);
    return 3;
  }
  const CompareOutcome c = compare_files(bf, nf, o);
  std::cout << c.table;
  std::cerr << fmt::format("compare ({}, max regression {:.0f}%{}): {}\n", o.metric, 100 * o.max_regress,
                           o.metric == "time" ? fmt::format(", alpha {}", o.alpha) : "",
                           c.regressions ? fmt::format("{} regression(s)", c.regressions) : "no regression");
  if (c.untestable)
    std::cerr << fmt::format("compare: warning: {} point(s) have too few repetitions for the test to detect anything; "
                             "run them with more --reps (5 against 5 reach p = 0.004)\n", c.untestable);
  return c.regressions ? 1 : 0;
}

// ---- merge ----
nlohmann::json merge_files(const std::vector<ResultFile>& files, bool allow_mixed_cpus, const std::string& command) {
  if (files.empty()) throw InvalidInput("merge needs at least one file");
  const std::string cpu = files.front().context.value("cpu_model", "");
  std::map<std::string, std::string> where;
  std::vector<PointResult> points;
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& f : files) {
    const std::string c = f.context.value("cpu_model", "");
    if (c != cpu && !allow_mixed_cpus)
      throw InvalidInput(fmt::format("{} was measured on '{}' but {} on '{}'; pass --allow-mixed-cpus to merge them anyway",
                                     files.front().path, cpu, f.path, c));
    for (const auto& r : f.points) {
      const auto [it, fresh] = where.emplace(r.id.name(), f.path);
      if (!fresh) throw InvalidInput(fmt::format("point {} is in both {} and {}", r.id.name(), it->second, f.path));
      points.push_back(r);
    }
    sources.push_back({{"path", f.path},
                       {"command", f.context.value("command", "")},
                       {"host_name", f.context.value("host_name", "")},
                       {"cpu_model", c},
                       {"date", f.context.value("date", "")},
                       {"shard", f.context.value("shard", "")}});
  }
  nlohmann::json context = files.front().context;
  context["command"] = command;
  context["merged_from"] = sources;
  context.erase("shard");
  return results_document(context, points);
}

int cmd_merge(const std::vector<std::string>& paths, const std::string& out, bool allow_mixed_cpus,
              const std::string& command) {
  const auto doc = merge_files(read_all(paths), allow_mixed_cpus, command);
  write_file_atomic(out, doc.dump(2) + "\n");
  std::cerr << fmt::format("merge: {} files into {}\n", paths.size(), out);
  return 0;
}

}  // namespace ab

namespace ab {

std::string lra_efficiency_report(const std::vector<PointResult>& rs, const std::string& baseline) {
  ResultFile rf;
  rf.points = rs;
  std::string out;
  if (rs.empty()) return out;
  const PointId& first = rs.front().id;
  out += fmt::format(
      "# LRA efficiency (Tay et al. 2020, Table 2) on this machine\n\n"
      "Task {}, training steps (forward, backward, AdamW), batch {} (LRA: 32 on a 4x4 TPU v3), {} thread{}, "
      "model L={} d_model={} heads={} mlp={}. Ratios in brackets are against `{}`, the Transformer.\n\n",
      first.task, first.shape.B, first.threads, first.threads == 1 ? "" : "s", first.model.layers, first.model.dmodel,
      first.shape.H, first.model.mlp, baseline);
  out += make_table({rf}, TableOptions{"steps_per_s", baseline, "md"}) + "\n";
  out += make_table({rf}, TableOptions{"peak_bytes", "none", "md"}) + "\n";
  // Measured speed-up against the speed-up the analytic FLOPs predict, at the longest N, with
  // where the time goes.
  int64_t n_max = 0;
  for (const auto& r : rs) n_max = std::max(n_max, r.id.shape.N);
  const PointResult* base = nullptr;
  for (const auto& r : rs)
    if (r.id.mechanism == baseline && r.id.shape.N == n_max && r.status == Status::OK) base = &r;
  if (!base) return out + fmt::format("(no {} point at N={}: no speed-up check)\n", baseline, n_max);
  const double tb = real_stats(*base).median;
  std::string header = "| mechanism | measured speed-up | FLOP-predicted | measured / predicted |";
  std::string rule = "|---|---:|---:|---:|";
  for (const char* name : layer_type_names()) {
    header += fmt::format(" {} ms |", name);
    rule += "---:|";
  }
  out += fmt::format("**speed-up over {} at N={}: measured against predicted by analytic FLOPs; time per step by layer type**\n\n{}\n{}\n",
                     baseline, n_max, header, rule);
  for (const auto& r : rs) {
    if (r.id.shape.N != n_max) continue;
    if (r.status != Status::OK) {
      std::string row = fmt::format("| {} | {} | | |", r.id.mechanism, to_string(r.status));
      for (int i = 0; i < kLayerTypes; ++i) row += " |";
      out += row + "\n";
      continue;
    }
    const double measured = tb / real_stats(r).median, predicted = base->flops / r.flops;
    std::string row = fmt::format("| {} | {:.2f}x | {:.2f}x | {:.2f} |", r.id.mechanism, measured, predicted, measured / predicted);
    for (double ms : r.layer_ms) row += fmt::format(" {:.1f} |", ms);
    out += row + "\n";
  }
  return out;
}

}  // namespace ab
