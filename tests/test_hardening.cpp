// Hardening (issue 31): no input, file or fault may delete data, crash, hang or fake a result.
// Each test reproduces a failure seen before its fix and asserts the fixed behaviour: the user's
// files untouched, the exit code, a message naming the thing.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <thread>
#include <cstdlib>
#include <fstream>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/points/grid.hpp"
#include "tests/helpers.hpp"

namespace ab {
namespace {
namespace fs = std::filesystem;
using test::exec;

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

const std::string kDump = "dump --attn flash --seq 16 --heads 1 --dhead 4 --out ";

// 1. dump never removes what it did not make: an existing directory with the user's files, a
// file, '.', '..' are refused; an empty directory and its own earlier dump are written.
TEST(Hardening, DumpNeverDeletesTheUsersFiles) {
  const fs::path dir = test::temp_path("dump_user_dir");
  fs::remove_all(dir);
  fs::create_directories(dir);
  write(dir / "notes.txt", "mine");
  auto e = exec(kDump + dir.string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find(dir.string()), std::string::npos) << e.out;
  EXPECT_EQ(slurp(dir / "notes.txt"), "mine");
  EXPECT_FALSE(fs::exists(dir / "config.json"));

  const fs::path file = test::temp_path("dump_user_file.json");
  write(file, "{}");
  e = exec(kDump + file.string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_TRUE(fs::is_regular_file(file));
  EXPECT_EQ(slurp(file), "{}");

  // '.' and '..' name the user's directories too. Run from inside a sandbox (never from the
  // build directory: before the fix, '.' emptied the current directory).
  const fs::path sandbox = test::temp_path("dump_sandbox");
  fs::remove_all(sandbox);
  fs::create_directories(sandbox / "inner");
  write(sandbox / "outer.txt", "outer");
  write(sandbox / "inner" / "inner.txt", "inner");
  for (const char* special : {".", "..", "./", "../inner/."}) {
    const std::string cmd = "cd " + (sandbox / "inner").string() + " && " + ATTNBENCH_EXE + " " + kDump + special + " 2>&1";
    const int st = std::system(cmd.c_str());
    EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 2) << special;
    EXPECT_EQ(slurp(sandbox / "outer.txt"), "outer") << special;
    EXPECT_EQ(slurp(sandbox / "inner" / "inner.txt"), "inner") << special;
  }
  fs::remove_all(sandbox);

  // An empty directory is used; run again, the dump replaces its own earlier one.
  const fs::path empty = test::temp_path("dump_empty_dir");
  fs::remove_all(empty);
  fs::create_directories(empty);
  e = exec(kDump + empty.string());
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(fs::exists(empty / "config.json"));
  e = exec(kDump + empty.string());
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(fs::exists(empty / "q.npy"));
  // ... but not once the user has added a file of their own to it.
  write(empty / "analysis.py", "print(1)");
  e = exec(kDump + empty.string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_EQ(slurp(empty / "analysis.py"), "print(1)");
  EXPECT_TRUE(fs::exists(empty / "q.npy"));
  // No scratch directory is left beside it.
  for (const auto& entry : fs::directory_iterator(empty.parent_path()))
    EXPECT_EQ(entry.path().filename().string().find("." + empty.filename().string() + ".tmp"), std::string::npos)
        << entry.path();
  fs::remove_all(dir);
  fs::remove_all(empty);
  fs::remove(file);
}

// 16. run --out and merge --out refuse an existing file unless --force.
TEST(Hardening, RunAndMergeRefuseToOverwriteWithoutForce) {
  const fs::path out = test::temp_path("existing_result.json");
  write(out, "precious");
  const std::string run = "run --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + out.string();
  auto e = exec(run);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("--force"), std::string::npos) << e.out;
  EXPECT_EQ(slurp(out), "precious");

  const fs::path a = test::temp_path("merge_a.json");
  fs::remove(a);
  ASSERT_EQ(exec("run --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + a.string()).code, 0);
  e = exec("merge " + a.string() + " --out " + out.string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_EQ(slurp(out), "precious");

  e = exec(run + " --force");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(slurp(out), "precious");
  fs::remove(out);
  fs::remove(a);
}

// 5. --out through a symbolic link writes the file it points to and keeps the link.
TEST(Hardening, OutThroughASymlinkWritesItsTarget) {
  const fs::path target = test::temp_path("link_target.json"), link = test::temp_path("link.json");
  fs::remove(target);
  fs::remove(link);
  fs::create_symlink(target, link);
  auto e = exec("run --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + link.string());
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::is_regular_file(target));
  EXPECT_TRUE(nlohmann::json::accept(slurp(target)));
  // A sweep resumed through the link adds its points to the file the link names.
  e = exec("sweep --attn flash,linear --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --resume --out " + link.string());
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_NE(slurp(target).find("attn:linear"), std::string::npos) << "the real file has the resumed sweep's points";
  fs::remove(link);
  fs::remove(target);
}

// 3. An --out that cannot be written is refused before the first point runs.
TEST(Hardening, UnwritableOutIsRefusedBeforeRunning) {
  const std::string out = "/nonexistent_dir_attnbench/x.json";
  auto e = exec("run --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + out);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("/nonexistent_dir_attnbench"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("[1/1]"), std::string::npos) << "no point may run: " << e.out;
}


// A process's command line, its arguments joined by spaces ("" once it is gone: a process can
// exit between a listing and the read, and its cmdline then fails with ESRCH, which libstdc++
// throws from the stream buffer).
std::string command_line(long pid) {
  std::string cmd;
  try {
    std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
    cmd.assign(std::istreambuf_iterator<char>(f), {});
  } catch (const std::exception&) {
    return "";
  }
  std::replace(cmd.begin(), cmd.end(), '\0', ' ');
  return cmd;
}

// The processes whose command line contains `marker` (from /proc).
std::vector<long> processes_with(const std::string& marker) {
  std::vector<long> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmd = command_line(std::stol(name));
    if (cmd.find(marker) != std::string::npos && cmd.find("attnbench") != std::string::npos) out.push_back(std::stol(name));
  }
  return out;
}

// Whether every process marked by `marker` has exited within `seconds`; any left is killed, so a
// failing test never leaves one behind.
bool all_gone_within(const std::string& marker, double seconds) {
  bool gone = false;
  for (int i = 0; i < static_cast<int>(seconds * 20) && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = processes_with(marker).empty();
  }
  for (long p : processes_with(marker)) kill(static_cast<pid_t>(p), SIGKILL);
  return gone;
}

// Starts, in the background, a sweep whose one child hangs (ATTNBENCH_FAULT), its command lines
// marked by `marker`; returns the sweep's pid once its child is running, or 0 with `why` saying
// what was seen instead (every marked process is then killed).
long start_hanging_sweep(const fs::path& out, const std::string& marker, std::string* why) {
  const fs::path pidfile = out.string() + ".pid";
  fs::remove(out);
  fs::remove(pidfile);
  const std::string cmd = "ATTNBENCH_FAULT=hang:N:16 " + std::string(ATTNBENCH_EXE) +
                          " sweep --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --time-limit 0 " + marker +
                          " --out " + out.string() + " >/dev/null 2>&1 & echo $! > " + pidfile.string();
  auto fail = [&](const std::string& r) {
    *why = r;
    all_gone_within(marker, 0);
    return 0L;
  };
  if (std::system(cmd.c_str()) != 0) return fail("the shell that starts the sweep failed");
  long sweep_pid = 0;
  std::ifstream(pidfile) >> sweep_pid;  // written before std::system returned
  fs::remove(pidfile);
  if (sweep_pid <= 0) return fail("no pid in " + pidfile.string());
  // The child is the marked process that is not the sweep and runs the `run` verb (a process
  // the sweep has forked but not yet turned into the child still shows the sweep's command
  // line). Up to 60 s: under a loaded ctest -j 2 the sweep's start can take seconds.
  auto child_running = [&] {
    for (long p : processes_with(marker))
      if (p != sweep_pid && command_line(p).find(" run ") != std::string::npos) return true;
    return false;
  };
  for (int i = 0; i < 1200; ++i) {
    if (child_running()) return sweep_pid;
    if (::kill(static_cast<pid_t>(sweep_pid), 0) != 0)
      return fail(fmt::format("the sweep (pid {}) exited before its child was seen; its file: {}", sweep_pid,
                              fs::exists(out) ? slurp(out.string()) : "none"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return fail(fmt::format("no child of the sweep (pid {}) ran within 60 s; its file: {}", sweep_pid,
                          fs::exists(out) ? slurp(out.string()) : "none"));
}

// 4. A sweep killed by SIGKILL takes its running child with it (before, the child ran on with no
// time limit).
TEST(Hardening, KilledSweepTakesItsChildWithIt) {
  const fs::path out = test::temp_path("orphan_sweep.json");
  const std::string marker = "--seed 918273";
  std::string why;
  const long sweep_pid = start_hanging_sweep(out, marker, &why);
  ASSERT_GT(sweep_pid, 0) << why;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(static_cast<pid_t>(sweep_pid), SIGKILL);
  EXPECT_TRUE(all_gone_within(marker, 5.0)) << "the child outlived the sweep";
  fs::remove(out);
}

// A scheduler stops a job by signalling every process in it (Slurm's scancel, a time limit,
// preemption), one after another: the running point's child may die of SIGTERM before the sweep
// gets its own. The stopped point is left for --resume, not recorded as CRASHED (a requeued shard
// would then never run it again).
TEST(Hardening, SweepStoppedWithItsChildLeavesThePointForResume) {
  const fs::path out = test::temp_path("group_stopped_sweep.json");
  const std::string marker = "--seed 736251";
  std::string why;
  const long sweep_pid = start_hanging_sweep(out, marker, &why);
  ASSERT_GT(sweep_pid, 0) << why;
  for (long p : processes_with(marker))
    if (p != sweep_pid) kill(static_cast<pid_t>(p), SIGTERM);  // the child first
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(static_cast<pid_t>(sweep_pid), SIGTERM);
  ASSERT_TRUE(all_gone_within(marker, 10.0)) << "the sweep or its child did not stop";
  const auto doc = nlohmann::json::parse(std::ifstream(out));
  EXPECT_TRUE(doc.at("benchmarks").empty()) << doc.at("benchmarks").dump();
  auto e = test::exec("sweep --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 " + marker + " --out " +
                      out.string() + " --status");
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("1 points, 0 done, 0 failed, 1 left"), std::string::npos) << e.out;
  fs::remove(out);
}

TEST(Hardening, TimeLimitMustBeFinite) {
  for (const char* v : {"nan", "inf", "1e309", "-1"}) {
    const std::string out = test::temp_path("never_written.json");
    auto e = test::exec("sweep --attn flash --seq 16 --out " + out + " --time-limit " + v);
    EXPECT_EQ(e.code, 2) << v << ": " << e.out;
    EXPECT_FALSE(fs::exists(out));
  }
}


// 6, 7, 12. Sizes and ranges that overflow, grids too large to make, and limits that are not
// numbers are refused at once with exit 2 (before: overflow, memory exhaustion, or silence).
TEST(Hardening, OverflowingSizesRangesAndLimitsExitTwoAtOnce) {
  const std::string base = "run --attn flash,linear --reps 1 --min-time 0 ";
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"--seq 1:9223372036854775807:x2", "exceed any machine"},  // 63 values, the last ones too large
      {"--seq 1:100000000:+1", "more than 10000 values"},
      {"--seq 9223372036854775807", "exceed any machine"},
      {"--seq 100000000 --heads 1000000 --batch 1000000", "exceed any machine"},
      {"--seq 16 --heads 1 --batch 2:4000:+1 --dhead 1:40:+1 --threads 1,2", "more than 100000 points"},
      {"--seq 16 --mem-limit 0.5", "memory size"},
      {"--seq 16 --min-time inf", "--min-time"},
      {"--seq 16 --min-time nan", "--min-time"},
      {"--seq 16 --seed ''", "--seed"},
  };
  // A point over the memory limit is refused before its mechanism lays anything out (bigbird's
  // segments at N = 10^7 took minutes), in run (exit 2) and in a sweep's plan (an OOM row).
  auto e = test::exec("run --attn bigbird --seq 10000000 --mem-limit 1G");
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("above --mem-limit"), std::string::npos) << e.out;
  const std::string swept = test::temp_path("oom_sweep.json");
  std::filesystem::remove(swept);
  e = test::exec("sweep --attn all --seq 10000000 --mem-limit 1G --out " + swept);
  EXPECT_EQ(e.code, 0) << e.out;
  std::filesystem::remove(swept);
  for (const auto& c : cases) {
    auto e = test::exec(base + c.args);
    EXPECT_EQ(e.code, 2) << c.args << ": " << e.out;
    EXPECT_NE(e.out.find(c.says), std::string::npos) << c.args << ": " << e.out;
  }
}


// 2. Two writers of one result file: the second is refused, naming the first's pid (before,
// both exited 0 and one sweep's points were lost).
TEST(Hardening, SecondWriterOfAResultFileIsRefused) {
  const fs::path out = test::temp_path("locked_sweep.json");
  const std::string marker = "--seed 827364";
  std::string why;
  const long sweep_pid = start_hanging_sweep(out, marker, &why);  // holds the lock while its child hangs
  ASSERT_GT(sweep_pid, 0) << why;
  auto e = test::exec("sweep --attn linear --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --resume --out " + out.string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("pid " + std::to_string(sweep_pid)), std::string::npos) << e.out;
  e = test::exec("train --task copy --seq 16 --layers 1 --dmodel 8 --heads 1 --mlp 8 --steps 1 --out " + out.string());
  EXPECT_EQ(e.code, 2) << e.out;
  kill(static_cast<pid_t>(sweep_pid), SIGKILL);
  all_gone_within(marker, 5.0);
  // A user's file that only has the lock file's name is neither written over nor removed.
  const fs::path other = test::temp_path("user_lock.json");
  write(other.string() + ".lock", "my notes");
  e = test::exec("sweep --attn linear --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + other.string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_EQ(slurp(other.string() + ".lock"), "my notes");
  fs::remove(other.string() + ".lock");
  // The holder is gone (killed: its lock file stays behind), and the lock went with it.
  e = test::exec("sweep --attn linear --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --resume --out " + out.string());
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_FALSE(fs::exists(out.string() + ".lock")) << "a finished writer removes its lock file";
  fs::remove(out);
  fs::remove(out.string() + ".lock");
}


// A valid one-point result file, written by the binary (the malformed ones below are edits of it).
nlohmann::json small_result(const std::string& name) {
  const fs::path p = test::temp_path(name);
  fs::remove(p);
  const auto e = test::exec("run --attn flash --seq 16 --heads 1 --dhead 4 --reps 2 --min-time 0 --out " + p.string());
  EXPECT_EQ(e.code, 0) << e.out;
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// 8, 9, 10. Every reader refuses, with exit 2 and the file named, a file that is not a regular
// file, nests too deep, or holds fields of the wrong type or range (before: a stack overflow, a
// hang, or exit 1 with a raw library message, which for compare reads as a regression).
TEST(Hardening, MalformedResultFilesExitTwoNamingTheFile) {
  const nlohmann::json good = small_result("reader_good.json");
  const fs::path good_path = test::temp_path("reader_good.json");
  std::vector<std::pair<std::string, std::string>> cases;  // (what, file text)
  auto edited = [&](const std::string& what, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json d = good;
    edit(d);
    cases.push_back({what, d.dump()});
  };
  edited("context is an array", [](nlohmann::json& d) { d["context"] = nlohmann::json::array({1}); });
  edited("numeric machine_id", [](nlohmann::json& d) { d["context"]["machine_id"] = 7; });
  edited("error_occurred is a string", [](nlohmann::json& d) { d["benchmarks"][0]["error_occurred"] = "yes"; });
  edited("negative time", [](nlohmann::json& d) { d["benchmarks"][0]["real_time"] = -1.0; });
  edited("zero time", [](nlohmann::json& d) { d["benchmarks"][0]["real_time"] = 0.0; });
  edited("zero iterations", [](nlohmann::json& d) { d["benchmarks"][0]["iterations"] = 0; });
  edited("fractional iterations", [](nlohmann::json& d) { d["benchmarks"][0]["iterations"] = 1.5; });
  edited("negative memory", [](nlohmann::json& d) { d["benchmarks"][0]["peak_bytes"] = -5.0; });
  edited("no time_unit", [](nlohmann::json& d) { d["benchmarks"][0].erase("time_unit"); });
  edited("no repetition_index", [](nlohmann::json& d) { d["benchmarks"][0].erase("repetition_index"); });
  edited("a repetition twice", [](nlohmann::json& d) { d["benchmarks"][1]["repetition_index"] = d["benchmarks"][0]["repetition_index"]; });
  edited("no points", [](nlohmann::json& d) { d["benchmarks"] = nlohmann::json::array(); });
  std::string text = good.dump();
  cases.push_back({"real_time 1e309", text.replace(text.find("\"real_time\":") + 12, 1, "1e309,\"x\":")});
  cases.push_back({"nested 200000 deep", std::string(200000, '[') + std::string(200000, ']')});
  for (size_t i = 0; i < cases.size(); ++i) {
    const fs::path bad = test::temp_path("reader_bad_" + std::to_string(i) + ".json");
    write(bad, cases[i].second);
    std::vector<std::string> verbs = {"table " + bad.string(), "compare " + good_path.string() + " " + bad.string(),
                                      "compare " + bad.string() + " " + good_path.string()};
    // An empty file is a valid (empty) shard to merge; every other case is refused by merge too.
    if (cases[i].first != "no points") verbs.push_back("merge " + bad.string() + " --out " + bad.string() + ".merged");
    for (const std::string& verb : verbs) {
      const auto e = test::exec(verb);
      EXPECT_EQ(e.code, 2) << cases[i].first << ": " << verb << ": " << e.out.substr(0, 300);
      EXPECT_NE(e.out.find(bad.string()), std::string::npos) << cases[i].first << ": " << e.out.substr(0, 300);
      EXPECT_FALSE(fs::exists(bad.string() + ".merged"));
    }
    fs::remove(bad);
  }
  // A FIFO would block a reader forever; a directory is not a file.
  const fs::path fifo = test::temp_path("reader_fifo.json");
  fs::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  for (const fs::path& p : {fifo, test::test_dir()}) {
    const auto e = test::exec("table " + p.string());
    EXPECT_EQ(e.code, 2) << e.out;
    EXPECT_NE(e.out.find("not a regular file"), std::string::npos) << e.out;
  }
  fs::remove(fifo);
  // 11. A gate on instruction counts against a base without them is an input error, not a pass.
  const auto e = test::exec("compare " + good_path.string() + " " + good_path.string() + " --metric instructions");
  EXPECT_EQ(e.code, 2) << e.out;
  fs::remove(good_path);
}

// 14, 15. An error line stays short whatever it quotes, and a point's label re-runs through sh -c
// even when an argument has spaces or quotes.
TEST(Hardening, ErrorLinesAreBoundedAndLabelsAreShellQuoted) {
  const auto e = test::exec("run --attn " + std::string(100000, 'x'));
  EXPECT_EQ(e.code, 2);
  EXPECT_LT(e.out.size(), 600u) << e.out.substr(0, 600);
  EXPECT_EQ(std::count(e.out.begin(), e.out.end(), '\n'), 1) << e.out.substr(0, 600);

  EXPECT_EQ(shell_quote("plain-256:x2"), "plain-256:x2");
  EXPECT_EQ(shell_quote("my data"), "'my data'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
  // A data directory with a space and a quote in its name: the label names it so that sh -c
  // passes it back as one argument.
  const fs::path dir = test::temp_path("my data's dir");
  fs::remove_all(dir);
  fs::create_directories(dir);
  write(dir / "text.tsv", "1\tgood good good\n0\tbad bad bad\n1\tgood\n0\tbad\n1\tgood\n0\tbad\n1\tgood\n0\tbad\n1\tgood\n0\tbad\n"
                           "1\tgood\n0\tbad\n1\tgood\n0\tbad\n1\tgood\n0\tbad\n1\tgood\n0\tbad\n1\tgood\n0\tbad\n");
  const fs::path out = test::temp_path("quoted_label.json");
  fs::remove(out);
  const std::string args = "run --level model --task text --seq 64 --batch 2 --layers 1 --dmodel 8 --heads 1 --mlp 8 --mode fwd "
                           "--reps 1 --min-time 0 --data-dir " + shell_quote(dir.string()) + " --out " + out.string();
  const int st = std::system((std::string(ATTNBENCH_EXE) + " " + args + " >/dev/null 2>&1").c_str());
  ASSERT_EQ(WEXITSTATUS(st), 0);
  std::ifstream f(out);
  const auto doc = nlohmann::json::parse(f);
  std::string label = doc["benchmarks"][0]["label"].get<std::string>();
  ASSERT_EQ(label.rfind("attnbench ", 0), 0u) << label;
  label.replace(0, std::string("attnbench").size(), ATTNBENCH_EXE);
  const int again = std::system(("sh -c " + shell_quote(label + " >/dev/null 2>&1")).c_str());
  EXPECT_EQ(WEXITSTATUS(again), 0) << label;
  fs::remove_all(dir);
  fs::remove(out);
}


// 9, 12, 13. Data files that are directories or FIFOs, a --png path that is a file, and out-of-range
// counts are refused with exit 2 naming the path or the option (before: exit 1 with a library
// message, a hang, or an overflow).
TEST(Hardening, TaskInputsThatAreNotFilesOrOutOfRangeExitTwo) {
  const fs::path file = test::temp_path("png_is_a_file");
  write(file, "mine");
  auto e = test::exec("task sample --task image --count 1 --png " + file.string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find(file.string()), std::string::npos) << e.out;
  EXPECT_EQ(slurp(file), "mine");
  fs::remove(file);

  const fs::path dir = test::temp_path("data_dir_with_a_dir");
  fs::remove_all(dir);
  fs::create_directories(dir / "text.tsv");  // a directory where the file should be
  e = test::exec("train --task text --seq 64 --layers 1 --dmodel 8 --heads 1 --mlp 8 --steps 1 --data-dir " + dir.string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("not a regular file"), std::string::npos) << e.out;
  fs::remove_all(dir / "text.tsv");
  ASSERT_EQ(mkfifo((dir / "text.tsv").c_str(), 0644), 0);
  e = test::exec("train --task text --seq 64 --layers 1 --dmodel 8 --heads 1 --mlp 8 --steps 1 --data-dir " + dir.string());
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("not a regular file"), std::string::npos) << e.out;
  fs::remove_all(dir);

  for (const std::string bad : {"task sample --task listops --first 9223372036854775000", "task sample --task listops --count 0",
                                "task rate --task copy --threads 100000", "run --level model --task text --mlp 1000000000000"}) {
    e = test::exec(bad);
    EXPECT_EQ(e.code, 2) << bad << ": " << e.out;
  }
}

// 3. What a killed run leaves behind (its scratch directory, a half-written FILE.tmp.PID) is
// removed at the next start, with a message; a live process's is not touched.
TEST(Hardening, LeftoversOfAKilledRunAreRemovedAtTheNextStart) {
  long dead = 4000000;
  while (dead > 1000 && !(kill(static_cast<pid_t>(dead), 0) != 0 && errno == ESRCH)) --dead;
  const fs::path stale_dir = fs::path(scratch_root()) / ("attnbench-sweep-" + std::to_string(dead) + "-abcdef");
  const fs::path live_dir = fs::path(scratch_root()) / ("attnbench-sweep-" + std::to_string(getpid()) + "-abcdef");
  for (const auto& d : {stale_dir, live_dir}) {
    fs::create_directories(d);
    write(d / "point.json", "{}");
  }
  const fs::path out = test::temp_path("leftovers.json");
  fs::remove(out);
  const fs::path stale_tmp = out.string() + ".tmp." + std::to_string(dead);
  write(stale_tmp, "half a file");
  const auto e = test::exec("sweep --attn flash --seq 16 --heads 1 --dhead 4 --reps 1 --min-time 0 --out " + out.string());
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_FALSE(fs::exists(stale_dir)) << e.out;
  EXPECT_FALSE(fs::exists(stale_tmp)) << e.out;
  EXPECT_TRUE(fs::exists(live_dir / "point.json")) << "a live process's scratch is left alone";
  EXPECT_NE(e.out.find("removed " + stale_dir.string()), std::string::npos) << e.out;
  fs::remove_all(live_dir);
  fs::remove_all(stale_dir);
  fs::remove(out);
}

// 3. A write that fails (here: a file-size limit, as a full disk would) loses nothing: dump exits
// 1 with no partial directory, run exits 1 with its result file on stdout instead.
TEST(Hardening, FailedWritesLoseNothingAndLeaveNothing) {
  const fs::path dir = test::temp_path("full_disk_dump"), out = test::temp_path("full_disk_run.json");
  fs::remove_all(dir);
  fs::remove(out);
  // SIGXFSZ ignored, so a write past the limit fails with EFBIG instead of killing the process.
  auto sh = [](const std::string& args) {
    const std::string cmd = "sh -c " + shell_quote("trap '' XFSZ; ulimit -f 4; " + std::string(ATTNBENCH_EXE) + " " + args) + " 2>&1";
    test::Exec e;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) e.out.append(buf, n);
    const int st = pclose(p);
    e.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return e;
  };
  auto e = sh("dump --attn flash --seq 256 --heads 2 --dhead 32 --out " + dir.string());
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_FALSE(fs::exists(dir)) << e.out;
  for (const auto& entry : fs::directory_iterator(dir.parent_path()))
    EXPECT_EQ(entry.path().filename().string().find("." + dir.filename().string() + ".tmp"), std::string::npos) << entry.path();
  e = sh("run --attn flash,linear,local,sliding --seq 64,128 --heads 1 --dhead 4 --reps 3 --min-time 0 --out " + out.string());
  EXPECT_EQ(e.code, 1) << e.out.substr(0, 300);
  EXPECT_NE(e.out.find("written to stdout instead"), std::string::npos);
  EXPECT_NE(e.out.find("\"benchmarks\""), std::string::npos) << "the results are on stdout";
  EXPECT_FALSE(fs::exists(out) && fs::file_size(out) > 0 && !nlohmann::json::accept(slurp(out)));
  fs::remove(out);
}

}  // namespace
}  // namespace ab
