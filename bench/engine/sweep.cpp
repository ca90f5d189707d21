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

// 1. A point of the plan: validated before any point runs, its memory predicted.
struct Planned {
  PointId id;
  Status status = Status::OK;
  std::string message;
  double flops = 0;
  size_t bytes = 0;  // predicted peak memory
};

std::vector<Planned> plan_points(const std::vector<PointId>& grid, const RunOptions& opts) {
  std::vector<Planned> plan;
  RunOptions plan_opts = opts;
  plan_opts.oom_as_status = true;  // a point over --mem-limit is a row marked OOM, not an abort
  for (const auto& id : grid) {
    PreparedPoint pp = prepare_point(id, plan_opts);
    Planned p{id, pp.status, pp.message, pp.flops, pp.status == Status::OK ? pp.predicted_bytes : 0};
    if (p.status == Status::OOM) p.message += "; not run";
    plan.push_back(std::move(p));
  }
  return plan;
}

// 2. The output file: its results, the names they hold, its context and, resumed, this
// resumption's entry in context.resumed_by. Saved whole (atomically) after every point.
struct SweepFile {
  std::string path;
  std::vector<PointResult> results;
  std::set<std::string> done;
  nlohmann::json context;
  std::optional<size_t> resumption_index;

  void save() const { write_file_atomic(path, results_document(context, results).dump(2) + "\n"); }
  void add(PointResult r) {
    if (resumption_index) context["resumed_by"][*resumption_index]["points"].push_back(r.id.name());
    results.push_back(std::move(r));
    save();
  }
};

// New, or resumed (--resume keeps what it holds; --retry-failed runs the failed points again,
// their earlier statuses kept in context.retried).
SweepFile open_sweep_file(const SweepOptions& so, const RunOptions& opts, const GemmReference& gemm, int threads) {
  namespace fs = std::filesystem;
  SweepFile file;
  file.path = so.out;
  if (!fs::exists(so.out)) {
    file.context = run_context(so.command, opts.seed, threads, gemm.one_thread);
    gemm.record(file.context);
    if (so.shard_count > 1) file.context["shard"] = fmt::format("{}/{}", so.shard_index, so.shard_count);
    return file;
  }
  if (!so.resume) throw InvalidInput(fmt::format("{} exists; pass --resume to continue that sweep, or choose another --out", so.out));
  ResultFile rf = read_result_file(so.out);
  file.context = rf.context;
  for (auto& r : rf.points) {
    if (!kept_on_resume(r, so)) {
      file.context["retried"].push_back(
          {{"point", r.id.name()}, {"status", to_string(r.status)}, {"message", r.message}, {"by", so.command}});
      continue;
    }
    file.done.insert(r.id.name());
    file.results.push_back(std::move(r));
  }
  // A resumed file's context describes the machine and binary that began it; the points this
  // resumption adds may come from another machine or commit, so it names them and where they ran.
  const nlohmann::json here = run_context(so.command, opts.seed, threads, gemm.one_thread);
  nlohmann::json resumption = {{"command", so.command}, {"points", nlohmann::json::array()}};
  for (const char* k : {"date", "host_name", "cpu_model", "machine_id", "git_commit"}) resumption[k] = here.value(k, "");
  resumption["gemm_gflops_per_s_1thread"] = gemm.one_thread;
  file.context["resumed_by"].push_back(std::move(resumption));
  file.resumption_index = file.context["resumed_by"].size() - 1;
  return file;
}

// 3. The points not yet in the file, run by --jobs jobs. Each job takes the next point not yet
// run, runs it (unlocked: the child does the work) and records it; the lock guards everything
// else: the plan's cursor, the file, the progress line and the estimate. With one job this is
// the plain loop in grid order. A point starts only while the predicted memory of the points
// running beside it leaves room for it under --mem-limit (each alone fits: the plan made the
// others OOM), else it waits for one to finish.
class SweepJobs {
 public:
  SweepJobs(const std::vector<Planned>& plan, SweepFile& file, const SweepOptions& so, const RunOptions& opts,
            const GemmReference& gemm, std::vector<std::vector<int>> job_cpus)
      : plan_(plan), file_(file), so_(so), opts_(opts), gemm_(gemm), job_cpus_(std::move(job_cpus)),
        jobs_(std::max(1, so.jobs)), t_start_(std::chrono::steady_clock::now()) {
    for (const auto& p : plan_)
      if (!file_.done.count(p.id.name())) {
        ++todo_;
        if (p.status == Status::OK) flops_left_ += p.flops;
      }
    left_ = todo_;
    // On a terminal, a point is named by what tells it apart from the rest of the grid (the
    // shared segments are printed once); a log keeps whole names.
    std::vector<std::string> names;
    for (const auto& p : plan_) names.push_back(p.id.name());
    short_names_ = short_point_names(names);
  }
  size_t todo() const { return todo_; }
  size_t finished() const { return finished_; }
  bool interrupted() const { return interrupted_ || g_interrupted; }
  double since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
  }

  // Runs them, each job in a directory of its own under `dir`. An error in one job (the file
  // cannot be written, ...) stops the others as an interrupt does, each run checkpointing first,
  // and is raised once they are all back.
  void run_all(const std::filesystem::path& dir) {
    dir_ = dir;
    if (progress_.tty && !short_names_.shared.empty()) progress_.show("sweep: every point " + short_names_.shared, true);
    std::exception_ptr error;
    auto job_or_stop = [&](int j) {
      try {
        job(j);
      } catch (...) {
        std::lock_guard<std::mutex> g(lock_);
        if (!error) error = std::current_exception();
        g_interrupted = true;
      }
    };
    if (jobs_ == 1) {
      job_or_stop(0);
    } else {
      std::vector<std::thread> threads_of_jobs;
      for (int j = 0; j < jobs_; ++j) threads_of_jobs.emplace_back(job_or_stop, j);
      for (auto& t : threads_of_jobs) t.join();
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  void job(int j) {
    const std::filesystem::path job_dir = jobs_ > 1 ? dir_ / fmt::format("job{}", j) : dir_;
    if (jobs_ > 1) std::filesystem::create_directories(job_dir);
    if (!job_cpus_.empty()) pin_this_thread(job_cpus_[static_cast<size_t>(j)]);  // the children inherit it
    while (true) {
      std::string where;
      const std::optional<size_t> k = take_next(&where);
      if (!k) return;
      const Planned& p = plan_[*k];
      PointResult r;
      const double t0 = since_start();
      bool stopped = false;
      if (p.status != Status::OK) r = error_result(p.id, opts_, p.status, p.message);
      else r = run_isolated(p.id, opts_, so_, gemm_.per_thread(p.id.threads), job_dir, &stopped);
      if (!record(*k, std::move(r), since_start() - t0, stopped, where)) return;
    }
  }

  // The next point to run and its progress line, waiting for memory to run it in; nothing once
  // the plan is done or the sweep is being stopped.
  std::optional<size_t> take_next(std::string* where) {
    std::unique_lock<std::mutex> g(lock_);
    while (true) {
      while (next_ < plan_.size() && file_.done.count(plan_[next_].id.name())) ++next_;
      if (interrupted_ || next_ == plan_.size()) return std::nullopt;
      if (g_interrupted) {
        interrupted_ = true;
        return std::nullopt;
      }
      const size_t need = plan_[next_].bytes;
      if (running_bytes_ == 0 || !opts_.mem_limit || running_bytes_ + need <= opts_.mem_limit) break;
      point_finished_.wait_for(g, std::chrono::milliseconds(200));  // and look at g_interrupted again
    }
    const size_t k = next_++;
    running_bytes_ += plan_[k].bytes;
    *where = fmt::format("[{}/{}] {}", ++started_, todo_, progress_.tty ? short_names_.names[k] : plan_[k].id.name());
    const size_t filled = todo_ ? 20 * finished_ / todo_ : 20;
    const std::string bar = "[" + std::string(filled, '#') + std::string(20 - filled, '.') + "] ";
    double rest = 0;  // the points left, shared among the jobs
    if (eta_.n > 0) rest = (eta_.predict(flops_left_) + eta_.predict(0) * static_cast<double>(left_ - 1)) / jobs_;
    // Several jobs: a log (not a terminal) gets a line as each point starts, to show what runs.
    const bool log_start = jobs_ > 1 && !progress_.tty;
    progress_.show(fmt::format("{}{}{} | {} elapsed{}", progress_.tty ? bar : "", *where, log_start ? " started" : "",
                               format_duration(since_start()),
                               eta_.n > 0 ? ", about " + format_duration(rest) + " left" : ""),
                   log_start);
    return k;
  }

  // Point k's result into the file; false when the sweep is being stopped (a point stopped in
  // the middle is left for --resume).
  bool record(size_t k, PointResult r, double seconds, bool stopped, const std::string& where) {
    const Planned& p = plan_[k];
    std::lock_guard<std::mutex> g(lock_);
    running_bytes_ -= p.bytes;
    point_finished_.notify_all();
    if (stopped) {
      interrupted_ = true;
      return false;
    }
    if (p.status == Status::OK) {
      eta_.add(p.flops, seconds);
      flops_left_ -= p.flops;
    }
    --left_;
    ++finished_;
    const std::string outcome =
        r.status != Status::OK ? fmt::format("{}: {}", to_string(r.status), r.message)
        : r.train ? fmt::format("accuracy {:.4f} (best val {:.4f}), {:.4g} ms/step", r.train->accuracy,
                                r.train->val_accuracy, real_stats(r).median * 1e3)
                  : fmt::format("{:.4g} ms", real_stats(r).median * 1e3);
    file_.add(std::move(r));
    progress_.show(fmt::format("{} {}", where, outcome), true);
    return true;
  }

  const std::vector<Planned>& plan_;
  SweepFile& file_;
  const SweepOptions& so_;
  const RunOptions& opts_;
  const GemmReference& gemm_;
  const std::vector<std::vector<int>> job_cpus_;
  std::filesystem::path dir_;
  const int jobs_;
  const std::chrono::steady_clock::time_point t_start_;
  ProgressLine progress_;
  ShortNames short_names_;
  Eta eta_;
  std::mutex lock_;
  std::condition_variable point_finished_;
  size_t todo_ = 0, left_ = 0, next_ = 0, started_ = 0, finished_ = 0, running_bytes_ = 0;
  double flops_left_ = 0;
  bool interrupted_ = false;
};

}  // namespace

int run_sweep(const std::vector<PointId>& full_grid, const RunOptions& opts, const SweepOptions& so) {
  namespace fs = std::filesystem;
  const std::vector<PointId> grid = shard_of(full_grid, so.shard_index, so.shard_count);
  const std::vector<std::vector<int>> job_cpus = check_options_and_place_jobs(so, grid);
  const std::vector<Planned> plan = plan_points(grid, opts);

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
  std::set<int> thread_counts;
  for (const auto& p : plan) thread_counts.insert(p.id.threads);
  const GemmReference gemm = gemm_reference(opts.gemm_gflops, thread_counts);
  const int threads = grid.empty() ? 1 : grid.front().threads;  // the context's thread count
  SweepFile file = open_sweep_file(so, opts, gemm, threads);

  const ProgressLine progress;
  SweepJobs jobs(plan, file, so, opts, gemm, job_cpus);
  progress.message(fmt::format("sweep: {} points{}, {} already in {}, {} to run", plan.size(),
                               so.shard_count > 1 ? fmt::format(" (shard {}/{})", so.shard_index, so.shard_count) : "",
                               plan.size() - jobs.todo(), so.out, jobs.todo()));
  file.save();  // the file exists and is valid from the start

  const fs::path dir = make_scratch_dir("sweep");
  std::optional<StopSignalHandler> stop_signals(std::in_place, on_interrupt);  // the old handlers are back at reset() below
  g_interrupted = false;
  // One job's error is raised after the signal handlers are restored and the scratch directory
  // is removed (this sweep's own).
  std::exception_ptr error;
  try {
    jobs.run_all(dir);
  } catch (...) {
    error = std::current_exception();
  }
  stop_signals.reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (error) std::rethrow_exception(error);
  attach_warnings(file.context, file.results);
  file.save();
  if (jobs.interrupted()) {
    progress.message(fmt::format("sweep: interrupted; {} finished points kept in {}; continue with --resume",
                                 file.results.size(), so.out));
    return 130;
  }
  progress.message(fmt::format("sweep: {} points in {} ({} run now, {})", file.results.size(), so.out, jobs.finished(),
                               format_duration(jobs.since_start())));
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
