#include "bench/engine/sweep.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "bench/points/grid.hpp"
#include "bench/engine/plan.hpp"
#include "bench/engine/train.hpp"
#include "bench/process/process.hpp"
#include "bench/results/result_reader.hpp"
#include "bench/results/result_writer.hpp"
#include "bench/text/terminal.hpp"
#include "bench/results/warnings.hpp"
#include "core/files.hpp"
#include "core/matmul.hpp"
#include "core/stop_signals.hpp"

namespace ab {

void parse_shard(const std::string& text, int* index, int* count) {
  const auto slash = text.find('/');
  char* end = nullptr;
  long i = 0, n = 0;
  bool ok = slash != std::string::npos;
  if (ok) {
    i = std::strtol(text.c_str(), &end, 10);
    ok = end == text.c_str() + slash;
  }
  if (ok) {
    n = std::strtol(text.c_str() + slash + 1, &end, 10);
    ok = *end == '\0' && slash + 1 < text.size();
  }
  if (!ok || n < 1 || i < 1 || i > n)
    throw InvalidInput(fmt::format("--shard '{}' is not i/n with 1 <= i <= n (e.g. 2/4)", text));
  *index = static_cast<int>(i);
  *count = static_cast<int>(n);
}

std::vector<PointId> shard_of(const std::vector<PointId>& grid, int index, int count) {
  std::vector<PointId> out;
  for (size_t k = static_cast<size_t>(index - 1); k < grid.size(); k += static_cast<size_t>(count))
    out.push_back(grid[k]);
  return out;
}

namespace {

std::atomic<bool> g_interrupted{false};
void on_interrupt(int) { g_interrupted = true; }

// Checks the options a sweep's run and its dry run refuse alike, and returns the CPUs of each of
// --jobs N jobs: disjoint sets of as many CPUs as the grid's points have threads, from those this
// process may use, so that runs at the same time do not share a core. Empty for one job (nothing
// pinned, as a plain sweep always was). Throws InvalidInput.
std::vector<std::vector<int>> check_options_and_place_jobs(const SweepOptions& so, const std::vector<PointId>& grid) {
  if (so.retry_failed && !so.resume)
    throw InvalidInput("--retry-failed goes with --resume: it runs again the failed points of an existing --out");
  int threads = 1;
  for (const auto& id : grid) threads = std::max(threads, id.threads);
  if (so.jobs < 1) throw InvalidInput(fmt::format("--jobs {} is not a number of points >= 1 to run at once", so.jobs));
  if (so.jobs == 1) return {};
  if (so.verb != "train")
    throw InvalidInput(fmt::format("--jobs {} runs points at the same time, which would disturb each other's timings; it is "
                                   "for training runs (sweep --verb train, train --preset), whose accuracy does not depend on it",
                                   so.jobs));
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
    throw std::runtime_error(fmt::format("sched_getaffinity: {}", std::strerror(errno)));
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const size_t need = static_cast<size_t>(so.jobs) * static_cast<size_t>(threads);
  if (need > cpus.size())
    throw InvalidInput(fmt::format("--jobs {} of {} thread(s) each need {} CPUs; this process may use {}", so.jobs, threads,
                                   need, cpus.size()));
  std::vector<std::vector<int>> out(static_cast<size_t>(so.jobs));
  for (size_t j = 0; j < out.size(); ++j)
    out[j].assign(cpus.begin() + static_cast<std::ptrdiff_t>(j * static_cast<size_t>(threads)),
                  cpus.begin() + static_cast<std::ptrdiff_t>((j + 1) * static_cast<size_t>(threads)));
  return out;
}

// Pins the calling thread to `cpus`; a child process it starts inherits the mask.
void pin_this_thread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) throw std::runtime_error(fmt::format("pthread_setaffinity_np: {}", std::strerror(rc)));
}


std::string duration(double s) {
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, t % 3600 / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

// Time left, from a least-squares line seconds = a + b * flops over the points run so far: the
// points of a sweep grow in cost, so an average of the finished ones would underestimate.
struct Eta {
  double n = 0, sf = 0, se = 0, sff = 0, sfe = 0;
  void add(double flops, double seconds) {
    n += 1;
    sf += flops;
    se += seconds;
    sff += flops * flops;
    sfe += flops * seconds;
  }
  double predict(double flops) const {
    if (n == 0) return 0;
    const double var = sff - sf * sf / n;
    double b = var > 0 ? (sfe - sf * se / n) / var : 0;
    b = std::max(b, 0.0);
    const double a = std::max(se / n - b * sf / n, 0.0);
    return a + b * flops;
  }
};

PointResult error_result(const PointId& id, const RunOptions& opts, Status s, std::string msg) {
  PointResult r;
  r.id = id;
  r.label = point_label(id, opts);
  r.status = s;
  r.message = std::move(msg);
  return r;
}

// Runs one point as `attnbench run ...` in a child process and turns whatever happened to it
// into a result.
PointResult run_isolated(const PointId& id, const RunOptions& opts, const SweepOptions& so, double gemm,
                         const std::filesystem::path& dir, bool* interrupted) {
  namespace fs = std::filesystem;
  const std::string json = (dir / "point.json").string(), err = (dir / "stderr").string();
  fs::remove(json);
  std::vector<std::string> argv = {self_executable()};
  for (const auto& a : point_args(id, opts)) argv.push_back(a);
  std::vector<std::string> extra = {"--format", "json", "--out", json};
  if (id.training()) {
    // Its own checkpoint and learning curve under the sweep's training directory, resumed from
    // there when an earlier sweep was stopped in the middle of it.
    const fs::path run = fs::path(so.train_dir) / "checkpoints" / run_directory_name(id);
    for (const auto& a : {std::string("--checkpoint"), run.string(), std::string("--resume"), std::string("--log"),
                          (fs::path(so.train_dir) / "logs" / (run_directory_name(id) + ".jsonl")).string(),
                          std::string("--checkpoint-every"), std::to_string(so.checkpoint_every), std::string("--log-every"),
                          std::to_string(so.log_every)})
      extra.push_back(a);
  } else {
    for (const auto& a : {std::string("--gemm-gflops"), fmt::format("{}", gemm), std::string("--mem-limit"),
                          std::to_string(opts.mem_limit)})
      extra.push_back(a);
    if (opts.error) {
      extra.push_back("--reference-dir");
      extra.push_back((dir / "references").string());
    }
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  const double time_limit = so.time_limit_s;
  const ChildOutcome o = run_child(argv, "/dev/null", err, time_limit, &g_interrupted, id.training() ? 600.0 : 2.0);
  const std::string last = last_line_of(err);
  auto with_last = [&](std::string m) { return last.empty() ? m : m + "; last output: " + last; };
  // A scheduler stopping the job (Slurm's scancel, a time limit, preemption) signals every process
  // of it one by one, the child too, which may die before the sweep's own signal arrives. So a child
  // stopped by SIGTERM or SIGINT (or a training run that stopped on one, exit 130) gives that signal
  // a moment; a point that did not finish while the sweep was being stopped is left for --resume.
  const bool finished = o.kind == ChildOutcome::Exited && o.exit_code == 0;
  const bool stopped = (o.kind == ChildOutcome::Signaled && (o.signal == SIGTERM || o.signal == SIGINT)) ||
                       (o.kind == ChildOutcome::Exited && o.exit_code == 130);
  for (int i = 0; stopped && !g_interrupted && i < 40; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (g_interrupted && !finished) {
    *interrupted = true;
    return error_result(id, opts, Status::FAILED, "interrupted");
  }
  switch (o.kind) {
    case ChildOutcome::Interrupted:
      *interrupted = true;
      return error_result(id, opts, Status::FAILED, "interrupted");
    case ChildOutcome::TimedOut:
      return error_result(id, opts, Status::TIMEOUT, fmt::format("still running after {:g} s (--time-limit); stopped", time_limit));
    case ChildOutcome::Signaled:
      if (o.signal == SIGKILL)
        return error_result(id, opts, Status::OOM,
                            fmt::format("killed by SIGKILL, as the kernel's out-of-memory killer does (peak RSS {})",
                                        format_gib(static_cast<double>(o.max_rss_kib) * 1024)));
      return error_result(id, opts, Status::CRASHED, with_last(o.describe()));
    case ChildOutcome::SpawnFailed:
      return error_result(id, opts, Status::FAILED, o.describe());
    case ChildOutcome::Exited:
      break;
  }
  if (o.exit_code != 0) {
    // A training run that failed records why in its entry, then exits 1: its words are better.
    if (o.exit_code == 1 && fs::exists(json)) try {
        ResultFile rf = read_result_file(json);
        if (rf.points.size() == 1 && rf.points.front().status != Status::OK) return rf.points.front();
      } catch (const InvalidInput&) {
      }
    return error_result(id, opts, Status::FAILED, with_last(o.describe()));
  }
  try {
    ResultFile rf = read_result_file(json);
    if (rf.points.size() != 1) throw InvalidInput(fmt::format("{} points in the child's file", rf.points.size()));
    return rf.points.front();
  } catch (const InvalidInput& e) {
    return error_result(id, opts, Status::FAILED, with_last(fmt::format("the child's result is unreadable: {}", e.what())));
  }
}

}  // namespace

int run_sweep(const std::vector<PointId>& full_grid, const RunOptions& opts, const SweepOptions& so) {
  namespace fs = std::filesystem;
  const std::vector<PointId> grid = shard_of(full_grid, so.shard_index, so.shard_count);
  const std::vector<std::vector<int>> job_cpus = check_options_and_place_jobs(so, grid);

  // Validate every point before running any, and predict each one's memory.
  struct Planned {
    PointId id;
    Status status = Status::OK;
    std::string message;
    double flops = 0;
    size_t bytes = 0;  // predicted peak memory
  };
  std::vector<Planned> plan;
  RunOptions plan_opts = opts;
  plan_opts.oom_as_status = true;  // a point over --mem-limit is a row marked OOM, not an abort
  for (const auto& id : grid) {
    PreparedPoint pp = prepare_point(id, plan_opts);
    Planned p{id, pp.status, pp.message, pp.flops, pp.status == Status::OK ? pp.predicted_bytes : 0};
    if (p.status == Status::OOM) p.message += "; not run";
    plan.push_back(std::move(p));
  }

  // The output file: new, or resumed.
  std::vector<PointResult> results;
  std::set<std::string> done;
  nlohmann::json context;
  // One writer at a time: the file is read (for --resume) and saved under the lock.
  std::optional<ResultFileLock> lock;
  if (so.out != "-") {
    require_writable_file("--out", so.out);  // before any point runs
    lock.emplace(so.out);
  }
  if (so.verb == "train") {  // the runs' checkpoints and logs go here: a file, a loop or a read-only disk is refused now
    make_directory("--train-dir", so.train_dir);
    make_directory("--train-dir", (fs::path(so.train_dir) / "logs").string());
    make_directory("--train-dir", (fs::path(so.train_dir) / "checkpoints").string());
  }
  std::optional<size_t> resumption_index;  // this resumption's entry in context.resumed_by
  std::set<int> thread_counts;
  for (const auto& p : plan) thread_counts.insert(p.id.threads);
  const GemmReference gemm = gemm_reference(opts.gemm_gflops, thread_counts);
  const int threads = grid.empty() ? 1 : grid.front().threads;  // the context's thread count
  if (fs::exists(so.out)) {
    if (!so.resume)
      throw InvalidInput(fmt::format("{} exists; pass --resume to continue that sweep, or choose another --out", so.out));
    ResultFile rf = read_result_file(so.out);
    context = rf.context;
    for (auto& r : rf.points) {
      if (!kept_on_resume(r, so)) {
        // Run again; what the earlier attempt said is kept.
        context["retried"].push_back({{"point", r.id.name()}, {"status", to_string(r.status)}, {"message", r.message},
                                      {"by", so.command}});
        continue;
      }
      done.insert(r.id.name());
      results.push_back(std::move(r));
    }
    // A resumed file's context describes the machine and binary that began it; the points this
    // resumption adds may come from another machine or commit, so it names them and where they ran.
    const nlohmann::json here = run_context(so.command, opts.seed, threads, gemm.one_thread);
    nlohmann::json resumption = {{"command", so.command}, {"points", nlohmann::json::array()}};
    for (const char* k : {"date", "host_name", "cpu_model", "machine_id", "git_commit"}) resumption[k] = here.value(k, "");
    resumption["gemm_gflops_per_s_1thread"] = gemm.one_thread;
    context["resumed_by"].push_back(std::move(resumption));
    resumption_index = context["resumed_by"].size() - 1;
  } else {
    context = run_context(so.command, opts.seed, threads, gemm.one_thread);
    gemm.record(context);
    if (so.shard_count > 1) context["shard"] = fmt::format("{}/{}", so.shard_index, so.shard_count);
  }
  auto save = [&] { write_file_atomic(so.out, results_document(context, results).dump(2) + "\n"); };

  size_t todo = 0;
  for (const auto& p : plan) todo += done.count(p.id.name()) ? 0 : 1;
  ProgressLine progress;
  progress.message(fmt::format("sweep: {} points{}, {} already in {}, {} to run", plan.size(),
                           so.shard_count > 1 ? fmt::format(" (shard {}/{})", so.shard_index, so.shard_count) : "",
                           plan.size() - todo, so.out, todo));
  save();  // the file exists and is valid from the start

  const fs::path dir = make_scratch_dir("sweep");
  std::optional<StopSignalHandler> stop_signals(std::in_place, on_interrupt);  // the old handlers are back at reset() below
  g_interrupted = false;

  Eta eta;
  const auto t_start = std::chrono::steady_clock::now();
  auto since_start = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };
  double flops_left = 0;
  size_t left = todo;
  for (const auto& p : plan)
    if (!done.count(p.id.name()) && p.status == Status::OK) flops_left += p.flops;
  size_t started = 0, finished = 0;
  bool interrupted = false;
  // On a terminal, a point is named by what tells it apart from the rest of the grid (the shared
  // segments are printed once); a log keeps whole names.
  std::vector<std::string> names;
  for (const auto& p : plan) names.push_back(p.id.name());
  ShortNames short_names = short_point_names(names);
  if (progress.tty && !short_names.shared.empty()) progress.show("sweep: every point " + short_names.shared, true);
  const int jobs = std::max(1, so.jobs);
  // Each job takes the next point not yet run, runs it (unlocked: the child does the work), and
  // records it; the lock guards everything else: the plan's cursor, the results, the file, the
  // progress line and the estimate. With one job this is the plain loop in grid order. A point
  // starts only while the predicted memory of the points running beside it leaves room for it
  // under --mem-limit (each alone fits: the plan made the others OOM), else it waits for one.
  std::mutex lock_state;
  std::condition_variable point_finished;
  size_t next = 0, running_bytes = 0;
  auto job = [&](int j) {
    const fs::path job_dir = jobs > 1 ? dir / fmt::format("job{}", j) : dir;
    if (jobs > 1) fs::create_directories(job_dir);
    if (!job_cpus.empty()) pin_this_thread(job_cpus[static_cast<size_t>(j)]);  // the children inherit it
    while (true) {
      size_t k = 0;
      std::string where;
      {
        std::unique_lock<std::mutex> g(lock_state);
        while (true) {
          while (next < plan.size() && done.count(plan[next].id.name())) ++next;
          if (interrupted || next == plan.size()) return;
          if (g_interrupted) {
            interrupted = true;
            return;
          }
          const size_t need = plan[next].bytes;
          if (running_bytes == 0 || !opts.mem_limit || running_bytes + need <= opts.mem_limit) break;
          point_finished.wait_for(g, std::chrono::milliseconds(200));  // and look at g_interrupted again
        }
        k = next++;
        running_bytes += plan[k].bytes;
        where = fmt::format("[{}/{}] {}", ++started, todo, progress.tty ? short_names.names[k] : plan[k].id.name());
        const size_t filled = todo ? 20 * finished / todo : 20;
        const std::string bar = "[" + std::string(filled, '#') + std::string(20 - filled, '.') + "] ";
        double rest = 0;  // the points left, shared among the jobs
        if (eta.n > 0) rest = (eta.predict(flops_left) + eta.predict(0) * static_cast<double>(left - 1)) / jobs;
        // Several jobs: a log (not a terminal) gets a line as each point starts, to show what runs.
        const bool log_start = jobs > 1 && !progress.tty;
        progress.show(fmt::format("{}{}{} | {} elapsed{}", progress.tty ? bar : "", where, log_start ? " started" : "",
                                  duration(since_start()),
                                  eta.n > 0 ? ", about " + duration(rest) + " left" : ""),
                      log_start);
      }
      const Planned& p = plan[k];
      PointResult r;
      const double t0 = since_start();
      bool stopped = false;
      if (p.status != Status::OK) r = error_result(p.id, opts, p.status, p.message);
      else r = run_isolated(p.id, opts, so, gemm.per_thread(p.id.threads), job_dir, &stopped);
      std::lock_guard<std::mutex> g(lock_state);
      running_bytes -= p.bytes;
      point_finished.notify_all();
      if (stopped) {
        interrupted = true;
        return;
      }
      if (p.status == Status::OK) {
        eta.add(p.flops, since_start() - t0);
        flops_left -= p.flops;
      }
      --left;
      ++finished;
      const std::string outcome =
          r.status != Status::OK ? fmt::format("{}: {}", to_string(r.status), r.message)
          : r.train ? fmt::format("accuracy {:.4f} (best val {:.4f}), {:.4g} ms/step", r.train->accuracy,
                                  r.train->val_accuracy, real_stats(r).median * 1e3)
                    : fmt::format("{:.4g} ms", real_stats(r).median * 1e3);
      if (resumption_index) context["resumed_by"][*resumption_index]["points"].push_back(r.id.name());
      results.push_back(std::move(r));
      save();
      progress.show(fmt::format("{} {}", where, outcome), true);
    }
  };
  // An error in one job (the file cannot be written, ...) stops the others as an interrupt does,
  // each run checkpointing first, and is raised once they are all back and cleaned up after
  // (one job too: the signal handlers and the scratch directory are restored and removed).
  std::exception_ptr error;
  auto job_or_stop = [&](int j) {
    try {
      job(j);
    } catch (...) {
      std::lock_guard<std::mutex> g(lock_state);
      if (!error) error = std::current_exception();
      g_interrupted = true;
    }
  };
  if (jobs == 1) {
    job_or_stop(0);
  } else {
    std::vector<std::thread> threads_of_jobs;
    for (int j = 0; j < jobs; ++j) threads_of_jobs.emplace_back(job_or_stop, j);
    for (auto& t : threads_of_jobs) t.join();
  }
  stop_signals.reset();
  std::error_code ec;
  fs::remove_all(dir, ec);  // this sweep's own scratch directory
  if (error) std::rethrow_exception(error);
  attach_warnings(context, results);
  save();
  if (interrupted || g_interrupted) {
    progress.message(fmt::format("sweep: interrupted; {} finished points kept in {}; continue with --resume",
                             results.size(), so.out));
    return 130;
  }
  progress.message(fmt::format("sweep: {} points in {} ({} run now, {})", results.size(), so.out, finished,
                           duration(since_start())));
  return 0;
}

bool kept_on_resume(const PointResult& r, const SweepOptions& so) {
  return !(so.retry_failed && r.status != Status::OK && r.status != Status::SKIPPED);
}

int cmd_sweep_dry_run(const std::vector<PointId>& full_grid, const RunOptions& opts, const SweepOptions& so,
                      int width) {
  std::vector<PointId> grid = shard_of(full_grid, so.shard_index, so.shard_count);
  check_options_and_place_jobs(so, grid);  // what the run would refuse is refused here too
  std::string kept_note;
  if (so.resume && so.out != "-" && std::filesystem::exists(so.out)) {
    // What the run would keep, decided by the run's own rule, so the estimate covers what is left.
    std::set<std::string> kept;
    for (const auto& r : read_result_file(so.out).points)
      if (kept_on_resume(r, so)) kept.insert(r.id.name());
    const size_t before = grid.size();
    std::erase_if(grid, [&](const PointId& id) { return kept.count(id.name()) > 0; });
    kept_note = fmt::format("; {} more of this {} already in {}, kept by --resume",
                            before - grid.size(), so.shard_count > 1 ? "shard" : "grid", so.out);
  }
  return cmd_dry_run(grid, opts, true, width, kept_note, so.jobs);
}

SweepProgress sweep_progress(const std::vector<PointId>& full_grid, const SweepOptions& so) {
  if (so.out == "-") throw InvalidInput("--status reads the sweep's file; give it to --out");
  std::set<std::string> planned;
  for (const auto& id : shard_of(full_grid, so.shard_index, so.shard_count)) planned.insert(id.name());
  SweepProgress p;
  p.points = planned.size();
  if (std::filesystem::exists(so.out))  // the reader groups a point's repetitions: each name once
    for (const auto& r : read_result_file(so.out).points)
      ++(!planned.count(r.id.name()) ? p.foreign : r.status == Status::OK ? p.done : p.failed);
  p.left = p.points - p.done - p.failed;
  return p;
}

int cmd_sweep_status(const std::vector<PointId>& grid, const SweepOptions& so) {
  const SweepProgress p = sweep_progress(grid, so);
  std::cout << fmt::format("shard {}/{}: {} points, {} done, {} failed, {} left ({}{})\n", so.shard_index,
                           so.shard_count, p.points, p.done, p.failed, p.left,
                           std::filesystem::exists(so.out) ? so.out : so.out + ", not yet written",
                           p.foreign ? fmt::format("; {} other points in it, not of this grid", p.foreign) : "");
  return 0;
}

int run_sweep_to_stdout(const std::vector<PointId>& grid, const RunOptions& opts, SweepOptions so) {
  namespace fs = std::filesystem;
  if (so.resume) throw InvalidInput("--out - has nothing to resume; give a file to --out");
  const fs::path dir = make_scratch_dir("out");
  so.out = (dir / "sweep.json").string();
  if (so.train_dir == "-.train") so.train_dir = (dir / "train").string();
  int rc = 1;
  try {
    rc = run_sweep(grid, opts, so);
    std::ifstream in(so.out, std::ios::binary);
    std::cout << in.rdbuf() << std::flush;
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    throw;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}

}  // namespace ab
