// attnbench run: benchmark points in this process (a grid of mechanisms, lengths, modes), or a
// preset's points.
#include <memory>

#include "bench/engine/plan.hpp"
#include "bench/results/result_writer.hpp"
#include "bench/engine/run.hpp"
#include "bench/text/text_table.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

struct RunVerbOptions {
  GridOptions grid;
  MeasureOptions measure;
  std::string out, format = "md", preset;
  bool force = false, wide = false;
};

VerbMain add_run(CLI::App& app, SharedOptions& shared) {
  auto o = std::make_shared<RunVerbOptions>();
  o->grid.add_to(&app, GridOptions::Verb::run);
  o->measure.add_to(&app);
  app.add_option("--rounds", o->measure.run.rounds,
                 "passes over the list of points, one after another (--reps each), every repetition kept: "
                 "compared points are measured close together in every pass")
      ->capture_default_str();
  app.add_option("--out", o->out, "write the Google-Benchmark JSON result file here ('-': to stdout, instead of the table)");
  app.add_flag("--force", o->force, "overwrite --out when it exists");
  app.add_option("--preset", o->preset,
                 "lra-efficiency: LRA's efficiency table (text task, N = 1K..4K, train, every mechanism, batch 4 "
                 "unless --batch), printed in the LRA layout; " + train_preset_names() +
                     ": the training preset's configurations (model, batch, length), each one training step timed "
                     "(the speed and memory of its accuracy chart: scripts/plot.py bubbles --speed)");
  app.add_option("--format", o->format, "stdout format: md | csv | json")->capture_default_str();
  app.add_flag("--wide", o->wide, "stdout: every column in full (default: fitted to 100 columns)");
  shared.add_dry_run_and_context(app);
  return [o, &shared](const std::string& command) {
    o->grid.set_training(false);
    std::vector<PointId> points;
    if (is_train_preset(o->preset)) {
      // A training preset's configurations, timed (the speed axis of its accuracy chart).
      points = filter_points(train_preset_timing_points(o->preset, preset_options(o->grid, o->preset)), o->grid.filter);
      o->measure.run.oom_as_status = true;
    } else {
      apply_run_preset(o->preset, o->grid, o->measure.run);
      points = o->grid.grid();
    }
    o->measure.finish(o->grid);
    const int width = o->wide ? 0 : kDefaultTableWidth;
    if (shared.dry_run) return cmd_dry_run(points, o->measure.run, false, width);
    prepare_output_path(o->out, o->force);  // before any point runs
    return cmd_run(points, o->measure.run, o->out, o->format, command, o->preset, width);
  };
}

}  // namespace

Verb run_verb() {
  return {"run", "benchmark mechanisms over sequence lengths and modes, in this process",
          {"attnbench run --attn flash,local,linear --seq 1024,4096 --mode fwd,fwdbwd",
           "attnbench run --attn all --seq 1024:16384:x2 --dry-run", "attnbench run --attn all --seq 2048 --error --out all.json",
           "attnbench run --level model --task text --mode train --seq 1024 --batch 4 --attn flash,linformer"},
          add_run};
}

}  // namespace ab
