#include "bench/results/history.hpp"

#include <fmt/format.h>
#include <sqlite3.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/results/export.hpp"
#include "bench/points/point.hpp"
#include "bench/process/process.hpp"
#include "bench/results/report.hpp"
#include "bench/results/result_writer.hpp"
#include "bench/results/stats.hpp"
#include "core/files.hpp"
#include "core/params.hpp"

namespace ab {

namespace {

// One open database; every failure names the file and SQLite's message.
class Db {
 public:
  Db(const std::string& path, bool write) : path_(path) {
    const int flags = write ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY;
    if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
      const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
      sqlite3_close(db_);
      throw InvalidInput(fmt::format("--db {}: {}", path, why));
    }
    sqlite3_busy_timeout(db_, 10000);  // two CI jobs adding at once wait for each other
  }
  ~Db() { sqlite3_close(db_); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void exec(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      const std::string why = err ? err : sqlite3_errmsg(db_);
      sqlite3_free(err);
      fail(why);
    }
  }
  [[noreturn]] void fail(const std::string& why) const { throw InvalidInput(fmt::format("--db {}: {}", path_, why)); }
  sqlite3* get() const { return db_; }

  // The columns of table `results` (empty when there is no such table).
  std::vector<std::string> columns() {
    std::vector<std::string> out;
    Statement st(*this, "PRAGMA table_info(results)");
    while (st.step()) out.push_back(st.text(1));
    return out;
  }

  class Statement {
   public:
    Statement(Db& db, const std::string& sql) : db_(db) {
      if (sqlite3_prepare_v2(db.get(), sql.c_str(), -1, &st_, nullptr) != SQLITE_OK) db.fail(sqlite3_errmsg(db.get()));
    }
    ~Statement() { sqlite3_finalize(st_); }
    Statement(const Statement&) = delete;
    Statement& operator=(const Statement&) = delete;
    bool step() {
      const int rc = sqlite3_step(st_);
      if (rc == SQLITE_ROW) return true;
      if (rc != SQLITE_DONE) db_.fail(sqlite3_errmsg(db_.get()));
      return false;
    }
    void reset() {
      sqlite3_reset(st_);
      sqlite3_clear_bindings(st_);
    }
    void bind(int i, const nlohmann::json& v) {
      int rc = SQLITE_OK;
      if (v.is_null()) rc = sqlite3_bind_null(st_, i);
      else if (v.is_boolean()) rc = sqlite3_bind_int64(st_, i, v.get<bool>() ? 1 : 0);
      else if (v.is_number_integer() || v.is_number_unsigned()) rc = sqlite3_bind_int64(st_, i, v.get<int64_t>());
      else if (v.is_number()) rc = sqlite3_bind_double(st_, i, v.get<double>());
      else {
        const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
        rc = sqlite3_bind_text(st_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
      }
      if (rc != SQLITE_OK) db_.fail(sqlite3_errmsg(db_.get()));
    }
    std::string text(int col) const {
      const unsigned char* t = sqlite3_column_text(st_, col);
      return t ? reinterpret_cast<const char*>(t) : "";
    }
    double number(int col) const { return sqlite3_column_double(st_, col); }
    bool null(int col) const { return sqlite3_column_type(st_, col) == SQLITE_NULL; }

   private:
    Db& db_;
    sqlite3_stmt* st_ = nullptr;
  };

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
};

std::string quoted_name(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// FNV-1a over the file's bytes: the name of one addition (a file added again is seen).
std::string file_digest(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  uint64_t h = 1469598103934665603ull;
  for (std::istreambuf_iterator<char> it(f), end; it != end; ++it) {
    h ^= static_cast<unsigned char>(*it);
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

const char* const kRequired[] = {"history_run", "machine_id", "git_commit", "date", "run_name", "run_type", "real_time", "time_unit"};

double to_ms(double v, const std::string& unit) {
  if (unit == "ns") return v * 1e-6;
  if (unit == "us") return v * 1e-3;
  if (unit == "s") return v * 1e3;
  return v;
}

}  // namespace

int history_add(const std::vector<std::string>& files, const HistoryOptions& o) {
  for (const auto& f : files) require_regular_file(f);
  Db db(o.db, true);
  int added = 0;
  for (const auto& path : files) {
    const LongTable t = export_table({path});
    const std::string run = file_digest(path);
    db.exec("BEGIN IMMEDIATE");
    try {
      std::vector<std::string> have = db.columns();
      if (have.empty()) {
        db.exec("CREATE TABLE results (\"history_run\" TEXT, \"history_added\" TEXT)");
        db.exec("CREATE INDEX results_by_run ON results (\"history_run\")");
        have = {"history_run", "history_added"};
      } else if (std::find(have.begin(), have.end(), "history_run") == have.end()) {
        db.fail("its table 'results' is not an attnbench history (no history_run column); give another --db");
      }
      Db::Statement seen(db, "SELECT 1 FROM results WHERE history_run = ?1 LIMIT 1");
      seen.bind(1, run);
      if (seen.step()) {
        db.exec("ROLLBACK");
        std::cout << fmt::format("{}: already in {} (run {})\n", path, o.db, run);
        continue;
      }
      const std::set<std::string> existing(have.begin(), have.end());
      for (const auto& c : t.columns)
        if (!existing.count(c)) db.exec("ALTER TABLE results ADD COLUMN " + quoted_name(c));
      std::string sql = "INSERT INTO results (\"history_run\", \"history_added\"";
      for (const auto& c : t.columns) sql += ", " + quoted_name(c);
      sql += ") VALUES (?1, ?2";
      for (size_t i = 0; i < t.columns.size(); ++i) sql += fmt::format(", ?{}", i + 3);
      sql += ")";
      Db::Statement ins(db, sql);
      const std::string added_at = now_utc();
      for (const auto& row : t.rows) {
        ins.reset();
        ins.bind(1, run);
        ins.bind(2, added_at);
        for (size_t i = 0; i < t.columns.size(); ++i) {
          const auto it = row.find(t.columns[i]);
          ins.bind(static_cast<int>(i + 3), it == row.end() ? nlohmann::json() : it->second);
        }
        ins.step();
      }
      db.exec("COMMIT");
    } catch (...) {
      sqlite3_exec(db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
    std::cout << fmt::format("{}: added to {} as run {} ({} entries)\n", path, o.db, run, t.rows.size());
    ++added;
  }
  return added;
}

std::vector<HistorySeries> history_series(const HistoryOptions& o) {
  if (!std::filesystem::exists(o.db)) throw InvalidInput(fmt::format("--db {}: no such file (`attnbench history add` makes it)", o.db));
  require_regular_file(o.db);
  Db db(o.db, false);
  const std::vector<std::string> have = db.columns();
  for (const char* c : kRequired)
    if (std::find(have.begin(), have.end(), c) == have.end())
      db.fail(have.empty() ? "no table 'results' (not an attnbench history)" : fmt::format("its results table has no column '{}'", c));
  auto has = [&](const char* c) { return std::find(have.begin(), have.end(), c) != have.end(); };
  // Timed repetitions only: not aggregates, failed points or training runs (whose time is a step's).
  std::string sql =
      "SELECT machine_id, git_commit, date, history_run, run_name, real_time, time_unit FROM results "
      "WHERE run_type = 'iteration' AND real_time IS NOT NULL";
  if (has("error_occurred")) sql += " AND (error_occurred IS NULL OR error_occurred = 0)";
  if (has("train_steps")) sql += " AND train_steps IS NULL";
  sql += " ORDER BY date, history_added, history_run";
  Db::Statement st(db, sql);
  // (machine, point) -> runs in the order met (date order), each its repetitions.
  std::map<std::pair<std::string, std::string>, HistorySeries> by_point;
  std::vector<std::pair<std::string, std::string>> order;
  while (st.step()) {
    const std::pair<std::string, std::string> key{st.text(0), st.text(4)};
    auto it = by_point.find(key);
    if (it == by_point.end()) {
      HistorySeries s;
      s.machine = key.first;
      // The point its name names (PointId::from_name): grouped as `table` groups it, a line per
      // mechanism, parameters and N.
      const PointId id = PointId::from_name(key.second);
      s.group = group_title(id);
      const std::string params = params_text(id.params);
      s.label = id.mechanism + (params.empty() ? "" : " " + params) + " N=" + std::to_string(id.shape.N);
      it = by_point.emplace(key, std::move(s)).first;
      order.push_back(key);
    }
    auto& runs = it->second.runs;
    const std::string run = st.text(3);
    if (runs.empty() || runs.back().run != run) {
      HistorySeries::Run r;
      r.commit = st.text(1);
      r.date = st.text(2);
      r.run = run;
      runs.push_back(std::move(r));
    }
    runs.back().reps_ms.push_back(to_ms(st.number(5), st.text(6)));
  }
  std::vector<HistorySeries> out;
  for (const auto& key : order) {
    HistorySeries s = std::move(by_point.at(key));
    for (size_t i = 0; i < s.runs.size(); ++i) {
      auto& r = s.runs[i];
      std::vector<double> v = r.reps_ms;
      std::sort(v.begin(), v.end());
      r.median_ms = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
      if (i == 0) continue;
      // The gate's rule (compare --metric time) between this run and the previous one.
      const auto& prev = s.runs[i - 1];
      const MannWhitney mw = mann_whitney(prev.reps_ms, r.reps_ms);
      r.change = prev.median_ms > 0 ? r.median_ms / prev.median_ms - 1 : 0;
      r.p = mw.p_greater;
      r.regression = mw.min_p < o.alpha && r.change > o.max_regress && mw.p_greater < o.alpha;
    }
    out.push_back(std::move(s));
  }
  return out;
}

int cmd_history_add(const std::vector<std::string>& files, const HistoryOptions& o) {
  history_add(files, o);
  return 0;
}

namespace {
// One figure of the report: a (machine, group), its runs in date order along x (labelled by
// commit and date), a line per series.
struct HistoryGroup {
  std::string machine, group;
  std::vector<std::string> runs;  // run digests in date order
  std::map<std::string, std::string> run_label;
  std::vector<const HistorySeries*> lines;
};

std::vector<HistoryGroup> history_groups(const std::vector<HistorySeries>& series) {
  std::vector<HistoryGroup> groups;
  for (const auto& s : series) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const HistoryGroup& x) { return x.machine == s.machine && x.group == s.group; });
    if (g == groups.end()) {
      groups.push_back({s.machine, s.group, {}, {}, {}});
      g = groups.end() - 1;
    }
    g->lines.push_back(&s);
    for (const auto& r : s.runs) {
      if (!g->run_label.count(r.run)) g->runs.push_back(r.run);
      g->run_label[r.run] = fmt::format("{}\n{}", r.commit.substr(0, 7), r.date.substr(0, 10));
    }
  }
  return groups;
}

// The figures as scripts/plot.py history reads them.
nlohmann::json figures_json(const std::vector<HistoryGroup>& groups) {
  nlohmann::json figures = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json f = {{"title", g.machine + " · " + g.group}, {"runs", nlohmann::json::array()}, {"lines", nlohmann::json::array()}};
    for (const auto& r : g.runs) f["runs"].push_back(g.run_label.at(r));
    for (const auto* s : g.lines) {
      nlohmann::json l = {{"label", s->label}, {"x", nlohmann::json::array()}, {"y", nlohmann::json::array()}, {"regression", nlohmann::json::array()}};
      for (const auto& r : s->runs) {
        l["x"].push_back(std::find(g.runs.begin(), g.runs.end(), r.run) - g.runs.begin());
        l["y"].push_back(r.median_ms);
        l["regression"].push_back(r.regression);
      }
      f["lines"].push_back(l);
    }
    figures.push_back(f);
  }
  return figures;
}

// The report's opening paragraph and its table of regressions (a run slower than the one before
// it, by compare's rule).
std::string regressions_html(const std::vector<HistorySeries>& series, const HistoryOptions& o) {
  int regressions = 0;
  std::string table;
  std::set<std::string> machines;
  for (const auto& s : series) {
    machines.insert(s.machine);
    for (size_t i = 1; i < s.runs.size(); ++i)
      if (s.runs[i].regression) {
        ++regressions;
        table += fmt::format("<tr><td>{}</td><td>{}</td><td>{} → {}</td><td>{}</td><td class=\"num\">{:+.1f}%</td><td class=\"num\">{:.3g}</td></tr>\n",
                             html_escape(s.machine), html_escape(s.label + " · " + s.group), html_escape(s.runs[i - 1].commit.substr(0, 7)),
                             html_escape(s.runs[i].commit.substr(0, 7)), html_escape(s.runs[i].date), 100 * s.runs[i].change, s.runs[i].p);
      }
  }
  std::string body = fmt::format("<p>{} points over {} machine(s), from {}. A marked point (red ring) is slower than the run before it "
                                 "by more than {:.0f}% with Mann-Whitney p &lt; {} on their repetitions (the rule of "
                                 "<code>attnbench compare</code>).</p>\n",
                                 series.size(), machines.size(), html_escape(o.db), 100 * o.max_regress, o.alpha);
  body += fmt::format("<h2>Regressions ({})</h2>\n", regressions);
  body += regressions ? "<table class=\"sortable\">\n<thead><tr><th>machine</th><th>point</th><th>commits</th><th>date</th>"
                        "<th>change</th><th>p</th></tr></thead>\n<tbody>\n" + table + "</tbody>\n</table>\n"
                      : "<p>None.</p>\n";
  return body;
}
}  // namespace

int cmd_history_report(const HistoryOptions& o) {
  namespace fs = std::filesystem;
  const std::vector<HistorySeries> series = history_series(o);
  if (series.empty()) throw InvalidInput(fmt::format("--db {}: no timed points in the history", o.db));
  make_directory("--out", o.out_dir);
  const std::string page = (fs::path(o.out_dir) / "index.html").string();
  refuse_overwriting_inputs(page, {o.db});
  prepare_output_path(page, o.force);
  // The figures: one per (machine, group), drawn by scripts/plot.py history from a JSON description.
  const std::vector<HistoryGroup> groups = history_groups(series);
  const std::string scratch = make_scratch_dir("history");
  std::string body;
  try {
    write_file_atomic(scratch + "/figures.json", figures_json(groups).dump());
    const std::string script = std::string(ATTNBENCH_SOURCE_DIR) + "/scripts/plot.py";
    const ChildOutcome c = run_child({"/usr/bin/python3", script, "history", scratch + "/figures.json", scratch + "/fig"},
                                     scratch + "/plot.out", scratch + "/plot.err", 600, nullptr);
    const bool drawn = c.kind == ChildOutcome::Exited && c.exit_code == 0;
    body += regressions_html(series, o);
    std::string machine;
    for (size_t i = 0; i < groups.size(); ++i) {
      if (groups[i].machine != machine) body += "<h2>" + html_escape(machine = groups[i].machine) + "</h2>\n";
      body += "<h4>" + html_escape(groups[i].group) + "</h4>\n";
      const std::string png = fmt::format("{}/fig_{}.png", scratch, i);
      if (drawn && fs::exists(png)) {
        body += fmt::format("<p><img alt=\"{}: median time against runs\" src=\"data:image/png;base64,{}\"></p>\n",
                            html_escape(groups[i].group), base64_encode(read_file_bytes(png)));
      } else {
        body += "<p class=\"missing\">plot not drawn: " +
                html_escape(drawn ? "scripts/plot.py wrote no figure" : c.describe() + ": " + last_line_of(scratch + "/plot.err")) + "</p>\n";
      }
    }
  } catch (...) {
    fs::remove_all(scratch);
    throw;
  }
  fs::remove_all(scratch);
  write_file_atomic(page, html_page("attnbench history", body));
  std::cout << page << "\n";
  return 0;
}

}  // namespace ab
