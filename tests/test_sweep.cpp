// Sweeps, tables, the regression gate and merging, through the attnbench binary as a user runs
// them: isolation of crashing, killed and hanging points; resuming after an interrupt; shards.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sched.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "bench/results/table.hpp"
#include "bench/results/compare.hpp"
#include "bench/results/merge.hpp"
#include "bench/points/grid.hpp"
#include "bench/engine/instructions.hpp"
#include "bench/results/result_reader.hpp"
#include "bench/results/stats.hpp"
#include "bench/engine/sweep.hpp"
#include "tests/helpers.hpp"

extern char** environ;

namespace ab {
namespace {

using test::exec;

const std::string kFixture = std::string(ATTNBENCH_SOURCE_DIR) + "/tests/fixtures/sweep_small.json";
const char* kTiny = " --heads 1 --dhead 16 --reps 3 --min-time 0 --warmup 1 ";

// Starts `attnbench ARGS` in the background, its stderr into `log`; the pid, or -1.
pid_t start_attnbench(const std::string& args, const std::string& log) {
  std::vector<std::string> argv = {ATTNBENCH_EXE};
  std::istringstream ss(args);
  for (std::string w; ss >> w;) argv.push_back(w);
  std::vector<char*> cargv;
  for (auto& w : argv) cargv.push_back(w.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> point_names(const std::string& path) {
  std::set<std::string> out;
  for (const auto& r : read_result_file(path).points) out.insert(r.id.name());
  return out;
}

const PointResult* find_point(const ResultFile& f, const std::string& needle) {
  for (const auto& r : f.points)
    if (r.id.name().find(needle) != std::string::npos) return &r;
  return nullptr;
}

TEST(Stats, MannWhitneyExactMatchesHandCounts) {
  // m = n = 3: U takes 0..9 with counts 1 1 2 3 3 3 3 2 1 1 over C(6,3) = 20 orderings.
  auto r = mann_whitney({1, 3, 5}, {2, 4, 6});
  EXPECT_TRUE(r.exact);
  EXPECT_DOUBLE_EQ(r.u, 6);
  EXPECT_DOUBLE_EQ(r.p_greater, 7.0 / 20);
  EXPECT_DOUBLE_EQ(r.p_less, 16.0 / 20);
  EXPECT_DOUBLE_EQ(r.min_p, 1.0 / 20);
  r = mann_whitney({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10});
  EXPECT_DOUBLE_EQ(r.p_greater, 1.0 / 252);
  EXPECT_DOUBLE_EQ(r.p_less, 1.0);
}

TEST(Stats, MannWhitneyWithTiesUsesTheNormalApproximation) {
  const auto same = mann_whitney({1, 1, 1, 1}, {1, 1, 1, 1});
  EXPECT_FALSE(same.exact);
  EXPECT_DOUBLE_EQ(same.p_greater, 1.0);
  // Clearly larger with a tie across the samples: small p one way, large the other.
  const auto r = mann_whitney({1, 2, 3, 4, 5, 6, 7, 8}, {8, 9, 10, 11, 12, 13, 14, 15});
  EXPECT_FALSE(r.exact);
  EXPECT_LT(r.p_greater, 0.01);
  EXPECT_GT(r.p_less, 0.99);
}

TEST(Sweep, ShardsAreDisjointAndCoverTheGrid) {
  int i = 0, n = 0;
  parse_shard("2/3", &i, &n);
  EXPECT_EQ(i, 2);
  EXPECT_EQ(n, 3);
  for (const char* bad : {"0/3", "4/3", "1/0", "x/2", "1/", "/2", "12", "1/2/3", "-1/2"})
    EXPECT_THROW(parse_shard(bad, &i, &n), InvalidInput) << bad;
  std::vector<PointId> grid(10);
  for (int k = 0; k < 10; ++k) grid[k].shape.N = k;
  std::multiset<int64_t> seen;
  for (int s = 1; s <= 3; ++s)
    for (const auto& p : shard_of(grid, s, 3)) seen.insert(p.shape.N);
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 10u);
}

// The cluster path (scripts/slurm/submit.sh) relies on this: for any shard count, every point of
// the grid is in exactly one shard, and the shards' sizes differ by at most one.
TEST(Sweep, EveryShardCountCoversEveryPointExactlyOnce) {
  for (size_t size : {0, 1, 2, 6, 7, 12, 13, 100}) {
    std::vector<PointId> grid(size);
    for (size_t k = 0; k < size; ++k) grid[k].shape.N = static_cast<int64_t>(k);
    for (int n = 1; n <= 7; ++n) {
      std::vector<int> times(size, 0);
      size_t smallest = size, largest = 0;
      for (int s = 1; s <= n; ++s) {
        const auto part = shard_of(grid, s, n);
        smallest = std::min(smallest, part.size());
        largest = std::max(largest, part.size());
        for (const auto& p : part) ++times.at(static_cast<size_t>(p.shape.N));
      }
      for (size_t k = 0; k < size; ++k) EXPECT_EQ(times[k], 1) << "point " << k << " of " << size << ", " << n << " shards";
      EXPECT_LE(largest - smallest, 1u) << size << " points, " << n << " shards";
    }
  }
  // A grid of several dimensions as the CLI makes it: point names, not just indices, once each.
  GridOptions g;
  g.attn = {"local", "linear"};
  g.params = {"block=16,32"};
  g.text["seq"] = "64,128,256";
  g.text["threads"] = "1,2";
  g.text["mode"] = "fwd,fwdbwd";
  const auto real = g.grid();
  ASSERT_EQ(real.size(), 36u);  // local 2 blocks x 3 N x 2 threads x 2 modes + linear 3 x 2 x 2
  for (int n = 1; n <= 7; ++n) {
    std::multiset<std::string> names;
    for (int s = 1; s <= n; ++s)
      for (const auto& p : shard_of(real, s, n)) names.insert(p.name());
    EXPECT_EQ(names.size(), real.size()) << n << " shards";
    for (const auto& p : real) EXPECT_EQ(names.count(p.name()), 1u) << p.name() << ", " << n << " shards";
  }
}

TEST(Sweep, ListValuedOptionsMakeTheGrid) {
  const std::string path = test::temp_path("grid.json");
  std::filesystem::remove(path);
  auto e = exec("sweep --attn local --param block=16,32 --seq 64,128 --threads 1,2 --mode fwd,fwdbwd" +
                std::string(kTiny) + "--out " + path);
  ASSERT_EQ(e.code, 0) << e.out;
  const auto names = point_names(path);
  EXPECT_EQ(names.size(), 2u * 2 * 2 * 2);
  EXPECT_TRUE(names.count("attn:local/block:32/lookback:1/lookahead:1/level:attention/mode:fwdbwd/task:none/B:1/H:1/N:128/D:16/causal:0/threads:2"));
}

// The child of one point crashes, is killed as by the OOM killer, hangs, or exits with an
// error: that point gets its status, and every other point still runs.
struct Fault {
  const char* kind;
  const char* status;
  const char* message;
};
void PrintTo(const Fault& f, std::ostream* os) { *os << f.kind; }
class SweepIsolation : public ::testing::TestWithParam<Fault> {};

TEST_P(SweepIsolation, RecordsTheFailedPointAndContinues) {
  const Fault f = GetParam();
  const std::string path = test::temp_path(std::string("iso_") + f.kind + ".json");
  std::filesystem::remove(path);
  const auto t0 = std::chrono::steady_clock::now();
  auto e = exec("sweep --attn flash,linear --seq 64,128 --time-limit 3" + std::string(kTiny) + "--out " + path, true,
                std::string("ATTNBENCH_FAULT=") + f.kind + ":attn:flash/level:attention/mode:fwd/task:none/B:1/H:1/N:64/");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60);
  const ResultFile rf = read_result_file(path);
  ASSERT_EQ(rf.points.size(), 4u) << e.out;
  const PointResult* bad = find_point(rf, "attn:flash/level:attention/mode:fwd/task:none/B:1/H:1/N:64/");
  ASSERT_NE(bad, nullptr);
  EXPECT_STREQ(to_string(bad->status), f.status);
  EXPECT_NE(bad->message.find(f.message), std::string::npos) << bad->message;
  int ok = 0;
  for (const auto& r : rf.points) ok += r.status == Status::OK;
  EXPECT_EQ(ok, 3) << e.out;
  // The failed point's entry says so in Google Benchmark's terms.
  const auto doc = nlohmann::json::parse(slurp(path));
  bool found = false;
  for (const auto& b : doc["benchmarks"])
    if (b.value("error_occurred", false)) {
      found = true;
      EXPECT_EQ(b["error_message"].get<std::string>().rfind(f.status, 0), 0u);
    }
  EXPECT_TRUE(found);
}

INSTANTIATE_TEST_SUITE_P(All, SweepIsolation,
                         ::testing::Values(Fault{"crash", "CRASHED", "signal "},
                                           Fault{"kill", "OOM", "SIGKILL"},
                                           Fault{"hang", "TIMEOUT", "--time-limit"},
                                           Fault{"exit", "FAILED", "exit code 3"}),
                         [](const auto& info) { return std::string(info.param.kind); });

// --resume --retry-failed runs a failed point again (its entry replaced by the new attempt, the
// earlier status kept in the context's "retried"); a plain --resume leaves it; without --resume
// the flag exits 2 with nothing run.
TEST(Sweep, RetryFailedRunsTheFailedPointsAgainAndKeepsTheirEarlierStatus) {
  const std::string path = test::temp_path("retry.json");
  std::filesystem::remove(path);
  const std::string bad = "attn:flash/level:attention/mode:fwd/task:none/B:1/H:1/N:64/";
  const std::string args = "sweep --attn flash,linear --seq 64" + std::string(kTiny) + "--out " + path;
  auto e = exec(args, true, "ATTNBENCH_FAULT=exit:" + bad);
  ASSERT_EQ(e.code, 0) << e.out;
  ASSERT_EQ(find_point(read_result_file(path), bad)->status, Status::FAILED);
  // The dry run counts by the run's own rule what a resumption would still run: nothing for a
  // plain --resume, the failed point with --retry-failed.
  e = exec(args + " --resume --dry-run", true);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("dry run: 0 points (0 would run; 2 more of this grid already in " + path), std::string::npos)
      << e.out;
  e = exec(args + " --resume --retry-failed --dry-run", true);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("dry run: 1 points (1 would run; 1 more of this grid already in " + path), std::string::npos)
      << e.out;
  EXPECT_EQ(exec(args + " --retry-failed --dry-run", true).code, 2);
  EXPECT_EQ(find_point(read_result_file(path), bad)->status, Status::FAILED) << "a dry run changes nothing";
  e = exec(args + " --resume", true);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(find_point(read_result_file(path), bad)->status, Status::FAILED) << "a plain --resume keeps the failure";
  e = exec(args + " --retry-failed", true);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("--retry-failed goes with --resume"), std::string::npos) << e.out;
  e = exec(args + " --resume --retry-failed", true);
  ASSERT_EQ(e.code, 0) << e.out;
  const ResultFile rf = read_result_file(path);
  ASSERT_EQ(rf.points.size(), 2u);
  for (const auto& r : rf.points) EXPECT_EQ(r.status, Status::OK) << r.id.name();
  ASSERT_TRUE(rf.context.contains("retried")) << rf.context.dump();
  ASSERT_EQ(rf.context["retried"].size(), 1u);
  EXPECT_EQ(rf.context["retried"][0]["status"], "FAILED");
  EXPECT_EQ(rf.context["retried"][0]["point"].get<std::string>().rfind(bad, 0), 0u);
  EXPECT_NE(rf.context["retried"][0]["message"].get<std::string>().find("exit code 3"), std::string::npos);
  std::filesystem::remove(path);
}

// The CPUs this process may run on (two jobs need two).
int allowed_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) ADD_FAILURE() << "sched_getaffinity failed";
  return CPU_COUNT(&allowed);
}

// How many training runs of a sweep have logged a line under LOGS (they are training), once N
// have or after two minutes.
size_t wait_for_runs_logging(const std::filesystem::path& logs, size_t n) {
  auto logging = [&] {
    size_t k = 0;
    if (std::filesystem::exists(logs))
      for (const auto& f : std::filesystem::directory_iterator(logs)) k += std::filesystem::file_size(f.path()) > 0;
    return k;
  };
  const auto t0 = std::chrono::steady_clock::now();
  while (logging() < n && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return logging();
}

// --jobs 2: training runs two at a time, each child pinned to its own CPU, into one file with
// the same results as one at a time (a run's numbers do not depend on what runs beside it); a
// stop reaches every running child, each checkpoints, and the file stays valid. Timing sweeps
// and jobs that do not fit the CPUs are refused.
TEST(Sweep, JobsRunTrainingPointsTogetherWithTheResultsOfOneAtATime) {
  if (allowed_cpus() < 2) GTEST_SKIP() << "needs two CPUs";
  const std::string one = test::temp_path("jobs1.json"), two = test::temp_path("jobs2.json");
  for (const auto& p : {one, two}) {
    std::filesystem::remove(p);
    std::filesystem::remove_all(p + ".train");
  }
  const std::string grid =
      "sweep --verb train --attn flash,linear,local,bigbird --task copy --seq 64 --layers 1 --dmodel 16 --heads 1 "
      "--mlp 32 --batch 4 --steps 6 --eval-every 3 --eval-examples 8 --test-examples 8 --threads 1 ";
  auto e = exec(grid + "--out " + one, false);
  ASSERT_EQ(e.code, 0) << e.out;
  e = exec(grid + "--jobs 2 --out " + two, false);
  ASSERT_EQ(e.code, 0) << e.out;
  const ResultFile a = read_result_file(one), b = read_result_file(two);
  ASSERT_EQ(a.points.size(), 4u);
  ASSERT_EQ(b.points.size(), a.points.size());
  for (const auto& ra : a.points) {
    const PointResult* rb = find_point(b, ra.id.name());
    ASSERT_NE(rb, nullptr) << ra.id.name();
    EXPECT_EQ(rb->status, ra.status) << ra.id.name();
    ASSERT_EQ(rb->train.has_value(), ra.train.has_value()) << ra.id.name();
    if (!ra.train) continue;  // bigbird is not causal: SKIPPED in both
    EXPECT_EQ(rb->train->accuracy, ra.train->accuracy) << ra.id.name();
    EXPECT_EQ(rb->train->eval_loss, ra.train->eval_loss) << ra.id.name();
    EXPECT_EQ(rb->train->val_accuracy, ra.train->val_accuracy) << ra.id.name();
  }

  // Under a --mem-limit that holds either run but not both (0.74 and 0.54 MiB predicted), the
  // second starts only when the first has finished: a log line as each starts and ends shows it.
  const std::string limited = test::temp_path("jobs_mem.json");
  std::filesystem::remove(limited);
  e = exec("sweep --verb train --attn flash,linear --task copy --seq 64 --layers 1 --dmodel 16 --heads 1 --mlp 32 "
           "--batch 4 --steps 6 --eval-every 3 --eval-examples 8 --test-examples 8 --threads 1 --jobs 2 "
           "--mem-limit 1M --out " + limited, true);
  ASSERT_EQ(e.code, 0) << e.out;
  const auto lines = test::lines_of(e.out);
  auto line_index = [&](const std::string& prefix, bool started) {
    for (size_t i = 0; i < lines.size(); ++i)
      if (lines[i].rfind(prefix, 0) == 0 && (lines[i].find(" started |") != std::string::npos) == started) return i;
    return lines.size();
  };
  EXPECT_LT(line_index("[1/2] ", true), line_index("[1/2] ", false)) << e.out;
  EXPECT_LT(line_index("[1/2] ", false), line_index("[2/2] ", true)) << e.out;
  EXPECT_LT(line_index("[2/2] ", false), lines.size()) << e.out;
  std::filesystem::remove(limited);
  std::filesystem::remove_all(limited + ".train");

  // Refused, before anything runs: a timing sweep, zero jobs, more jobs than CPUs.
  e = exec("sweep --attn flash --seq 64" + std::string(kTiny) + "--jobs 2 --out " + test::temp_path("jobs_run.json"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("disturb each other's timings"), std::string::npos) << e.out;
  EXPECT_FALSE(std::filesystem::exists(test::temp_path("jobs_run.json")));
  for (const char* jobs : {"0", "100000"}) {
    e = exec(grid + "--jobs " + jobs + " --out " + test::temp_path("jobs_bad.json"));
    EXPECT_EQ(e.code, 2) << e.out;
    EXPECT_NE(e.out.find("--jobs " + std::string(jobs)), std::string::npos) << e.out;
    EXPECT_FALSE(std::filesystem::exists(test::temp_path("jobs_bad.json")));
  }

  // A preset takes it (its dry run divides the time by it); a plain train, whose runs share one
  // process, refuses it.
  e = exec("train --preset lra-accuracy --task listops --threads 1 --jobs 2 --out " + test::temp_path("jobs_preset.json") +
           " --dry-run");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("with --jobs 2"), std::string::npos) << e.out;
  e = exec("train --task copy --attn flash --steps 2 --jobs 2");
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("--jobs needs --preset"), std::string::npos) << e.out;

  // A stop while two runs are under way: both checkpoint, the sweep exits 130, nothing is lost.
  const std::string stopped = test::temp_path("jobs_stop.json"), log = test::temp_path("jobs_stop.log");
  std::filesystem::remove(stopped);
  std::filesystem::remove_all(stopped + ".train");
  const std::string args =
      "sweep --verb train --attn flash,linear --task copy --seq 128 --layers 1 --dmodel 32 --heads 1 --mlp 64 "
      "--batch 4 --steps 100000 --eval-every 50000 --eval-examples 8 --test-examples 8 --threads 1 --jobs 2 "
      "--checkpoint-every 100000 --log-every 10 --out " + stopped;
  const pid_t pid = start_attnbench(args, log);
  ASSERT_GT(pid, 0);
  // Both runs have logged a line: both are training.
  ASSERT_EQ(wait_for_runs_logging(stopped + ".train/logs", 2), 2u) << slurp(log);
  // The sweep's children (the two runs) are pinned to different CPUs.
  std::set<std::string> masks;
  for (const auto& d : std::filesystem::directory_iterator("/proc")) {
    std::ifstream st(d.path() / "status");
    std::string line, ppid, mask;
    while (std::getline(st, line)) {
      if (line.rfind("PPid:", 0) == 0) ppid = line.substr(line.find_first_not_of(" \t", 5));
      if (line.rfind("Cpus_allowed_list:", 0) == 0) mask = line.substr(line.find_first_not_of(" \t", 18));
    }
    if (ppid == std::to_string(pid)) masks.insert(mask);
  }
  EXPECT_EQ(masks.size(), 2u) << fmt::format("{}", fmt::join(masks, " | "));
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << slurp(log);
  EXPECT_EQ(WEXITSTATUS(status), 130) << slurp(log);
  EXPECT_EQ(read_result_file(stopped).points.size(), 0u);
  size_t checkpoints = 0;
  for (const auto& d : std::filesystem::directory_iterator(stopped + ".train/checkpoints"))
    checkpoints += std::filesystem::exists(d.path() / "checkpoint.bin");
  EXPECT_EQ(checkpoints, 2u) << "each running child checkpoints when stopped";
  for (const auto& p : {one, two, stopped}) std::filesystem::remove_all(p + ".train");
  for (const auto& p : {one, two, stopped, log}) std::filesystem::remove(p);
}

// An error in one job (here: the result file's directory is gone when a run finishes, so the
// file cannot be written) stops the run beside it as an interrupt would: it checkpoints, the
// sweep exits 1 naming the error, and its scratch directory is removed.
TEST(Sweep, AnErrorInOneJobStopsTheOtherWhichCheckpoints) {
  if (allowed_cpus() < 2) GTEST_SKIP() << "needs two CPUs";
  const std::filesystem::path out_dir = test::temp_path("jobs_error_out");
  const std::string train_dir = test::temp_path("jobs_error.train"), log = test::temp_path("jobs_error.log");
  std::filesystem::remove_all(out_dir);
  std::filesystem::remove_all(train_dir);
  std::filesystem::create_directories(out_dir);
  // Two runs of one model: 4,000 steps (seconds) and 100,000 (minutes, unless stopped).
  const std::string args =
      "sweep --verb train --attn linear --task copy --seq 128 --layers 1 --dmodel 32 --heads 1 --mlp 64 "
      "--batch 4 --steps 4000,100000 --eval-every 200000 --eval-examples 8 --test-examples 8 --threads 1 --jobs 2 "
      "--checkpoint-every 200000 --log-every 10 --train-dir " + train_dir + " --out " + (out_dir / "out.json").string();
  const pid_t pid = start_attnbench(args, log);
  ASSERT_GT(pid, 0);
  const std::filesystem::path logs = std::filesystem::path(train_dir) / "logs";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(wait_for_runs_logging(logs, 2), 2u) << slurp(log);
  std::filesystem::remove_all(out_dir);  // both run; the shorter one's result will have nowhere to go
  // The longer run alone would take minutes: the sweep must stop it well before.
  int status = 0;
  bool exited = false;
  while (!exited && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(300)) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  const std::string said = slurp(log);
  ASSERT_TRUE(exited) << "the run beside the error was not stopped\n" << said;
  ASSERT_TRUE(WIFEXITED(status)) << said;
  EXPECT_EQ(WEXITSTATUS(status), 1) << said;
  EXPECT_NE(said.find("cannot write " + (out_dir / "out.json").string()), std::string::npos) << said;
  // The longer run stopped short of its 100,000 steps and checkpointed where it stopped.
  bool long_run_seen = false;
  for (const auto& f : std::filesystem::directory_iterator(logs)) {
    const auto lines = test::lines_of(slurp(f.path().string()));
    ASSERT_FALSE(lines.empty()) << f.path();
    if (nlohmann::json::parse(lines.front())["point"].get<std::string>().find("/steps:100000/") == std::string::npos)
      continue;
    long_run_seen = true;
    int64_t last_step = 0;
    for (const auto& line : lines) last_step = std::max<int64_t>(last_step, nlohmann::json::parse(line).value("step", 0));
    EXPECT_GT(last_step, 0) << f.path();
    EXPECT_LT(last_step, 100000) << f.path();
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(train_dir) / "checkpoints" / f.path().stem() / "checkpoint.bin"))
        << "the stopped run checkpoints";
  }
  EXPECT_TRUE(long_run_seen);
  for (const auto& d : std::filesystem::directory_iterator(scratch_root()))
    EXPECT_NE(d.path().filename().string().rfind(fmt::format("attnbench-sweep-{}-", pid), 0), 0u)
        << d.path() << ": the sweep's scratch directory is left behind";
  std::filesystem::remove_all(train_dir);
  std::filesystem::remove(log);
}

TEST(Sweep, RefusesPointsPredictedAboveTheMemoryLimitWithoutRunningThem) {
  const std::string path = test::temp_path("memlimit.json");
  std::filesystem::remove(path);
  // vanilla at N=4096 with 8 heads holds 8 x 4096^2 floats of scores: 512 MiB; flash far less.
  auto e = exec("sweep --attn vanilla,flash --seq 4096 --heads 8 --dhead 16 --reps 1 --min-time 0 --mem-limit 256M --out " + path);
  ASSERT_EQ(e.code, 0) << e.out;
  const ResultFile rf = read_result_file(path);
  ASSERT_EQ(rf.points.size(), 2u);
  EXPECT_EQ(rf.points[0].status, Status::OOM);
  EXPECT_NE(rf.points[0].message.find("predicted"), std::string::npos) << rf.points[0].message;
  EXPECT_EQ(rf.points[1].status, Status::OK);
}

// Starts a sweep, checks the file parses every time it changes, interrupts it after two
// points, and resumes it.
TEST(Sweep, InterruptKeepsFinishedPointsAndResumeRunsOnlyTheMissing) {
  const std::string path = test::temp_path("resume.json"), log = test::temp_path("resume.log");
  std::filesystem::remove(path);
  const std::string args = "sweep --attn flash,linear --seq 64,128,256 --heads 1 --dhead 16 --reps 3 --min-time 0.15 --warmup 1 --out " + path;
  const pid_t pid = start_attnbench(args, log);
  ASSERT_GT(pid, 0);

  size_t seen_points = 0, versions = 0;
  std::string last;
  const auto t0 = std::chrono::steady_clock::now();
  while (seen_points < 2 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    const std::string now = slurp(path);
    if (!now.empty() && now != last) {
      last = now;
      ++versions;
      ResultFile rf;
      ASSERT_NO_THROW(rf = parse_result_document(nlohmann::json::parse(now), path)) << "not valid after a point";
      EXPECT_GE(rf.points.size(), seen_points);
      seen_points = rf.points.size();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(seen_points, 2u);
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130) << slurp(log);
  EXPECT_NE(slurp(log).find("interrupted"), std::string::npos) << slurp(log);
  EXPECT_GE(versions, 2u);

  const ResultFile before = read_result_file(path);
  ASSERT_GE(before.points.size(), 2u);
  ASSERT_LT(before.points.size(), 6u) << "the interrupt came too late to test resuming";
  for (const auto& r : before.points) EXPECT_EQ(r.status, Status::OK) << r.id.name() << " " << r.message;

  // Without --resume an existing file is refused and left alone.
  auto e = exec(args);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("--resume"), std::string::npos);
  EXPECT_EQ(read_result_file(path).points.size(), before.points.size());

  e = exec(args + " --resume");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find(fmt::format("{} already in", before.points.size())), std::string::npos) << e.out;
  EXPECT_NE(e.out.find(fmt::format("{} to run", 6 - before.points.size())), std::string::npos) << e.out;
  const ResultFile after = read_result_file(path);
  ASSERT_EQ(after.points.size(), 6u);
  // The points measured before the interrupt are kept as they were (to 4 ulp: the file stores
  // milliseconds and the reader converts to seconds, so a rewrite may move the last bit; a point
  // run again would differ by far more).
  for (size_t i = 0; i < before.points.size(); ++i) {
    EXPECT_EQ(after.points[i].id.name(), before.points[i].id.name());
    EXPECT_DOUBLE_EQ(after.points[i].reps.front().real_s, before.points[i].reps.front().real_s);
  }
  // The resumption names the points it added and where they ran (the context's machine and
  // commit are those of the run that began the file, which may be another machine).
  const auto resumed_by = nlohmann::json::parse(slurp(path))["context"]["resumed_by"];
  ASSERT_EQ(resumed_by.size(), 1u) << resumed_by.dump();
  std::vector<std::string> added;
  for (size_t i = before.points.size(); i < after.points.size(); ++i) added.push_back(after.points[i].id.name());
  EXPECT_EQ(resumed_by[0]["points"].get<std::vector<std::string>>(), added);
  EXPECT_EQ(resumed_by[0]["machine_id"], after.context["machine_id"]);
  EXPECT_FALSE(resumed_by[0]["git_commit"].get<std::string>().empty());
  EXPECT_NE(resumed_by[0]["command"].get<std::string>().find("--resume"), std::string::npos);
}

TEST(Sweep, ResumeRefusesACorruptFileAndLeavesIt) {
  const std::string path = test::temp_path("corrupt.json");
  std::string text = slurp(kFixture);
  text.resize(text.size() / 2);  // a file cut off mid-write by something else
  std::ofstream(path) << text;
  auto e = exec("sweep --attn flash --seq 64" + std::string(kTiny) + "--out " + path + " --resume");
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("not valid JSON"), std::string::npos) << e.out;
  EXPECT_EQ(std::count(e.out.begin(), e.out.end(), '\n'), 1) << e.out;
  EXPECT_EQ(slurp(path), text);
}

TEST(Table, FixtureGivesTheExpectedMarkdown) {
  auto e = exec("table " + kFixture + " --metric time --baseline vanilla", false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(e.out, slurp(std::string(ATTNBENCH_SOURCE_DIR) + "/tests/fixtures/sweep_small_time.md"));
}

TEST(Table, OtherMetricsAndFormats) {
  auto e = exec("table " + kFixture + " --metric memory --baseline flash --format latex", false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("\\begin{tabular}{lrr}"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("flash & "), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("(1.0$\\times$)"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("CRASHED"), std::string::npos) << e.out;
  e = exec("table " + kFixture + " --metric gflops --format csv", false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(e.out.rfind("table,mechanism,N=64,N=64 ratio,N=128,N=128 ratio\n", 0), 0u) << e.out;
  // Ratios: flash's GFLOP/s over vanilla's, at N=64, from the file's own medians.
  const ResultFile rf = read_result_file(kFixture);
  const double fl = rf.points[2].flops / real_stats(rf.points[2]).median,
               va = rf.points[0].flops / real_stats(rf.points[0]).median;
  EXPECT_NE(e.out.find(fmt::format(",{:.4g},", fl / va)), std::string::npos) << e.out;
  for (const char* bad : {"--metric speed", "--format xml", "--baseline nosuch"}) {
    e = exec("table " + kFixture + " " + bad);
    EXPECT_EQ(e.code, 2) << bad << ": " << e.out;
  }
}

// --growth: each cell's ratio is its own row's value at the previous N, from the file's medians;
// the first column and a failed point have none; it cannot be combined with --baseline.
TEST(Table, GrowthIsTheRatioToTheRowsPreviousN) {
  const ResultFile rf = read_result_file(kFixture);
  auto median_of = [&](const std::string& mech, int64_t n) {
    for (const auto& p : rf.points)
      if (p.id.mechanism == mech && p.id.shape.N == n) return real_stats(p).median;
    ADD_FAILURE() << mech << " N=" << n << " is not in the fixture";
    return 0.0;
  };
  auto e = exec("table " + kFixture + " --growth --format csv", false);
  ASSERT_EQ(e.code, 0) << e.out;
  for (const char* mech : {"vanilla", "flash", "local"}) {
    const double g = median_of(mech, 128) / median_of(mech, 64);
    EXPECT_NE(e.out.find(fmt::format(",{},", mech)), std::string::npos) << e.out;
    EXPECT_NE(e.out.find(fmt::format(",{:.4g}\n", g)), std::string::npos) << mech << ": " << e.out;
  }
  EXPECT_NE(e.out.find(",linear,"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find(",CRASHED,\n"), std::string::npos) << e.out;  // no growth for a failed point
  e = exec("table " + kFixture + " --growth", false);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("growth from the previous N"), std::string::npos) << e.out;
  // The markdown row: the N=64 cell bare, the N=128 cell with its growth in two decimals.
  const size_t at = e.out.find("| flash | ");
  ASSERT_NE(at, std::string::npos) << e.out;
  const std::string line = e.out.substr(at, e.out.find('\n', at) - at);
  const double g = median_of("flash", 128) / median_of("flash", 64);
  EXPECT_EQ(std::count(line.begin(), line.end(), '('), 1) << line;
  EXPECT_NE(line.find(fmt::format(" ({:.2f}x) |", g)), std::string::npos) << line;
  e = exec("table " + kFixture + " --growth --baseline flash");
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("excludes"), std::string::npos) << e.out;
}

TEST(Compare, AFileAgainstItselfPassesAndAgainstSlowerTimesFails) {
  auto e = exec("compare " + kFixture + " " + kFixture + " --any-machine");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("no regression"), std::string::npos) << e.out;

  auto doc = nlohmann::json::parse(slurp(kFixture));
  for (auto& b : doc["benchmarks"])
    if (b["run_type"] == "iteration") {
      b["real_time"] = b["real_time"].get<double>() * 1.5;
      b["cpu_time"] = b["cpu_time"].get<double>() * 1.5;
    }
  const std::string slower = test::temp_path("slower.json");
  std::ofstream(slower) << doc.dump();
  e = exec("compare " + kFixture + " " + slower + " --any-machine");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("REGRESSION: slower"), std::string::npos) << e.out;
  // Reversed, the same files show an improvement and pass.
  e = exec("compare " + slower + " " + kFixture + " --any-machine");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("faster"), std::string::npos) << e.out;
  // A 50% slowdown is within a 60% tolerance.
  e = exec("compare " + kFixture + " " + slower + " --max-regress 0.6 --any-machine");
  EXPECT_EQ(e.code, 0) << e.out;
}

// --per-gemm: times in units of each run's own GEMM rate. A machine twice as slow everywhere (its
// times doubled, its GEMM rate and each point's GFLOP/s halved) passes; a kernel twice as slow on
// the same machine still fails; --per-gemm is for times only.
TEST(Compare, PerGemmCancelsAUniformlySlowerMachineButNotASlowerKernel) {
  const auto scaled = [&](double time_factor, double gemm_factor, const std::string& file) {
    auto doc = nlohmann::json::parse(slurp(kFixture));
    doc["context"]["gemm_gflops_per_s_1thread"] = doc["context"]["gemm_gflops_per_s_1thread"].get<double>() * gemm_factor;
    for (auto& b : doc["benchmarks"])
      if (b["run_type"] == "iteration") {
        b["real_time"] = b["real_time"].get<double>() * time_factor;
        b["cpu_time"] = b["cpu_time"].get<double>() * time_factor;
        if (b.contains("gflops_per_s")) b["gflops_per_s"] = b["gflops_per_s"].get<double>() / time_factor;
        if (b.contains("peak_fraction"))
          b["peak_fraction"] = b["peak_fraction"].get<double>() / time_factor / gemm_factor;
      }
    const std::string path = test::temp_path(file);
    std::ofstream(path) << doc.dump();
    return path;
  };
  const std::string busy_machine = scaled(2.0, 0.5, "busy_machine.json");
  const std::string slower_kernel = scaled(2.0, 1.0, "slower_kernel.json");
  auto e = exec("compare " + kFixture + " " + busy_machine + " --any-machine");
  EXPECT_EQ(e.code, 1) << e.out;
  e = exec("compare " + kFixture + " " + busy_machine + " --any-machine --per-gemm");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("GEMM GFLOP"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("REGRESSION"), std::string::npos) << e.out;
  e = exec("compare " + kFixture + " " + slower_kernel + " --any-machine --per-gemm");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("REGRESSION: slower"), std::string::npos) << e.out;
  e = exec("compare " + kFixture + " " + busy_machine + " --metric memory --per-gemm");
  EXPECT_EQ(e.code, 2) << e.out;
}

// A slower median is not enough: overlapping repetitions (p well above alpha) pass the gate.
TEST(Compare, ASlowerMedianWithoutSignificanceIsNotARegression) {
  auto base = nlohmann::json::parse(slurp(kFixture)), next = base;
  const double b[] = {10, 11, 12, 13, 14}, n[] = {10.5, 11.5, 13, 14.5, 15};  // median +8%
  for (auto* doc : {&base, &next}) {
    const double* v = doc == &base ? b : n;
    for (auto& e : (*doc)["benchmarks"])
      if (e["run_type"] == "iteration" && e["run_name"].get<std::string>().find("attn:vanilla/") == 0)
        e["real_time"] = v[e["repetition_index"].get<int>()];
  }
  const std::string pb = test::temp_path("overlap_base.json"), pn = test::temp_path("overlap_new.json");
  std::ofstream(pb) << base.dump();
  std::ofstream(pn) << next.dump();
  auto e = exec("compare " + pb + " " + pn + " --any-machine");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("+8.3%"), std::string::npos) << e.out;
}

TEST(Compare, MemoryGrowthAndNewFailuresAreRegressions) {
  auto doc = nlohmann::json::parse(slurp(kFixture));
  for (auto& b : doc["benchmarks"])
    if (b["run_name"].get<std::string>().find("attn:local/") == 0 && b.contains("peak_bytes"))
      b["peak_bytes"] = b["peak_bytes"].get<double>() * 1.2;
  const std::string bigger = test::temp_path("bigger.json");
  std::ofstream(bigger) << doc.dump();
  auto e = exec("compare " + kFixture + " " + bigger + " --any-machine");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("REGRESSION: memory +20.0%"), std::string::npos) << e.out;

  // A point that ran in BASE and crashes in NEW fails the gate.
  doc = nlohmann::json::parse(slurp(kFixture));
  for (auto& b : doc["benchmarks"])
    if (b["run_name"].get<std::string>().find("attn:vanilla/") == 0 && b["run_name"].get<std::string>().find("/N:64/") != std::string::npos) {
      b["error_occurred"] = true;
      b["error_message"] = "CRASHED: signal 11";
    }
  const std::string crashed = test::temp_path("crashed.json");
  std::ofstream(crashed) << doc.dump();
  e = exec("compare " + kFixture + " " + crashed + " --any-machine");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("REGRESSION: now CRASHED"), std::string::npos) << e.out;
}

TEST(Compare, InstructionCountsUseAPlainThreshold) {
  auto doc = nlohmann::json::parse(slurp(kFixture));
  for (auto& b : doc["benchmarks"])
    if (!b.value("error_occurred", false)) b["instructions"] = 1000000.0;
  const std::string base = test::temp_path("ins_base.json"), more = test::temp_path("ins_more.json");
  std::ofstream(base) << doc.dump();
  for (auto& b : doc["benchmarks"])
    if (b["run_name"].get<std::string>().find("attn:flash/") == 0 && !b.value("error_occurred", false))
      b["instructions"] = 1030000.0;
  std::ofstream(more) << doc.dump();
  auto e = exec("compare " + base + " " + more + " --metric instructions --max-regress 0.01");
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_NE(e.out.find("REGRESSION: more instructions"), std::string::npos) << e.out;
  e = exec("compare " + base + " " + more + " --metric instructions --max-regress 0.05");
  EXPECT_EQ(e.code, 0) << e.out;
}

// Wall times of two machines are refused (exit 3); instructions and memory are compared, and
// --any-machine compares the times anyway.
TEST(Compare, WallTimesFromAnotherMachineAreNotCompared) {
  auto doc = nlohmann::json::parse(slurp(kFixture));
  doc["context"]["machine_id"] = "zen3-avx2-l1d32k-l2512k-2cpu";
  const std::string here = test::temp_path("machine_here.json"), there = test::temp_path("machine_there.json");
  std::ofstream(here) << doc.dump();
  doc["context"]["machine_id"] = "zen5-avx512-l1d48k-l21024k-2cpu";
  std::ofstream(there) << doc.dump();
  auto e = exec("compare " + here + " " + there);
  EXPECT_EQ(e.code, 3) << e.out;
  EXPECT_NE(e.out.find("not comparable"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("| point |"), std::string::npos) << e.out;
  e = exec("compare " + here + " " + there + " --any-machine");
  EXPECT_EQ(e.code, 0) << e.out;
  e = exec("compare " + here + " " + there + " --metric memory");
  EXPECT_EQ(e.code, 0) << e.out;
  e = exec("compare " + here + " " + here);
  EXPECT_EQ(e.code, 0) << e.out;
  // A file older than machine_id names no machine: its wall times are not compared either.
  e = exec("compare " + kFixture + " " + here);
  EXPECT_EQ(e.code, 3) << e.out;
  EXPECT_NE(e.out.find("does not name its machine"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("| point |"), std::string::npos) << e.out;
  e = exec("compare " + kFixture + " " + here + " --any-machine");
  EXPECT_EQ(e.code, 0) << e.out;
  // A file written by this build names its machine.
  const std::string ran = test::temp_path("machine_ran.json");
  e = exec("run --attn flash --seq 32 --heads 1 --dhead 8 --reps 1 --min-time 0 --out " + ran, false);
  ASSERT_EQ(e.code, 0) << e.out;
  const auto ctx = nlohmann::json::parse(slurp(ran))["context"];
  EXPECT_FALSE(ctx.value("machine_id", "").empty());
  EXPECT_NE(ctx.value("machine_id", "").find(ctx.value("cpu_isa", "?")), std::string::npos);
}

TEST(Compare, BadInputExitsTwo) {
  const std::string other = test::temp_path("other.json");
  auto e = exec("run --attn flash --seq 32 --heads 1 --dhead 8 --reps 1 --min-time 0 --out " + other, false);
  ASSERT_EQ(e.code, 0);
  for (const std::string& args : {"compare " + kFixture + " " + other, "compare " + kFixture + " /nonexistent.json",
                                  "compare " + kFixture + " " + kFixture + " --metric speed",
                                  "compare " + kFixture + " " + kFixture + " --alpha 2"}) {
    e = exec(args);
    EXPECT_EQ(e.code, 2) << args << ": " << e.out;
    EXPECT_EQ(std::count(e.out.begin(), e.out.end(), '\n'), 1) << e.out;
  }
}

// A file written before a mechanism had one of its parameters names the point without it. Read,
// the point has that parameter at its default, so it joins today's file by name and a gate still
// compares it (the CI baselines of two machines had lost `performer` this way when it gained
// `redraw`). A point the new file lacks is reported on stderr, not passed over.
TEST(Compare, APointNamedBeforeAParameterExistedIsTodaysPointAtItsDefault) {
  // older: local's points without lookahead (default 1, the fixture's value) or with another value.
  auto older_file = [&](const std::string& lookahead_segment, const std::string& path) {
    auto doc = nlohmann::json::parse(slurp(kFixture));
    for (auto& b : doc["benchmarks"]) {
      for (const char* key : {"name", "run_name"}) {
        std::string n = b[key];
        const size_t at = n.find("/lookahead:1/");
        if (n.rfind("attn:local/", 0) == 0 && at != std::string::npos)
          b[key] = n.replace(at, 13, lookahead_segment + "/");
      }
      if (b.contains("point") && b["point"]["attn"] == "local") {
        if (lookahead_segment.empty()) b["point"]["params"].erase("lookahead");
        else b["point"]["params"]["lookahead"] = lookahead_segment.substr(lookahead_segment.find(':') + 1);
      }
    }
    std::ofstream(path) << doc.dump();
  };
  const std::string older = test::temp_path("before_lookahead.json"), other = test::temp_path("lookahead_2.json");
  older_file("", older);
  ASSERT_EQ(slurp(older).find("/lookahead:"), std::string::npos);
  EXPECT_EQ(point_names(older), point_names(kFixture));
  auto e = exec("compare " + older + " " + kFixture + " --any-machine --format csv");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(e.out.find("missing"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find(",new\n"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("attn:local/block:64/lookback:1/lookahead:1/"), std::string::npos) << e.out;

  // Another value is another point: not compared, and the gate says so.
  older_file("/lookahead:2", other);
  e = exec("compare " + other + " " + kFixture + " --any-machine --format csv");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("lookahead:2/level:attention/mode:fwd/task:none/B:1/H:1/N:64/D:16/causal:0/threads:1,,,,,missing in new"),
            std::string::npos) << e.out;
  EXPECT_NE(e.out.find("compare: warning: 2 point(s) of " + other + " are missing in " + kFixture), std::string::npos) << e.out;
}

TEST(Merge, ShardsTogetherEqualTheWholeGridAndACarriedPointCountsOnce) {
  const std::string grid = "sweep --attn flash,linear,local --seq 64,128" + std::string(kTiny);
  const std::string whole = test::temp_path("whole.json"), s1 = test::temp_path("s1.json"),
                    s2 = test::temp_path("s2.json"), merged = test::temp_path("merged.json");
  for (const auto& p : {whole, s1, s2, merged}) std::filesystem::remove(p);
  ASSERT_EQ(exec(grid + "--out " + whole).code, 0);
  ASSERT_EQ(exec(grid + "--out " + s1 + " --shard 1/2").code, 0);
  ASSERT_EQ(exec(grid + "--out " + s2 + " --shard 2/2").code, 0);
  const auto a = point_names(s1), b = point_names(s2);
  EXPECT_FALSE(a.empty());
  EXPECT_FALSE(b.empty());
  for (const auto& n : a) EXPECT_FALSE(b.count(n)) << n << " is in both shards";
  auto e = exec("merge " + s1 + " " + s2 + " --out " + merged);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(point_names(merged), point_names(whole));
  const auto ctx = nlohmann::json::parse(slurp(merged))["context"];
  EXPECT_EQ(ctx["merged_from"].size(), 2u);
  // Each source names its machine: the merged context is the first source's, and a chart of the
  // file names every machine its runs came from (scripts/plot.py bubbles).
  for (const auto& source : ctx["merged_from"]) {
    EXPECT_FALSE(source.value("machine_id", "").empty());
    EXPECT_EQ(source["machine_id"], ctx["machine_id"]);
  }

  // A shard resumed from the merged file (the grid moved to another machine) carries the other
  // shard's points: the same result in two files is one point. Two different results for one
  // point, one file given twice, or another CPU model is refused.
  const std::string resumed = test::temp_path("s2_resumed.json"), remerged = test::temp_path("remerged.json");
  std::filesystem::remove(remerged);
  std::filesystem::copy_file(merged, resumed, std::filesystem::copy_options::overwrite_existing);
  ASSERT_EQ(exec(grid + "--out " + resumed + " --shard 2/2 --resume").code, 0);  // nothing left: read and written again
  e = exec("merge " + s1 + " " + resumed + " --out " + remerged);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_EQ(point_names(remerged), point_names(whole));
  EXPECT_EQ(nlohmann::json::parse(slurp(remerged))["benchmarks"].size(), nlohmann::json::parse(slurp(merged))["benchmarks"].size());
  // Each source's resumptions (the points they added and where) stay in merged_from.
  const auto sources = nlohmann::json::parse(slurp(remerged))["context"]["merged_from"];
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_TRUE(sources[0]["resumed_by"].empty());
  ASSERT_EQ(sources[1]["resumed_by"].size(), 1u);
  EXPECT_TRUE(sources[1]["resumed_by"][0]["points"].empty()) << "nothing was left to run";
  // A result read and written again may move in its last digit (times are kept in seconds and
  // written in their unit): still the same result.
  auto changed = nlohmann::json::parse(slurp(s1));
  changed["benchmarks"][0]["real_time"] = changed["benchmarks"][0]["real_time"].get<double>() * (1 + 4e-16);
  const std::string rewritten = test::temp_path("s1_rewritten.json");
  std::ofstream(rewritten) << changed.dump();
  std::filesystem::remove(remerged);
  e = exec("merge " + s1 + " " + rewritten + " --out " + remerged);
  EXPECT_EQ(e.code, 0) << e.out;
  changed = nlohmann::json::parse(slurp(s1));
  changed["benchmarks"][0]["real_time"] = changed["benchmarks"][0]["real_time"].get<double>() * 2;
  const std::string remeasured = test::temp_path("s1_remeasured.json");
  std::ofstream(remeasured) << changed.dump();
  e = exec("merge " + s1 + " " + remeasured + " --out " + test::temp_path("twice.json"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("is in both"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("different results"), std::string::npos) << e.out;
  e = exec("merge " + s1 + " " + s1 + " --out " + test::temp_path("twice.json"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("given twice"), std::string::npos) << e.out;
  EXPECT_FALSE(std::filesystem::exists(test::temp_path("twice.json")));
  auto doc = nlohmann::json::parse(slurp(s2));
  doc["context"]["cpu_model"] = "Some Other CPU";
  const std::string other = test::temp_path("s2_other.json");
  std::ofstream(other) << doc.dump();
  e = exec("merge " + s1 + " " + other + " --out " + test::temp_path("mixed.json"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("--allow-mixed-cpus"), std::string::npos) << e.out;
  e = exec("merge " + s1 + " " + other + " --allow-mixed-cpus --out " + test::temp_path("mixed.json"));
  EXPECT_EQ(e.code, 0) << e.out;
}

// The count leaves out glibc's allocator, whose instructions depend on the heap's layout and so on
// how the process was started. A profile in callgrind's own format: compressed names defined on
// a call line (cfn=) and used later (fn=), a call's inclusive cost line that must not be counted
// twice, and allocator functions recognised by their source file and by their exported name.
TEST(Instructions, ProfileReaderSeparatesTheAllocator) {
  const std::string profile =
      "# callgrind format\nversion: 1\npositions: line\nevents: Ir\nsummary: 1175\n\n"
      "ob=(1) /build/attnbench\nfl=(1) ???\nfn=(1) ab::kernel\n0 1000\n"
      "cob=(2) /usr/lib/x86_64-linux-gnu/libc.so.6\ncfi=(2) ./malloc/./malloc/malloc.c\ncfn=(2) malloc\n"
      "calls=3 0\n0 120\n"
      "cob=(2)\ncfi=(3) ???\ncfn=(4) free\ncalls=1 0\n0 30\n"
      "+2 25\n\n"
      "ob=(2)\nfl=(2)\nfn=(2)\n0 70\ncfn=(3) _int_malloc.constprop.0\ncalls=1 0\n0 50\n"
      "fn=(3)\n0 50\n\n"
      "fl=(3)\nfn=(4)\n0 30\n"
      "\ntotals: 1175\n";
  std::istringstream in(profile);
  const CallgrindCount c = read_callgrind_profile(in);
  EXPECT_EQ(c.total, 1175);  // ab::kernel 1000 + 25, the rest below
  EXPECT_EQ(c.allocator, 150);  // malloc 70 + _int_malloc 50 (malloc.c) + free 30 (by name)

  std::string wrong = profile;
  wrong.replace(wrong.find("totals: 1175"), 12, "totals: 1174");
  std::istringstream bad(wrong);
  EXPECT_THROW(read_callgrind_profile(bad), std::runtime_error);
}

TEST(Instructions, CountedDeterministicallyOrRefusedWithTheReason) {
  const std::string args = "run --attn linear --seq 64 --heads 1 --dhead 16 --reps 1 --min-time 0 --instructions --format json";
#if defined(__AVX512F__) || defined(__SANITIZE_ADDRESS__)
#if defined(__AVX512F__)
  const char* reason = "without AVX-512";
#else
  const char* reason = "without AddressSanitizer";
#endif
  auto e = exec(args);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find(reason), std::string::npos) << e.out;
#else
  double counts[2] = {0, 0};
  for (double& c : counts) {
    auto e = exec(args, false);
    ASSERT_EQ(e.code, 0) << e.out;
    const auto doc = nlohmann::json::parse(e.out);
    c = doc["benchmarks"][0]["instructions"].get<double>();
  }
  EXPECT_GT(counts[0], 1e4);
  EXPECT_EQ(counts[0], counts[1]);
#endif
}

}  // namespace
}  // namespace ab

namespace ab {
namespace {
// A sweep's points share flash's reference output through a cache (one flash call per input
// shape); the errors are the ones `run` computes with the reference made afresh.
TEST(Sweep, ErrorsWithTheSharedReferenceEqualRunsOwn) {
  const std::string swept = test::temp_path("nmse_sweep.json"), ran = test::temp_path("nmse_run.json");
  for (const auto& p : {swept, ran}) std::filesystem::remove(p);
  const std::string grid = "--attn linear,reformer,performer --seq 64,128 --error" + std::string(kTiny);
  ASSERT_EQ(exec("sweep " + grid + "--out " + swept).code, 0);
  ASSERT_EQ(exec("run " + grid + "--out " + ran, false).code, 0);
  const ResultFile a = read_result_file(swept), b = read_result_file(ran);
  ASSERT_EQ(a.points.size(), 6u);
  for (const auto& p : a.points) {
    const PointResult* q = find_point(b, p.id.name());
    ASSERT_NE(q, nullptr) << p.id.name();
    ASSERT_TRUE(p.nmse && q->nmse) << p.id.name();
    EXPECT_EQ(*p.nmse, *q->nmse) << p.id.name();
    EXPECT_GT(*p.nmse, 0) << p.id.name();
  }
}

// A timed repetition the process was stopped and continued in holds the pause: the repetitions
// start over (at most twice), and one kept with a pause in it is named in the message. Here
// SIGCONT arrives every 2 ms for the whole run, so every repetition (0.2 s each) sees one.
TEST(Run, RepetitionsAcrossAStopStartOver) {
  const std::string out = test::temp_path("run_paused.json"), log = test::temp_path("run_paused.log");
  std::filesystem::remove(out);
  const pid_t pid = start_attnbench("run --attn flash --seq 64 --batch 1 --heads 1 --dhead 16 --reps 2 --min-time 0.2 "
                                    "--warmup 1 --out " + out, log);
  ASSERT_GT(pid, 0);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(log);
  const ResultFile f = read_result_file(out);
  ASSERT_EQ(f.points.size(), 1u);
  EXPECT_EQ(f.points[0].reps.size(), 2u);
  EXPECT_NE(f.points[0].message.find("the repetitions started over 2 times, and a repetition kept holds a pause"),
            std::string::npos) << f.points[0].message;
  std::filesystem::remove(out);
  std::filesystem::remove(log);
}

}  // namespace
}  // namespace ab
