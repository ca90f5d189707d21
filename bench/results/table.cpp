#include "bench/results/table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>

#include "attention_impls/registry.hpp"
#include "bench/results/accuracy_table.hpp"
#include "bench/results/stats.hpp"

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
  std::vector<std::string> names = {"time", "cpu_time"};
  for (const auto& f : result_fields()) names.push_back(f.key);
  for (const auto& [alias, key] : metric_aliases()) names.push_back(alias);
  throw unknown_name("metric", name, names, "metrics");
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
    const std::string g = group_title(r->id);
    if (!groups.count(g)) group_order.push_back(g);
    groups[g].push_back(r);
  }
  std::vector<Table> tables;
  for (const auto& g : group_order) {
    const auto& pts = groups[g];
    Table t;
    // A mechanism measured with several parameter values gets one row per value.
    std::map<std::string, std::set<std::string>> variants;
    for (const auto* r : pts) variants[r->id.mechanism].insert(params_text(r->id.params));
    auto row_of = [&](const PointResult& r) {
      return variants[r.id.mechanism].size() > 1 ? r.id.mechanism + " " + params_text(r.id.params) : r.id.mechanism;
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
  // A training run's quality: LRA Table 1's layout (rows mechanisms, columns tasks, avg).
  if (is_accuracy_metric(o.metric)) return accuracy_table(files, AccuracyTableOptions{o.metric, o.format, o.published});
  if (!o.published.empty()) throw InvalidInput("--published goes with an accuracy metric (--metric accuracy)");
  return render(build_tables(files, o), o.format);
}

int cmd_table(const std::vector<std::string>& paths, const TableOptions& o) {
  find_metric(o.metric);  // bad options are reported before any file is read
  auto files = read_result_files(paths);
  filter_result_files(files, o.filter);
  require_points(files);
  std::cout << make_table(files, o);
  return 0;
}

}  // namespace ab
