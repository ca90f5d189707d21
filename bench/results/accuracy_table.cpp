#include "bench/results/accuracy_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "attention_impls/registry.hpp"
#include "tasks/task.hpp"

namespace ab {

namespace {

// LRA Table 1 (Tay et al. 2020; docs/reproductions.md), test accuracy in %, by the
// mechanism that computes each row here (the Transformer is `flash`, and `vanilla` computes it
// too). -1: FAIL.
struct PublishedRow {
  const char* mechanism;
  const char* model;
  double listops, text, retrieval, image, pathfinder, pathx;
};
const PublishedRow kLraTable1[] = {
    {"flash", "Transformer", 36.37, 64.27, 57.46, 42.44, 71.40, -1},
    {"vanilla", "Transformer", 36.37, 64.27, 57.46, 42.44, 71.40, -1},
    {"local", "Local", 15.82, 52.98, 53.39, 41.46, 66.63, -1},
    {"strided", "Sparse Transformer", 17.07, 63.58, 59.59, 44.24, 71.71, -1},
    {"longformer", "Longformer", 35.63, 62.85, 56.89, 42.22, 69.71, -1},
    {"linformer", "Linformer", 35.70, 53.94, 52.27, 38.56, 76.34, -1},
    {"reformer", "Reformer", 37.27, 56.10, 53.40, 38.07, 68.50, -1},
    {"sinkhorn", "Sinkhorn", 33.67, 61.20, 53.83, 41.23, 67.45, -1},
    {"synthesizer", "Synthesizer", 36.99, 61.68, 54.67, 41.61, 69.45, -1},
    {"bigbird", "BigBird", 36.05, 64.02, 59.29, 40.83, 74.87, -1},
    {"linear", "Linear Transformer", 16.13, 65.90, 53.09, 42.34, 75.30, -1},
    {"performer", "Performer", 18.01, 65.40, 53.82, 42.77, 77.05, -1},
};
std::optional<double> published(const PublishedRow& r, const std::string& task) {
  const double v = task == "listops" ? r.listops : task == "text" ? r.text : task == "retrieval" ? r.retrieval
                 : task == "image" ? r.image : task == "pathfinder" ? r.pathfinder : task == "pathx" ? r.pathx : -2;
  if (v == -2) return std::nullopt;
  return v;
}
const PublishedRow* published_row(const std::string& mechanism) {
  for (const auto& r : kLraTable1)
    if (mechanism == r.mechanism) return &r;
  return nullptr;
}

// A point's name without its seed: the configuration it is a seed of.
std::string configuration(const PointId& id) {
  PointId c = id;
  c.train.seed = 0;
  return c.name();
}

// A configuration as words "key=value": the mechanism's parameters, then every identity field but
// the mechanism and the seed (a row names the words its configuration does not share).
std::vector<std::string> configuration_words(const PointId& id) {
  std::vector<std::string> words;
  for (const auto& [k, v] : id.params.items()) words.push_back(k + "=" + format_param_value(v));
  for (const auto& f : point_fields())
    if (has_field(f, id) && f.type != PointFieldType::Mechanism && f.type != PointFieldType::Params && std::string(f.key) != "seed")
      words.push_back(std::string(f.segment) + "=" + value_text(f.get(id)));
  return words;
}

struct Cell {
  std::vector<double> values;  // one per seed that finished
  std::vector<std::string> failures;
  std::string config;
  int64_t examples = 0;  // the split an accuracy is measured on (0: a metric without one)
  bool any = false;
  std::optional<double> mean() const {
    if (values.empty()) return std::nullopt;
    return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  }
  double stddev() const {
    if (values.size() < 2) return 0;
    const double m = *mean();
    double s = 0;
    for (double v : values) s += (v - m) * (v - m);
    return std::sqrt(s / static_cast<double>(values.size() - 1));
  }
  // "-" without values, the value alone for one, else "mean ± sample std (n=k)".
  template <class Number>
  std::string text(const Number& number) const {
    if (!mean()) return "-";
    if (values.size() == 1) return number(*mean());
    return fmt::format("{} ± {} (n={})", number(*mean()), number(stddev()), values.size());
  }
};

// Spearman's rank correlation of paired values (average ranks for ties).
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& x) {
    std::vector<size_t> idx(x.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t i, size_t j) { return x[i] < x[j]; });
    std::vector<double> r(x.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && x[idx[j + 1]] == x[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = (static_cast<double>(i + j) / 2.0) + 1;
      i = j + 1;
    }
    return r;
  };
  const auto ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n, mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0;
}

// The floor each column is read against: the accuracy of a model that answers one class for every
// input, the share of the commonest label among the examples the metric was measured on (the test
// set for `accuracy`, the validation set for `val_accuracy`), per distinct data the column's runs
// saw. Not 1/classes: a test set of 2,000 generated binary examples has 49-52% of one class.
std::string one_class_note(const std::vector<ResultFile>& files, const std::vector<std::string>& tasks_in_order, const std::string& metric) {
  const bool test = metric == "accuracy" || metric == "final_accuracy";
  if (!test && metric != "val_accuracy") return "";
  std::string note;
  for (const auto& t : tasks_in_order) {
    const TaskInfo& info = find_task(t);
    if (info.classes == 0) continue;
    // The data a column's runs were measured on: (seed, N, data directory, examples).
    std::set<std::tuple<int64_t, int64_t, std::string, int64_t>> data;
    for (const auto& f : files)
      for (const auto& r : f.points)
        if (r.id.training() && r.id.task == t)
          data.insert({r.id.train.seed, r.id.shape.N, r.id.data_dir, test ? r.id.train.test_examples : r.id.train.eval_examples});
    if (data.empty()) continue;
    std::set<int64_t> seeds, lengths;
    std::set<std::string> dirs;
    for (const auto& [seed, n, dir, examples] : data) seeds.insert(seed), lengths.insert(n), dirs.insert(dir);
    std::vector<std::string> parts;
    for (const auto& [seed, n, dir, examples] : data) {
      std::vector<std::string> which;
      if (seeds.size() > 1) which.push_back(fmt::format("seed {}", seed));
      if (lengths.size() > 1) which.push_back(fmt::format("N {}", n));
      if (dirs.size() > 1) which.push_back(dir.empty() ? "generated" : dir);
      std::string value;
      try {
        TaskOptions o;
        o.seq = n;
        o.seed = static_cast<uint64_t>(seed);
        o.data_dir = dir;
        o.split = test ? Split::test : Split::val;
        value = fmt::format("{:.2f}", 100 * label_counts(*make_task(t, o), info.classes, 0, examples).commonest_share());
      } catch (const InvalidInput& e) {
        value = fmt::format("not known here ({})", e.what());
      }
      std::string label;
      for (const auto& w : which) label += (label.empty() ? "" : ", ") + w;
      parts.push_back(label.empty() ? value : fmt::format("{} ({})", value, label));
    }
    std::string column;
    for (const auto& p : parts) column += (column.empty() ? "" : ", ") + p;
    note += fmt::format("{}{} {}", note.empty() ? "" : "; ", t, column);
  }
  if (note.empty()) return "";
  return fmt::format("\nAnswering one class for every input (the commonest label of the {} set) scores: {}\n",
                     test ? "test" : "validation", note);
}

}  // namespace

bool is_accuracy_metric(const std::string& metric) {
  for (const char* m : {"accuracy", "val_accuracy", "final_accuracy", "token_accuracy", "eval_loss"})
    if (metric == m) return true;
  return false;
}

namespace {
// Zoology's Figure 2 layout for the associative-recall runs (every training run on mqar): one
// table per length N (D pairs), rows mechanisms (and what tells a mechanism's configurations
// apart: a window, a feature count), columns d_model; a cell is the best over the learning
// rates, chosen by validation accuracy (not by the test set it reports; a rate's seeds by their
// mean), with the rate chosen and, where a rate has several seeds, mean ± sample std over them.
// A run of the recall table and the row it falls in.
struct RecallRun {
  const PointResult* r;
  std::string row;
};

// One cell of the recall table: the runs of each rate (its seeds), in the order met; a rate's
// validation accuracy is its seeds' mean, and the cell the chosen rate's test value, mean ±
// sample std over them, with the rate. "not run", or FAIL with the reason in `failed`.
std::string recall_cell(const std::vector<RecallRun>& runs, const std::string& row, int64_t width, const Field* field,
                        bool percent, std::string* failed) {
  std::vector<std::pair<double, std::vector<const PointResult*>>> by_rate;
  bool any = false;
  for (const auto& x : runs) {
    if (x.row != row || x.r->id.model.dmodel != width) continue;
    any = true;
    auto it = std::find_if(by_rate.begin(), by_rate.end(), [&](const auto& p) { return p.first == x.r->id.train.lr; });
    if (it == by_rate.end()) it = by_rate.insert(by_rate.end(), {x.r->id.train.lr, {}});
    if (x.r->status != Status::OK) {
      *failed = fmt::format("{}: {}", to_string(x.r->status), x.r->message);
      continue;
    }
    it->second.push_back(x.r);
  }
  auto mean_val = [](const std::vector<const PointResult*>& rs) {
    double m = 0;
    for (const auto* r : rs) m += r->train->val_accuracy;
    return m / static_cast<double>(rs.size());
  };
  const std::vector<const PointResult*>* best = nullptr;
  const double* best_lr = nullptr;
  for (const auto& [lr, rs] : by_rate)
    if (!rs.empty() && (!best || mean_val(rs) > mean_val(*best))) best = &rs, best_lr = &lr;
  if (!any) return "not run";
  if (!best) return "FAIL";
  failed->clear();
  Cell seeds;
  for (const auto* r : *best)
    if (const auto v = field->value(*r, real_stats(*r).median, nullptr)) seeds.values.push_back(*v * (percent ? 100 : 1));
  const std::string cell = seeds.text([](double v) { return fmt::format("{:.2f}", v); });
  return fmt::format("{} (lr {}{})", cell, recipe_text(*best_lr), by_rate.size() > 1 ? fmt::format(", best of {}", by_rate.size()) : "");
}

// The runs of one N, each named by its mechanism and the words that tell it apart from the
// mechanism's other runs there, less what the columns and the best over rates stand for
// (d_model, its head size, the rate) and the seed; the rows in the registry's order.
std::vector<std::string> recall_rows(std::vector<RecallRun>& runs) {
  static const std::set<std::string> across = {"dmodel", "D", "lr", "seed"};
  auto words_of = [](const PointId& id) {
    std::vector<std::string> w;
    for (const auto& x : configuration_words(id)) {
      const std::string key = x.substr(0, x.find('='));
      if (!across.count(key)) w.push_back(x);
    }
    return w;
  };
  std::map<std::string, std::vector<std::vector<std::string>>> of_mech;
  for (const auto& x : runs) of_mech[x.r->id.mechanism].push_back(words_of(x.r->id));
  for (auto& x : runs) {
    x.row = x.r->id.mechanism;
    const auto& all = of_mech.at(x.r->id.mechanism);
    for (const auto& w : words_of(x.r->id))
      if (std::any_of(all.begin(), all.end(), [&](const auto& c) { return std::find(c.begin(), c.end(), w) == c.end(); }))
        x.row += " " + w;
  }
  std::vector<std::string> rows;
  for (const auto& m : mechanism_names())
    for (const auto& x : runs)
      if (x.r->id.mechanism == m && std::find(rows.begin(), rows.end(), x.row) == rows.end()) rows.push_back(x.row);
  return rows;
}

// Zoology's layout: one table per N, rows mechanisms, columns d_model.
std::string recall_table(const std::vector<ResultFile>& files, const AccuracyTableOptions& o) {
  const Field* field = find_field(o.metric);
  const bool percent = o.metric != "eval_loss";
  std::map<int64_t, std::vector<RecallRun>> by_n;  // N -> its runs
  for (const auto& f : files)
    for (const auto& r : f.points)
      if (r.id.training()) by_n[r.id.shape.N].push_back({&r, ""});
  std::string out;
  const std::string what = o.metric == "accuracy" ? "test accuracy" : o.metric;
  out += fmt::format("**{} ({}{}): mqar, one table per N; the best over learning rates by validation accuracy, the rate "
                     "chosen in brackets; mean ± sample std over seeds where a rate has several**\n",
                     o.metric, percent ? "%, " : "", what);
  std::vector<std::string> notes;
  for (auto& [N, runs] : by_n) {
    const std::vector<std::string> rows = recall_rows(runs);
    std::set<int64_t> widths;
    for (const auto& x : runs) widths.insert(x.r->id.model.dmodel);
    const int64_t D = runs.front().r->id.kv_pairs;
    out += fmt::format("\nN = {}, D = {} key-value pairs\n\n| mechanism |", N, D);
    for (int64_t w : widths) out += fmt::format(" d_model {} |", w);
    out += "\n|---|";
    for (size_t i = 0; i < widths.size(); ++i) out += "---:|";
    out += "\n";
    for (const auto& row : rows) {
      out += "| " + row + " |";
      for (int64_t w : widths) {
        std::string failed;
        const std::string cell = recall_cell(runs, row, w, field, percent, &failed);
        out += " " + cell + " |";
        if (cell == "FAIL") notes.push_back(fmt::format("{} at N {} d_model {}: {}", row, N, w, failed));
      }
      out += "\n";
    }
  }
  if (!notes.empty()) {
    out += "\n";
    for (const auto& n : notes) out += "- " + n + "\n";
  }
  return out;
}
}  // namespace

namespace {
// 1. The runs of the files as cells (row, task): rows (mechanisms, a row per configuration where
// a mechanism ran in several on one task) and columns (tasks) in the registries' orders.
struct AccuracyCells {
  std::map<std::pair<std::string, std::string>, Cell> cells;  // (row, task)
  std::vector<std::string> rows, tasks;
  // Beside LRA's table, its whole layout: every mechanism and LRA's five tasks, so a run not
  // yet made reads "not run" instead of leaving its row or column out.
  bool lra_layout = false;
  const Cell* find(const std::string& row, const std::string& task) const {
    const auto it = cells.find({row, task});
    return it == cells.end() ? nullptr : &it->second;
  }
};

// A mechanism's parameters may differ from task to task (a preset's blocks of 50 where 64 does
// not divide N): still one row. A mechanism run in several configurations on one task (other
// parameters, model sizes or steps) gets a row per configuration there, named by what tells
// them apart.
AccuracyCells collect_cells(const std::vector<ResultFile>& files, const AccuracyTableOptions& o, const Field* field,
                            bool percent) {
  // (mechanism, task) -> each configuration's name -> its words
  std::map<std::pair<std::string, std::string>, std::map<std::string, std::vector<std::string>>> configs;
  std::set<std::string> task_set, seen;
  for (const auto& f : files)
    for (const auto& r : f.points) {
      if (!r.id.training()) continue;
      if (!seen.insert(r.id.name()).second)
        throw InvalidInput(fmt::format("point {} is in more than one file; merge them first or pass one", r.id.name()));
      configs[{r.id.mechanism, r.id.task}][configuration(r.id)] = configuration_words(r.id);
      task_set.insert(r.id.task);
    }
  if (seen.empty()) throw InvalidInput("no training runs in the files (`attnbench train` writes them)");
  auto row_of = [&](const PointId& id) {
    const auto& of_cell = configs.at({id.mechanism, id.task});
    if (of_cell.size() < 2) return id.mechanism;
    std::string row = id.mechanism;
    for (const auto& w : of_cell.at(configuration(id)))
      if (std::any_of(of_cell.begin(), of_cell.end(), [&](const auto& c) { return std::find(c.second.begin(), c.second.end(), w) == c.second.end(); }))
        row += " " + w;
    return row;
  };
  AccuracyCells a;
  a.lra_layout = o.published == "lra" && percent;
  for (const auto& m : mechanism_names()) {
    const size_t before = a.rows.size();
    for (const auto& f : files)
      for (const auto& r : f.points)
        if (r.id.training() && r.id.mechanism == m && std::find(a.rows.begin(), a.rows.end(), row_of(r.id)) == a.rows.end())
          a.rows.push_back(row_of(r.id));
    if (a.lra_layout && a.rows.size() == before) a.rows.push_back(m);
  }
  for (const auto& t : tasks()) {
    const bool lra_task = published(kLraTable1[0], t.name) && t.name != "pathx";
    if (task_set.count(t.name) || (a.lra_layout && lra_task)) a.tasks.push_back(t.name);
  }
  for (const auto& f : files)
    for (const auto& r : f.points) {
      if (!r.id.training()) continue;
      Cell& c = a.cells[{row_of(r.id), r.id.task}];
      const std::string config = configuration(r.id);
      if (c.any && c.config != config)
        throw std::logic_error(fmt::format("two configurations of {} on {} in one cell ({} and {})", row_of(r.id), r.id.task,
                                           c.config, config));
      c.any = true;
      c.config = config;
      c.examples = o.metric == "accuracy" || o.metric == "final_accuracy" ? r.id.train.test_examples
                   : o.metric == "val_accuracy"                          ? r.id.train.eval_examples
                                                                         : 0;
      if (r.status != Status::OK) {
        c.failures.push_back(fmt::format("{}: {}", to_string(r.status), r.message));
        continue;
      }
      if (const auto v = field->value(r, real_stats(r).median, nullptr)) c.values.push_back(*v * (percent ? 100 : 1));
    }
  return a;
}

// 2. The header: a task with a real-data reader that ran on its generator is marked (not LRA's
// data); "avg" (LRA's, over the tasks but Path-X) where there is one.
struct AccuracyHeader {
  std::vector<std::string> names;
  bool any_synthetic = false, with_avg = false;
};
AccuracyHeader accuracy_header(const std::vector<ResultFile>& files, const AccuracyCells& a) {
  AccuracyHeader h;
  h.names = {"mechanism"};
  for (const auto& t : a.tasks) {
    bool synthetic = false;
    if (!find_task(t).real_data.empty())
      for (const auto& f : files)
        for (const auto& r : f.points)
          synthetic = synthetic || (r.id.training() && r.id.task == t && r.label.find(" --data-dir ") == std::string::npos);
    h.any_synthetic = h.any_synthetic || synthetic;
    h.names.push_back(synthetic ? t + "*" : t);
  }
  h.with_avg = std::any_of(a.tasks.begin(), a.tasks.end(), [](const std::string& t) { return t != "copy" && t != "pathx"; });
  if (h.with_avg) h.names.push_back("avg");
  return h;
}

// 3. The lines: a row's cells and its average; beside LRA's table, LRA's own row under ours.
// A failed cell reads FAIL and adds its reason to `notes`.
std::vector<std::vector<std::string>> accuracy_lines(const AccuracyCells& a, const AccuracyHeader& h,
                                                     const std::function<std::string(double)>& number,
                                                     std::vector<std::string>* notes) {
  auto cell_text = [&](const std::string& row, const std::string& task) -> std::string {
    const Cell* c = a.find(row, task);
    if (!c || !c->any) return "not run";
    if (!c->failures.empty()) {
      notes->push_back(fmt::format("{} on {}: {}", row, task, c->failures.front()));
      return "FAIL";
    }
    return c->text(number);
  };
  auto average = [&](const std::string& row) -> std::string {
    double sum = 0;
    int n = 0, expected = 0;
    for (const auto& t : a.tasks) {
      if (t == "pathx" || t == "copy") continue;
      ++expected;
      const Cell* c = a.find(row, t);
      if (c && c->failures.empty() && c->mean()) {
        sum += *c->mean();
        ++n;
      }
    }
    if (n == 0) return "-";
    return fmt::format("{}{}", number(sum / n), n < expected ? fmt::format(" ({} of {})", n, expected) : "");
  };
  const bool lra_columns = std::any_of(a.tasks.begin(), a.tasks.end(), [](const std::string& t) { return t != "copy"; });
  std::vector<std::vector<std::string>> body;
  for (const auto& row : a.rows) {
    std::vector<std::string> line = {row};
    for (const auto& t : a.tasks) line.push_back(cell_text(row, t));
    if (h.with_avg) line.push_back(average(row));
    body.push_back(line);
    if (a.lra_layout && lra_columns)
      if (const PublishedRow* p = published_row(row)) {
        std::vector<std::string> pub = {fmt::format("  LRA: {}", p->model)};
        double sum = 0;
        int n = 0;
        for (const auto& t : a.tasks) {
          const auto v = published(*p, t);
          pub.push_back(!v ? "" : *v < 0 ? "FAIL" : fmt::format("{:.2f}", *v));
          if (v && *v >= 0 && t != "pathx") sum += *v, ++n;
        }
        if (h.with_avg) pub.push_back(n ? fmt::format("{:.2f}", sum / n) : "");
        body.push_back(pub);
      }
  }
  return body;
}

// 4. How our order compares with LRA's, per column (Spearman), and whether the column's spread
// is large enough to rank anything.
std::string lra_rank_note(const AccuracyCells& a) {
  std::string corr;
  for (const auto& t : a.tasks) {
    std::vector<double> ours, theirs;
    int64_t fewest = 0;  // examples behind the least-measured cell of the column
    for (const auto& row : a.rows) {
      const PublishedRow* p = published_row(row);
      const Cell* c = a.find(row, t);
      if (!p || row == "vanilla" || !c || !c->mean()) continue;
      const auto v = published(*p, t);
      if (!v || *v < 0) continue;
      ours.push_back(*c->mean());
      theirs.push_back(*v);
      const int64_t n = c->examples * static_cast<int64_t>(c->values.size());
      fewest = fewest == 0 ? n : std::min(fewest, n);
    }
    if (ours.size() < 3) continue;
    corr += fmt::format("{}{} {:.2f} ({} mechanisms", corr.empty() ? "" : "; ", t, spearman(ours, theirs), ours.size());
    // An order is only as good as the accuracies behind it: when the column's whole spread is
    // inside twice the binomial standard error of a difference of two accuracies (each on
    // `fewest` examples, at the column's mean), the correlation ranks noise, and says so.
    if (fewest > 0) {
      const double p = std::accumulate(ours.begin(), ours.end(), 0.0) / static_cast<double>(ours.size()) / 100;
      const double two_se = 2 * 100 * std::sqrt(2 * p * (1 - p) / static_cast<double>(fewest));
      const double spread = *std::max_element(ours.begin(), ours.end()) - *std::min_element(ours.begin(), ours.end());
      if (spread < two_se)
        corr += fmt::format("; spread {:.2f} points, within {:.2f}, twice the standard error of a difference on {} "
                            "examples: it ranks noise", spread, two_se, fewest);
    }
    corr += ")";
  }
  return corr.empty() ? "" : "\nSpearman rank correlation with LRA's order, per column: " + corr + "\n";
}

// 5. The lines in a format: csv (quoted cells), latex (booktabs, ± as $\pm$) or markdown (a bold
// title, numbers right-aligned).
std::string render_lines(const std::string& format, const std::string& title, const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& body) {
  std::string out;
  if (format == "csv") {
    for (size_t i = 0; i < header.size(); ++i) out += (i ? "," : "") + header[i];
    out += "\n";
    for (const auto& line : body) {
      for (size_t i = 0; i < line.size(); ++i) out += (i ? "," : "") + fmt::format("\"{}\"", line[i]);
      out += "\n";
    }
    return out;
  }
  if (format == "latex") {
    out += "% " + title + "\n\\begin{tabular}{l" + std::string(header.size() - 1, 'r') + "}\n\\toprule\n";
    for (size_t i = 0; i < header.size(); ++i) out += (i ? " & " : "") + header[i];
    out += " \\\\\n\\midrule\n";
    for (const auto& line : body) {
      for (size_t i = 0; i < line.size(); ++i) {
        std::string cell = line[i];
        for (size_t at = cell.find("±"); at != std::string::npos; at = cell.find("±")) cell.replace(at, std::string("±").size(), "$\\pm$");
        out += (i ? " & " : "") + cell;
      }
      out += " \\\\\n";
    }
    return out + "\\bottomrule\n\\end{tabular}\n";
  }
  out += "**" + title + "**\n\n|";
  for (const auto& h : header) out += " " + h + " |";
  out += "\n|---|";
  for (size_t i = 1; i < header.size(); ++i) out += "---:|";
  out += "\n";
  for (const auto& line : body) {
    out += "|";
    for (const auto& c : line) out += " " + c + " |";
    out += "\n";
  }
  return out;
}
}  // namespace

std::string accuracy_table(const std::vector<ResultFile>& files, const AccuracyTableOptions& o) {
  if (!is_accuracy_metric(o.metric)) throw InvalidInput(fmt::format("'{}' is not an accuracy metric", o.metric));
  // Associative recall alone: Zoology's layout (markdown; csv and latex keep the general one).
  bool any = false, all_recall = true;
  for (const auto& f : files)
    for (const auto& r : f.points)
      if (r.id.training()) any = true, all_recall = all_recall && r.id.task == "mqar";
  if (any && all_recall && o.published.empty() && o.format == "md") return recall_table(files, o);
  if (o.format != "md" && o.format != "csv" && o.format != "latex")
    throw InvalidInput(fmt::format("unknown format '{}'; formats: md, csv, latex", o.format));
  if (!o.published.empty() && o.published != "lra")
    throw InvalidInput(fmt::format("unknown --published '{}'; published tables: lra", o.published));
  const bool percent = o.metric != "eval_loss";
  const AccuracyCells a = collect_cells(files, o, find_field(o.metric), percent);
  const AccuracyHeader header = accuracy_header(files, a);
  // Percentages to two decimals; a loss to four significant digits (a trained copy model's test
  // loss is 0.0035, which two decimals would print as 0.00).
  auto number = [&](double v) { return percent ? fmt::format("{:.2f}", v) : fmt::format("{:.4g}", v); };
  std::vector<std::string> notes;
  const auto body = accuracy_lines(a, header, number, &notes);
  const std::string unit = percent ? "%, " : "";
  const std::string what = o.metric == "accuracy"         ? "test accuracy with the best-validation parameters"
                           : o.metric == "final_accuracy" ? "test accuracy with the final parameters"
                           : o.metric == "val_accuracy"   ? "best validation accuracy"
                           : o.metric == "token_accuracy" ? "test per-token accuracy"
                                                          : "test loss per prediction";
  const std::string title = fmt::format("{} ({}{}; mean ± sample std over seeds where there are several)", o.metric, unit, what);
  std::string out = render_lines(o.format, title, header.names, body);
  if (o.format != "md") return out;
  if (a.lra_layout) out += lra_rank_note(a);
  out += one_class_note(files, a.tasks, o.metric);
  if (header.any_synthetic) out += "\n\\* synthetic data: the task's in-process generator, not LRA's data (pass --data-dir)\n";
  if (!notes.empty()) {
    out += "\n";
    for (const auto& n : notes) out += "- " + n + "\n";
  }
  return out;
}

}  // namespace ab
