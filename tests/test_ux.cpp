// What a user of the command line meets: help with examples, names suggested for misspellings,
// tables and progress that fit the terminal, --dry-run, --filter, --out -, --context, the long
// export, and the warnings about untrustworthy measurements.
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "bench/text/terminal.hpp"
#include "bench/results/warnings.hpp"
#include "tests/helpers.hpp"

namespace ab {
namespace {

using test::exec;
using test::lines_of;

const char* kTiny = " --batch 1 --heads 1 --dhead 8 --reps 1 --min-time 0 --warmup 0 ";

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> point_names(const std::string& path) {
  std::set<std::string> names;
  const auto doc = nlohmann::json::parse(slurp(path));
  for (const auto& b : doc["benchmarks"])
    if (b.value("run_type", "") == "iteration") names.insert(b["run_name"].get<std::string>());
  return names;
}

// The verbs as `attnbench --help` lists them (so a new verb is checked without editing this).
std::vector<std::string> verbs() {
  const auto help = exec("--help", false).out;
  std::vector<std::string> out;
  bool in_list = false;
  for (const auto& l : lines_of(help)) {
    if (l.rfind("Subcommands:", 0) == 0) {
      in_list = true;
      continue;
    }
    if (in_list && l.size() > 2 && l[0] == ' ' && l[2] != ' ') out.push_back(l.substr(2, l.find(' ', 2) - 2));
    else if (in_list && l.empty() && !out.empty()) break;
  }
  return out;
}

TEST(Ux, EveryVerbsHelpEndsWithExamplesAndExitsZero) {
  const auto vs = verbs();
  ASSERT_GE(vs.size(), 9u) << exec("--help").out;
  for (const auto& v : vs) {
    const auto e = exec(v + " --help", false);
    EXPECT_EQ(e.code, 0) << v;
    EXPECT_NE(e.out.find("Examples:\n  attnbench " + v), std::string::npos) << v << ":\n" << e.out;
  }
  for (const char* sub : {"task sample", "task rate"}) {
    const auto e = exec(std::string(sub) + " --help", false);
    EXPECT_EQ(e.code, 0) << sub;
    EXPECT_NE(e.out.find(std::string("Examples:\n  attnbench ") + sub), std::string::npos) << e.out;
  }
  const auto e = exec("--version", false);
  EXPECT_EQ(e.code, 0);
  EXPECT_EQ(e.out.rfind("attnbench ", 0), 0u) << e.out;
}

TEST(Ux, MisspeltNamesSuggestTheRightOne) {
  struct Case {
    std::string args, suggestion;
  };
  for (const Case& c : {Case{"rnu --attn flash", "did you mean 'run'?"},
                        Case{"run --attn flsh --seq 32", "did you mean 'flash'?"},
                        Case{"run --attn flash --seqq 32", "did you mean --seq?"},
                        Case{"run --attn flash --seq 32 --level model --task lisops", "did you mean 'listops'?"},
                        Case{"table x.json --metric tme", "did you mean 'time'?"}}) {
    const auto e = exec(c.args);
    EXPECT_EQ(e.code, 2) << c.args << ": " << e.out;
    EXPECT_NE(e.out.find(c.suggestion), std::string::npos) << c.args << ": " << e.out;
    EXPECT_EQ(std::count(e.out.begin(), e.out.end(), '\n'), 1) << c.args << ": " << e.out;
  }
}

TEST(Ux, RunsDefaultTableFitsOneHundredColumns) {
  // Many mechanisms with long parameter lists: the widest table `run` prints.
  const auto e = exec("run --attn bigbird,reformer,performer,strided,longformer --seq 64 --error" + std::string(kTiny), false);
  ASSERT_EQ(e.code, 0) << e.out;
  for (const auto& l : lines_of(e.out)) EXPECT_LE(display_columns(l), 100) << l;
  const auto wide = exec("run --attn bigbird,reformer,performer,strided,longformer --seq 64 --error --wide" + std::string(kTiny), false);
  size_t widest = 0;
  for (const auto& l : lines_of(wide.out)) widest = std::max<size_t>(widest, display_columns(l));
  EXPECT_GT(widest, 100u) << "--wide shows every column";
  const auto list = exec("list", false);
  for (const auto& l : lines_of(list.out)) EXPECT_LE(display_columns(l), 100) << l;
}

// The sweep's progress under a pseudo-terminal `columns` wide: every redraw (the text between
// carriage returns and newlines, without the erase-line escape) fits the width.
void expect_progress_fits(int columns) {
  const std::string out = test::temp_path("pty_" + std::to_string(columns) + ".json");
  std::filesystem::remove(out);
  winsize ws{};
  ws.ws_col = static_cast<unsigned short>(columns);
  ws.ws_row = 24;
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, &ws);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(ATTNBENCH_EXE, ATTNBENCH_EXE, "sweep", "--attn", "flash,linear,bigbird", "--seq", "64,128", "--batch", "1",
          "--heads", "1", "--dhead", "8", "--reps", "1", "--min-time", "0", "--out", out.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(master, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  int status = 0;
  waitpid(pid, &status, 0);
  close(master);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  size_t redraws = 0;
  std::string piece;
  auto check = [&] {
    for (size_t at; (at = piece.find("\033[K")) != std::string::npos;) piece.erase(at, 3);
    if (!piece.empty()) {
      ++redraws;
      EXPECT_LE(display_columns(piece), columns) << piece;
    }
    piece.clear();
  };
  for (char c : text) {
    if (c == '\r' || c == '\n') check();
    else piece += c;
  }
  check();
  EXPECT_GE(redraws, 6u) << text;  // a status line and a result line per point
  EXPECT_EQ(point_names(out).size(), 6u);
}

TEST(Ux, SweepProgressNeverExceedsTheTerminalWidth) {
  expect_progress_fits(60);
  expect_progress_fits(200);
}

TEST(Ux, DryRunListsEveryPointAndRunsNothing) {
  const std::string out = test::temp_path("dry.json");
  std::filesystem::remove(out);
  auto e = exec("sweep --attn flash,linear,local --seq 64,128 --out " + out + " --dry-run" + kTiny, false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_FALSE(std::filesystem::exists(out));
  int rows = 0;
  for (const auto& l : lines_of(e.out)) rows += l.rfind("| ", 0) == 0 && l.find("mechanism") == std::string::npos ? 1 : 0;
  EXPECT_EQ(rows, 6) << e.out;
  EXPECT_NE(e.out.find("dry run: 6 points"), std::string::npos) << e.out;
  e = exec("run --attn flash,linear --seq 64 --dry-run --out " + out + kTiny, false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_NE(e.out.find("dry run: 2 points"), std::string::npos) << e.out;
  // Bad input fails the same way with --dry-run.
  EXPECT_EQ(exec("run --attn flash --seq 0 --dry-run").code, 2);
}

TEST(Ux, FilterSelectsExactlyTheMatchingPoints) {
  const std::string all = test::temp_path("filter_all.json"), some = test::temp_path("filter_some.json");
  for (const auto& p : {all, some}) std::filesystem::remove(p);
  const std::string grid = "run --attn flash,linear,local --seq 32,64" + std::string(kTiny);
  ASSERT_EQ(exec(grid + "--out " + all, false).code, 0);
  ASSERT_EQ(exec(grid + "--filter 'attn:(flash|local)/.*N:64/' --out " + some, false).code, 0);
  std::set<std::string> expected;
  for (const auto& n : point_names(all))
    if ((n.rfind("attn:flash/", 0) == 0 || n.rfind("attn:local/", 0) == 0) && n.find("/N:64/") != std::string::npos)
      expected.insert(n);
  EXPECT_EQ(expected.size(), 2u);
  EXPECT_EQ(point_names(some), expected);
  // table and compare read only the matching points.
  auto e = exec("table " + all + " --baseline none --filter 'attn:linear/' --format csv", false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("linear"), std::string::npos);
  EXPECT_EQ(e.out.find("flash"), std::string::npos) << e.out;
  e = exec("compare " + all + " " + all + " --filter 'N:32/' --format csv", false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(std::count(e.out.begin(), e.out.end(), '\n'), 4) << e.out;  // header and three points
  // Matching nothing is an error, not an empty success; so is a malformed expression.
  e = exec(grid + "--filter 'attn:vanilla/'");
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("matches none"), std::string::npos) << e.out;
  EXPECT_EQ(exec(grid + "--filter '('").code, 2);
}

TEST(Ux, OutDashWritesTheResultFileToStdout) {
  auto e = exec("run --attn flash --seq 32 --out -" + std::string(kTiny), false);
  ASSERT_EQ(e.code, 0) << e.out;
  const auto doc = nlohmann::json::parse(e.out);
  EXPECT_FALSE(doc["benchmarks"].empty());
  e = exec("sweep --attn flash,linear --seq 32 --out -" + std::string(kTiny), false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(nlohmann::json::parse(e.out)["benchmarks"].size(), 2u * (1 + 4));  // a repetition and 4 aggregates each
}

TEST(Ux, ContextPairsGoIntoTheResultContext) {
  const std::string out = test::temp_path("user_context.json");
  auto e = exec("run --attn flash --seq 32 --context patch=v2 --context board=x1 --out " + out + kTiny, false);
  ASSERT_EQ(e.code, 0) << e.out;
  const auto ctx = nlohmann::json::parse(slurp(out))["context"];
  EXPECT_EQ(ctx["patch"], "v2");
  EXPECT_EQ(ctx["board"], "x1");
  for (const char* bad : {"--context machine_id=x", "--context novalue", "--context =v"}) {
    e = exec(std::string("run --attn flash --seq 32 ") + bad + kTiny);
    EXPECT_EQ(e.code, 2) << bad << ": " << e.out;
  }
}

// A minimal CSV reader (RFC 4180 quoting), enough to read the export back.
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows(1);
  std::string cell;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') cell += '"', ++i;
      else if (c == '"') quoted = false;
      else cell += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().push_back(cell);
      cell.clear();
    } else if (c == '\n') {
      rows.back().push_back(cell);
      cell.clear();
      rows.emplace_back();
    } else {
      cell += c;
    }
  }
  if (rows.back().empty()) rows.pop_back();
  return rows;
}

void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, nlohmann::json>& out) {
  for (const auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object() && !v.empty()) flatten(v, key, out);
    else out[key] = v;
  }
}

TEST(Ux, LongCsvRoundTripsEveryFieldAtFullPrecision) {
  const std::string file = test::temp_path("export.json"), csv = test::temp_path("export.csv");
  for (const auto& p : {file, csv}) std::filesystem::remove(p);
  ASSERT_EQ(exec("run --attn flash,bigbird --seq 64 --error --reps 3 --batch 1 --heads 1 --dhead 8 --min-time 0 --out " + file, false).code, 0);
  ASSERT_EQ(exec("export " + file + " --out " + csv).code, 0);
  const auto rows = parse_csv(slurp(csv));
  const auto doc = nlohmann::json::parse(slurp(file));
  const auto& entries = doc["benchmarks"];
  ASSERT_EQ(rows.size(), entries.size() + 1);  // a header and a row per entry
  const auto& header = rows[0];
  auto column = [&](const std::string& name) {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? -1 : static_cast<int>(it - header.begin());
  };
  for (const char* c : {"machine_id", "git_commit", "run_type", "repetition_index", "real_time", "point.seq"})
    EXPECT_GE(column(c), 0) << c;
  size_t compared = 0;
  for (size_t r = 0; r < entries.size(); ++r) {
    const auto& row = rows[r + 1];
    ASSERT_EQ(row.size(), header.size());
    EXPECT_EQ(row[static_cast<size_t>(column("machine_id"))], doc["context"]["machine_id"].get<std::string>());
    std::map<std::string, nlohmann::json> fields;
    flatten(entries[r], "", fields);
    for (const auto& [key, value] : fields) {
      const int c = column(key);
      ASSERT_GE(c, 0) << key;
      const std::string& cell = row[static_cast<size_t>(c)];
      if (value.is_number()) {
        EXPECT_EQ(std::strtod(cell.c_str(), nullptr), value.get<double>()) << key << " = " << cell;
      } else if (value.is_string()) {
        EXPECT_EQ(cell, value.get<std::string>()) << key;
      } else if (value.is_boolean()) {
        EXPECT_EQ(cell, value.get<bool>() ? "true" : "false") << key;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 200u);
  // The other formats: JSON lines, a row each; SQL that Python's sqlite3 loads.
  auto e = exec("export " + file + " --format jsonl", false);
  ASSERT_EQ(e.code, 0);
  EXPECT_EQ(lines_of(e.out).size(), entries.size());
  EXPECT_EQ(nlohmann::json::parse(lines_of(e.out)[0])["real_time"], entries[0]["real_time"]);
  const std::string sql = test::temp_path("export.sql");
  ASSERT_EQ(exec("export " + file + " --format sql --out " + sql).code, 0);
  const std::string py = "/usr/bin/python3 -c \"import sqlite3,sys; c=sqlite3.connect(':memory:'); "
                         "c.executescript(open(sys.argv[1]).read()); "
                         "print(c.execute('select count(*) from results').fetchone()[0])\" " + sql;
  FILE* p = popen(py.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[64] = {};
  const size_t n = fread(buf, 1, sizeof buf - 1, p);
  pclose(p);
  EXPECT_EQ(std::string(buf, n), std::to_string(entries.size()) + "\n");
  // An existing --out is not overwritten without --force.
  e = exec("export " + file + " --out " + csv);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_EQ(exec("export " + file + " --out " + csv + " --force").code, 0);
}

TEST(Ux, UntrustworthyMeasurementsAreWarnedAbout) {
  nlohmann::json ctx = {{"num_cpus", 2}, {"threads", 2}, {"load_avg", {1.2, 1.0, 1.0}}, {"gemm_other_runnable", 1}};
  PointResult quiet, spread, waited;
  for (PointResult* r : {&quiet, &spread, &waited}) r->id.mechanism = "flash";
  quiet.reps = {{1.0, 1.0, 1, {}}, {1.01, 1.0, 1, {}}, {0.99, 1.0, 1, {}}};
  spread.reps = {{1.0, 1.0, 1, {}}, {1.5, 1.0, 1, {}}, {0.7, 1.0, 1, {}}};
  waited.reps = {{2.0, 1.0, 1, {}}, {2.0, 1.0, 1, {}}, {2.0, 1.0, 1, {}}};  // seconds per call
  auto has = [](const std::vector<std::string>& ws, const std::string& text) {
    return std::any_of(ws.begin(), ws.end(), [&](const std::string& w) { return w.find(text) != std::string::npos; });
  };
  auto w = measurement_warnings(ctx, {quiet});
  EXPECT_TRUE(has(w, "load average 1.20")) << "two threads on two CPUs with one busy";
  ctx["gemm_other_runnable"] = 0;
  EXPECT_FALSE(has(measurement_warnings(ctx, {quiet}), "load average")) << "a past load, nothing runnable now";
  ctx["load_avg"] = {0.1, 0.1, 0.1};
  EXPECT_TRUE(measurement_warnings(ctx, {quiet}).empty());
  EXPECT_TRUE(has(measurement_warnings(ctx, {spread}), "spread above 10%"));
  EXPECT_TRUE(has(measurement_warnings(ctx, {waited}), "2.0x"));
  ctx["gemm_other_runnable"] = 2;
  EXPECT_TRUE(has(measurement_warnings(ctx, {quiet}), "GEMM reference"));
  // The file carries them.
  attach_warnings(ctx, {spread});
  ASSERT_TRUE(ctx.contains("warnings"));
  EXPECT_EQ(ctx["warnings"].size(), 2u);
}

}  // namespace
}  // namespace ab
