// attnbench train: training runs to accuracy, one or a grid in this process, or a preset's grid
// through the sweep (isolated, resumable, shardable).
#include <memory>

#include "bench/engine/plan.hpp"
#include "bench/engine/run.hpp"
#include "bench/engine/sweep.hpp"
#include "bench/text/text_table.hpp"
#include "bench/engine/train.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct TrainVerbOptions {
  GridOptions grid;
  TrainCliOptions train;
  bool wide = false, retry_failed = false;
  std::string preset, shard = "1/1", train_dir;
  int jobs = 1;
};

// A preset's grid through the sweep (isolated runs, resumable, shardable).
int train_preset_runs(TrainVerbOptions& o, const SharedOptions& shared, const std::string& command) {
  const TrainPresetOptions po = preset_options(o.grid, o.preset);
  SweepOptions so;
  so.out = o.train.out;
  so.resume = o.train.resume;
  so.retry_failed = o.retry_failed;
  so.verb = "train";
  so.time_limit_s = 0;
  so.train_dir = o.train_dir.empty() ? o.train.out + ".train" : o.train_dir;
  so.checkpoint_every = o.train.checkpoint_every > 0 ? o.train.checkpoint_every : 100;
  so.log_every = o.train.log_every;
  so.command = command;
  so.jobs = o.jobs;
  parse_shard(o.shard, &so.shard_index, &so.shard_count);
  MeasureOptions mo;
  mo.finish(o.grid);
  const auto grid = filter_points(train_preset_grid(o.preset, po), o.grid.filter);
  if (shared.dry_run) return cmd_sweep_dry_run(grid, mo.run, so, o.wide ? 0 : kDefaultTableWidth);
  if (o.train.out.empty()) throw InvalidInput("--preset needs --out FILE (the runs' result file)");
  if (shared.status) return cmd_sweep_status(grid, so);
  return run_sweep(grid, mo.run, so);
}

VerbMain add_train(CLI::App& app, SharedOptions& shared) {
  auto o = std::make_shared<TrainVerbOptions>();
  TrainCliOptions& t = o->train;
  o->grid.add_to(&app, GridOptions::Verb::train);
  app.add_option("--checkpoint", t.checkpoint_dir, "directory for the run's checkpoint (several runs: a subdirectory each)");
  app.add_option("--checkpoint-every", t.checkpoint_every, "steps between checkpoints (0: at the end and when stopped)")
      ->capture_default_str();
  app.add_flag("--resume", t.resume, "continue from the checkpoint in --checkpoint");
  app.add_flag("--convert-dtype", t.convert_dtype,
               "with --resume: continue a checkpoint this run wrote in another --dtype (f32 <-> bf16: the weights and the "
               "optimiser's moments are float32 in both; the result's note says so)");
  app.add_option("--log", t.log_path, "write the learning curve here, one JSON object per line");
  app.add_option("--log-every", t.log_every, "steps per log line (the loss averaged over them)")->capture_default_str();
  app.add_option("--out", t.out, "add each run's result entry to this result file (created if absent)");
  shared.add_dry_run_and_context(app);
  shared.add_status(app, "--preset: ");
  app.add_option("--format", t.format, "stdout: md | json")->capture_default_str();
  app.add_flag("--wide", o->wide, "stdout: every column in full (default: fitted to 100 columns)");
  app.add_option("--preset", o->preset,
                 "a published comparison's grid of runs (" + train_preset_names() +
                     "; docs/reproductions.md), run like sweep --verb train: each run isolated, the file --out "
                     "saved after each, --resume continues, --shard splits; --attn, --task, --seed, --threads "
                     "narrow or change it");
  auto* shard = app.add_option("--shard", o->shard, "--preset: run the i-th of n disjoint parts of the grid")->capture_default_str();
  auto* train_dir = app.add_option("--train-dir", o->train_dir, "--preset: the runs' checkpoints and learning curves (default: OUT.train/)");
  app.add_option("--jobs", o->jobs, std::string("--preset: ") + SharedOptions::jobs_help())->capture_default_str();
  app.add_flag("--retry-failed", o->retry_failed,
               "--preset with --resume: run again the runs --out records as failed (a finished run's checkpoint "
               "makes that a test evaluation); the earlier statuses stay in the context's 'retried' list");
  return [o, &shared, shard, train_dir](const std::string& command) {
    o->grid.set_training(true);
    if (o->wide) o->train.width = 0;
    if (!o->preset.empty() && o->train.convert_dtype)
      throw InvalidInput("--convert-dtype continues one run's --checkpoint; a preset's runs in another --dtype have directories of their own");
    if (!o->preset.empty()) return train_preset_runs(*o, shared, command);
    if (o->jobs != 1) throw InvalidInput("--jobs needs --preset (or sweep --verb train): runs in one train process run one after another");
    for (const CLI::Option* preset_only : {shard, train_dir})
      if (preset_only->count())
        throw InvalidInput(fmt::format("{} needs --preset (or sweep --verb train); a plain train run takes --checkpoint DIR",
                                       preset_only->get_name()));
    if (shared.dry_run) return cmd_dry_run(o->grid.grid(), RunOptions{}, false, o->wide ? 0 : kDefaultTableWidth);
    if (shared.status) throw InvalidInput("--status needs --preset (or use sweep --verb train ... --status)");
    if (o->retry_failed) throw InvalidInput("--retry-failed needs --preset (a single run has no failed points to retry)");
    if (o->train.convert_dtype && !o->train.resume) throw InvalidInput("--convert-dtype needs --resume (it continues a checkpoint)");
    return cmd_train(o->grid.grid(), o->train, command);
  };
}

}  // namespace

Verb train_verb() {
  return {"train",
          "train the model of a task to accuracy with any mechanism: held-out validation and test, checkpoints, a learning "
          "curve, a result entry",
          {"attnbench train --task copy --seq 64 --layers 2 --dmodel 64 --heads 4 --mlp 128 --attn linear --steps 2000 --log copy.jsonl",
           "attnbench train --task listops --seq 2000 --attn flash --steps 5000 --lr 1e-3 --schedule onecycle --warmup-steps 500 "
           "--checkpoint ckpt/ --checkpoint-every 500 --out listops.json",
           "attnbench train --preset lra-accuracy --out lra.json --resume"},
          add_train};
}

}  // namespace ab
