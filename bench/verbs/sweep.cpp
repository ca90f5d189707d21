// attnbench sweep: a grid, each point in its own process, appended to --out as it finishes.
#include <cmath>
#include <memory>

#include "bench/engine/run.hpp"
#include "bench/engine/sweep.hpp"
#include "bench/text/text_table.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct SweepVerbOptions {
  GridOptions grid;
  MeasureOptions measure;
  std::string shard = "1/1";
  SweepOptions sweep;
};

VerbMain add_sweep(CLI::App& app, SharedOptions& shared) {
  auto o = std::make_shared<SweepVerbOptions>();
  o->grid.text["seq"] = "256:16384:x2";
  o->grid.add_to(&app, GridOptions::Verb::sweep);
  o->measure.add_to(&app);
  SweepOptions& so = o->sweep;
  app.add_option("--out", so.out, "the result file, rewritten whole after every point ('-': stdout at the end)")->required();
  shared.add_dry_run_and_context(app);
  shared.add_status(app);
  app.add_flag("--resume", so.resume, "keep the points already in --out and run only the missing ones");
  app.add_flag("--retry-failed", so.retry_failed,
               "with --resume: run again the points --out records as failed (CRASHED, OOM, TIMEOUT, FAILED); the "
               "earlier attempts' statuses stay in the context's 'retried' list");
  auto* time_limit =
      app.add_option("--time-limit", so.time_limit_s, "seconds one point may take before it is stopped as TIMEOUT (0: none)")
          ->capture_default_str();
  app.add_option("--shard", o->shard, "i/n: run only the i-th of n disjoint parts of the grid (merge the files afterwards)")
      ->capture_default_str();
  app.add_option("--jobs", so.jobs, SharedOptions::jobs_help())->capture_default_str();
  app.add_option("--verb", so.verb,
                 "run: benchmark points (the default) | train: training runs to accuracy (the train verb's options; "
                 "each run checkpoints in --train-dir and resumes there)")
      ->capture_default_str();
  app.add_option("--train-dir", so.train_dir, "--verb train: the runs' checkpoints and learning curves (default: OUT.train/)");
  app.add_option("--checkpoint-every", so.checkpoint_every, "--verb train: steps between checkpoints")->capture_default_str();
  app.add_option("--log-every", so.log_every, "--verb train: steps per learning-curve line")->capture_default_str();
  return [o, &shared, time_limit](const std::string& command) {
    SweepOptions& so = o->sweep;
    if (so.verb != "run" && so.verb != "train") throw unknown_name("--verb", so.verb, {"run", "train"}, "verbs a sweep runs");
    o->grid.set_training(so.verb == "train");
    if (so.verb == "train" && !time_limit->count()) so.time_limit_s = 0;
    if (so.train_dir.empty()) so.train_dir = so.out + ".train";
    o->measure.finish(o->grid);
    parse_shard(o->shard, &so.shard_index, &so.shard_count);
    if (!(so.time_limit_s >= 0) || !std::isfinite(so.time_limit_s))
      throw InvalidInput(fmt::format("--time-limit {} is not a finite number of seconds >= 0", so.time_limit_s));
    so.command = command;
    if (shared.dry_run) return cmd_sweep_dry_run(o->grid.grid(), o->measure.run, so, kDefaultTableWidth);
    if (shared.status) return cmd_sweep_status(o->grid.grid(), so);
    if (so.out == "-") return run_sweep_to_stdout(o->grid.grid(), o->measure.run, so);
    return run_sweep(o->grid.grid(), o->measure.run, so);
  };
}

}  // namespace

Verb sweep_verb() {
  return {"sweep", "run a grid, each point in its own process, appended to --out as it finishes",
          {"attnbench sweep --attn all --seq 256:16384:x2 --out sweep.json",
           "attnbench sweep --attn all --seq 256:16384:x2 --filter 'attn:(flash|linear)/' --out sweep.json --dry-run",
           "attnbench sweep --attn all --seq 256:16384:x2 --out sweep.json --resume --shard 2/4",
           "attnbench sweep --verb train --task copy --seq 64 --attn flash,linear --seed 1,2,3 --steps 2000 --out copy.json"},
          add_sweep};
}

}  // namespace ab
