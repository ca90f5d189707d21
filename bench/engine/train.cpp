#include "bench/engine/train.hpp"

#include <fmt/format.h>

#include <optional>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/points/configs.hpp"
#include "bench/points/grid.hpp"
#include "bench/results/result_reader.hpp"
#include "bench/results/result_writer.hpp"
#include "bench/engine/runner.hpp"
#include "bench/text/terminal.hpp"
#include "core/dropout.hpp"
#include "core/files.hpp"
#include "core/stop_signals.hpp"
#include "core/sysinfo.hpp"

namespace ab {

namespace {
namespace fs = std::filesystem;

std::atomic<bool> g_stop{false};
void on_stop(int) { g_stop = true; }

// The JSON-lines learning curve: one object per logged step or evaluation, naming its run.
class CurveLog {
 public:
  CurveLog(const std::string& path, const PointId& id) : path_(path), id_(id) {}
  void write(const CurvePoint& p) {
    if (path_.empty()) return;
    nlohmann::json j = {{"point", id_.name()}, {"mechanism", id_.mechanism}, {"task", id_.task},
                        {"seed", id_.train.seed}, {"step", p.step}, {"samples", p.samples},
                        {"elapsed_s", p.elapsed_s}};
    if (p.val) {
      j["val_loss"] = p.val->loss;
      j["val_accuracy"] = p.val->accuracy;
      if (id_.task == "copy") j["val_token_accuracy"] = p.val->token_accuracy;
    } else {
      j["loss"] = p.loss;
      j["lr"] = p.lr;
      j["grad_norm"] = p.grad_norm;
      j["tokens_per_s"] = p.tokens_per_s;
    }
    std::ofstream out(path_, std::ios::app);
    out << j.dump() << "\n";
    if (!out) throw std::runtime_error(fmt::format("cannot write the log {}", path_));
  }
  // Resuming from step `step`: this run's lines after it are dropped (they came after the last
  // checkpoint and are about to be written again, equal in all but their clock readings).
  void rewind(int64_t step) const {
    if (path_.empty() || !fs::exists(path_)) return;
    std::ifstream in(path_);
    std::string line, kept;
    const std::string name = id_.name();
    while (std::getline(in, line)) {
      bool keep = true;
      try {
        const auto j = nlohmann::json::parse(line);
        keep = j.value("point", "") != name || j.value("step", int64_t{0}) <= step;
      } catch (const nlohmann::json::exception&) {
        keep = true;  // not ours to judge
      }
      if (keep) kept += line + "\n";
    }
    write_file_atomic(path_, kept);
  }

 private:
  std::string path_;
  PointId id_;
};

// One line on stderr, redrawn in place on a terminal (fitted to its width), plain lines every
// few seconds otherwise.
class TrainProgress {
 public:
  TrainProgress(const PointId& id, int64_t steps) : id_(id), steps_(steps), columns_(terminal_columns(2)) {}
  void update(const CurvePoint& p) {
    if (p.val) {
      val_ = p.val->accuracy;
    } else {
      loss_ = p.loss;
      rate_ = p.tokens_per_s / static_cast<double>(id_.shape.B * id_.shape.N);
    }
    const double left = rate_ > 0 ? static_cast<double>(steps_ - p.step) / rate_ : 0;
    const std::string line = fmt::format("train {} {} seed {}: step {}/{} loss {:.4f}{} {:.2f} steps/s {} left",
                                         id_.mechanism, id_.task, id_.train.seed, p.step, steps_, loss_,
                                         val_ >= 0 ? fmt::format(" val {:.3f}", val_) : "", rate_, format_duration(left));
    const auto now = std::chrono::steady_clock::now();
    if (columns_ > 0) {
      std::cerr << "\r\033[K" << fit_columns(line, columns_ - 1) << std::flush;
    } else if (now - last_ > std::chrono::seconds(10) || p.step == steps_) {
      std::cerr << line << "\n";
      last_ = now;
    }
  }
  void finish(const std::string& line) {
    if (columns_ > 0) std::cerr << "\r\033[K";
    std::cerr << line << "\n";
  }

 private:
  PointId id_;
  int64_t steps_;
  int columns_;
  double loss_ = 0, val_ = -1, rate_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

// The result file `out`: a new file in a writable directory, or a result file attnbench wrote
// (the run is added to it); anything else is refused before training starts.
void check_out(const std::string& out) {
  if (out == "-") throw InvalidInput("train --out -: the result goes to stdout with --format json; --out takes a file");
  require_writable_file("--out", out);
  if (fs::exists(out)) read_result_file(out);  // InvalidInput when it is not a result file
}

void add_to_out(const std::string& out, const PointResult& r, const std::string& command, uint64_t seed, int threads) {
  std::vector<PointResult> points;
  nlohmann::json context = run_context(command, seed, threads, 0.0);
  if (fs::exists(out)) {
    ResultFile rf = read_result_file(out);
    context = rf.context;
    for (auto& p : rf.points)
      if (p.id.name() != r.id.name()) points.push_back(std::move(p));  // a rerun replaces its own point
  }
  points.push_back(r);
  write_file_atomic(out, results_document(context, points).dump(2) + "\n");
}
}  // namespace

std::string run_directory_name(const PointId& id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the name: stable across processes and builds
  for (unsigned char c : id.name()) h = (h ^ c) * 1099511628211ull;
  return fmt::format("{}-{}-seed{}-{:012x}", id.mechanism, id.task, id.train.seed, h & 0xffffffffffffull);
}

namespace {
// The trainer's whole configuration of one run: the point's recipe and the command's options.
TrainConfig run_config(const PointId& id, const TrainCliOptions& o, const std::string& checkpoint_dir) {
  TrainConfig c = train_config(id);
  c.checkpoint_dir = checkpoint_dir;
  c.checkpoint_every = o.checkpoint_every;
  c.convert_dtype = o.convert_dtype;
  c.log_every = o.log_every;
  return c;
}
}  // namespace

std::optional<PointResult> train_point(const PointId& id, const TrainCliOptions& o, const std::string& checkpoint_dir,
                                       const std::atomic<bool>* interrupt, std::unique_ptr<Trainer> built) {
  RunOptions ro;
  PointResult res;
  res.id = id;
  res.label = point_label(id, ro);
  // Bad input throws InvalidInput before anything runs (a trainer built to validate is this one).
  if (!built) built = std::make_unique<Trainer>(run_config(id, o, checkpoint_dir));
  Trainer& trainer = *built;
  const TrainConfig& c = trainer.config();
  inject_fault(id);
  if (!checkpoint_dir.empty()) check_checkpoint_directory(checkpoint_dir);
  const bool resume = o.resume && !checkpoint_dir.empty() && fs::exists(checkpoint_path(checkpoint_dir));
  CurveLog log(o.log_path, id);
  if (o.resume && !resume) log.rewind(0);  // nothing to resume: an earlier attempt's lines go
  TrainProgress progress(id, c.steps);
  const double cpu0 = process_cpu_seconds();
  reset_peak_rss();
  TrainOutcome out;
  try {
    bool rewound = !resume;
    out = trainer.run(resume, [&](const CurvePoint& p) {
      if (!rewound) {  // the checkpoint's step is known once the run starts: drop the log's later lines
        log.rewind(p.step - 1);
        rewound = true;
      }
      log.write(p);
      progress.update(p);
    }, interrupt);
  } catch (const InvalidInput&) {
    throw;
  } catch (const std::bad_alloc&) {
    res.status = Status::OOM;
    res.message = "allocation failed";
    return res;
  } catch (const std::exception& e) {
    res.status = Status::FAILED;
    res.message = e.what();
    // The last checkpoint written is whole (writes are atomic): say where the run can continue.
    const bool can_resume = !checkpoint_dir.empty() && fs::exists(checkpoint_path(checkpoint_dir));
    progress.finish(fmt::format("train {} {}: FAILED: {}{}", id.mechanism, id.task, e.what(),
                                can_resume ? fmt::format("; --resume --checkpoint {} continues from the last checkpoint",
                                                         checkpoint_dir)
                                           : ""));
    return res;
  }
  if (out.interrupted) {
    progress.finish(fmt::format("train {} {}: interrupted at step {}{}", id.mechanism, id.task, out.steps_done,
                                checkpoint_dir.empty() ? " (no --checkpoint: progress lost)"
                                                       : "; continue with --resume"));
    return std::nullopt;
  }
  const double cpu = process_cpu_seconds() - cpu0;
  // A step the process was stopped in (SIGSTOP, a job paused for a timed run) is not timed: the
  // step time is the mean of the others, and train_seconds that mean times every step.
  // (Every step paused: this process's CPU time per step stands in.)
  const int64_t timed_steps = out.steps_done - out.paused_steps;
  const int64_t steps_here = out.steps_done - out.resumed_at;
  const double cpu_step_s = steps_here > 0 ? cpu / static_cast<double>(steps_here) : 0;
  const double step_s = timed_steps > 0 ? out.train_seconds / static_cast<double>(timed_steps) : cpu_step_s;
  if (out.paused_steps > 0)
    res.add_note(fmt::format("{} of {} steps ran across a stop (SIGSTOP/SIGCONT) and are not timed{}", out.paused_steps,
                             out.steps_done, timed_steps > 0 ? "" : ": the step time is CPU time"));
  res.reps.push_back({step_s, steps_here > 0 ? cpu_step_s : step_s, out.steps_done, std::nullopt});
  res.flops = trainer.model().flops();
  res.peak_bytes = out.peak_bytes;
  res.peak_rss_bytes = peak_rss_bytes();
  TrainResult t;
  t.accuracy = out.test_best.accuracy;
  t.final_accuracy = out.test_final.accuracy;
  t.val_accuracy = out.best_val_accuracy;
  t.token_accuracy = out.test_best.token_accuracy;
  t.eval_loss = out.test_best.loss;
  t.train_steps = static_cast<double>(out.steps_done);
  t.best_step = static_cast<double>(out.best_step);
  t.train_seconds = step_s * static_cast<double>(out.steps_done);
  t.data_seconds = out.data_seconds;
  t.eval_seconds = out.eval_seconds;
  t.checkpoint_seconds = out.checkpoint_seconds;
  t.checkpoint_bytes = static_cast<double>(out.checkpoint_bytes);
  for (const auto& at : out.at_lengths) {
    if (at.accuracy) t.accuracy_at[at.seq] = *at.accuracy;
    else res.add_note(fmt::format("N = {} not tested: {}", at.seq, at.why_not));
  }
  res.train = t;
  // A mechanism without attention dropout ran without it: the result says so.
  if (c.model.attn_dropout > 0 && !find_mechanism(id.mechanism).caps.attn_dropout)
    res.add_note(fmt::format("attention dropout not applied: {}", find_mechanism(id.mechanism).caps.no_attn_dropout));
  if (const std::string p = trainer.model().precision(); !p.empty()) res.add_note(p);
  if (!out.converted_from.empty())
    res.add_note(fmt::format("resumed at step {} from the checkpoint of {}", out.resumed_at, out.converted_from));
  std::string lengths;
  for (const auto& [n, a] : t.accuracy_at) lengths += fmt::format("{} N={} {:.4f}", lengths.empty() ? "; at" : ",", n, a);
  progress.finish(fmt::format("train {} {} seed {}: test accuracy {:.4f} (best val {:.4f} at step {}; final {:.4f}{}){}, "
                              "{:.2f} steps/s", id.mechanism, id.task, id.train.seed, t.accuracy, t.val_accuracy,
                              out.best_step, t.final_accuracy, out.stopped_early ? fmt::format("; stopped early at step {}", out.steps_done) : "",
                              lengths, step_s > 0 ? 1 / step_s : 0));
  return res;
}

int cmd_train(const std::vector<PointId>& grid, const TrainCliOptions& o, const std::string& command) {
  if (o.format != "md" && o.format != "json") throw InvalidInput(fmt::format("unknown format '{}'; formats: md, json", o.format));
  if (o.checkpoint_every < 0) throw InvalidInput("--checkpoint-every must not be negative");
  if (o.log_every < 1) throw InvalidInput("--log-every must be at least 1");
  if (o.resume && o.checkpoint_dir.empty()) throw InvalidInput("--resume needs --checkpoint DIR (where the run left off)");
  // Every file the runs will read or write is checked before any training: a run must not train
  // for hours and then find it cannot write its log or its result, or block on a FIFO.
  if (!o.out.empty()) check_out(o.out);
  // One writer of the result file at a time (runs are added to it as they finish).
  std::optional<ResultFileLock> lock;
  if (!o.out.empty()) lock.emplace(o.out);
  if (!o.log_path.empty()) {
    require_writable_file("--log", o.log_path);
    if (fs::exists(o.log_path) && !o.resume)
      throw InvalidInput(fmt::format("--log {} exists; choose another, or --resume the run that wrote it", o.log_path));
  }
  // Several runs: a checkpoint directory each, named after the run.
  auto checkpoint_dir_of = [&](const PointId& id) {
    return o.checkpoint_dir.empty() || grid.size() == 1 ? o.checkpoint_dir
                                                        : (fs::path(o.checkpoint_dir) / run_directory_name(id)).string();
  };
  // Validate every point before training any (a bad recipe or shape exits 2 with nothing run).
  // A single run (each run of a preset is one, in a process of its own) keeps the trainer it
  // validated with; a grid of several builds each again when its turn comes, so that only one
  // holds its data at a time.
  std::unique_ptr<Trainer> single;
  for (const auto& id : grid) {
    auto t = std::make_unique<Trainer>(run_config(id, o, checkpoint_dir_of(id)));
    if (grid.size() == 1) single = std::move(t);
  }
  for (const auto& id : grid)
    if (!o.checkpoint_dir.empty()) check_checkpoint_directory(checkpoint_dir_of(id));
  std::optional<StopSignalHandler> stop_signals(std::in_place, on_stop);  // the old handlers are back at reset() below
  g_stop = false;
  std::vector<PointResult> results;
  bool interrupted = false, not_ok = false;
  std::string unsaved;  // results that could not be added to --out: they go to stdout
  for (const auto& id : grid) {
    const std::string dir = checkpoint_dir_of(id);
    auto r = train_point(id, o, dir, &g_stop, std::move(single));
    if (!r) {
      interrupted = true;
      break;
    }
    not_ok = not_ok || r->status != Status::OK;
    if (!o.out.empty()) {
      try {
        add_to_out(o.out, *r, command, static_cast<uint64_t>(id.train.seed), id.threads);
      } catch (const std::exception& e) {
        // Nothing trained is lost: the entry goes to stdout, and the finished checkpoint can
        // make it again (a resumed finished run only evaluates).
        std::cerr << fmt::format("attnbench: error: {}; the result of {} is on stdout (JSON){}\n", e.what(), id.mechanism,
                                 dir.empty() ? ""
                                             : fmt::format(", and `--resume --checkpoint {}` with the same options writes it "
                                                           "again without training",
                                                           dir));
        unsaved += results_document(run_context(command, static_cast<uint64_t>(id.train.seed), id.threads, 0.0), {*r}).dump(2) + "\n";
        not_ok = true;
      }
    }
    results.push_back(std::move(*r));
    if (g_stop) {
      interrupted = true;
      break;
    }
  }
  stop_signals.reset();
  std::cout << unsaved;
  if (o.format == "json") {
    const nlohmann::json doc = results_document(run_context(command, 0, grid.empty() ? 1 : grid.front().threads, 0.0), results);
    std::cout << doc.dump(2) << "\n";
  } else if (!results.empty()) {
    std::cout << to_markdown(results, o.width);
  }
  // A run that is not OK (FAILED, OOM) or whose result could not be saved is an error.
  return interrupted ? 130 : not_ok ? 1 : 0;
}

}  // namespace ab
