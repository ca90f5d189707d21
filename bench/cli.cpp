#include "bench/cli.hpp"

#include <fmt/format.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <set>
#include <sstream>

#include "bench/compare.hpp"
#include "bench/dump.hpp"
#include "bench/export.hpp"
#include "bench/plan.hpp"
#include "bench/process.hpp"
#include "bench/result_writer.hpp"
#include "bench/runner.hpp"
#include "bench/grid.hpp"
#include "bench/list.hpp"
#include "bench/merge.hpp"
#include "bench/run.hpp"
#include "bench/sweep.hpp"
#include "bench/history.hpp"
#include "bench/report.hpp"
#include "bench/table.hpp"
#include "bench/task_cli.hpp"
#include "bench/text_table.hpp"
#include "bench/train.hpp"
#include "bench/train_presets.hpp"

namespace ab {

namespace {
// For an option the verb does not have: " (did you mean --seq?)" when one of its options is close.
std::string option_suggestion(CLI::App& app, const CLI::ParseError& e) {
  const std::string what = e.what();
  const std::string marker = "not expected: ";
  const auto at = what.find(marker);
  if (at == std::string::npos) return "";
  // The first of the unexpected arguments that looks like an option.
  std::string given;
  std::istringstream words(what.substr(at + marker.size()));
  for (std::string w; words >> w;)
    if (w.rfind("--", 0) == 0) {
      given = w.substr(0, w.find('='));
      break;
    }
  if (given.empty()) return "";
  // The verb the arguments went to: the last one parsed.
  CLI::App* verb = &app;
  for (auto* sub : app.get_subcommands([](CLI::App* s) { return s->parsed(); })) {
    verb = sub;
    for (auto* inner : sub->get_subcommands([](CLI::App* s) { return s->parsed(); })) verb = inner;
  }
  std::vector<std::string> names;
  for (const auto* opt : verb->get_options())
    for (const auto& n : opt->get_lnames()) names.push_back("--" + n);
  const auto near = closest_name(given, names);
  return near ? fmt::format(" (did you mean {}?)", *near) : "";
}

// An error is one line of bounded length, however long the input it quotes (a 10^6-character
// TSV field once made a 1 MB message): newlines become spaces, and the middle of a long message
// is cut, keeping its start (what failed) and its end (what is allowed).
std::string one_error_line(std::string message) {
  std::replace(message.begin(), message.end(), '\n', ' ');
  constexpr size_t kMax = 400;
  if (message.size() <= kMax) return message;
  return message.substr(0, 200) + fmt::format(" [... {} characters ...] ", message.size() - 350) +
         message.substr(message.size() - 150);
}

std::string join_args(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    s += (i ? " " : "") + shell_quote(argv[i]);
  }
  return s;
}

// An option given an empty value (`--out ''`, `--preset ''`, `--data-dir ''`) names nothing: it
// was a mistake (an unset shell variable), not a request for the default, and the verbs used to
// run for hours before noticing or ignore it. Refused for every option of the verbs parsed;
// --filter '' is a regular expression that matches every point, so it stays.
void refuse_empty_values(CLI::App& app) {
  std::vector<CLI::App*> parsed = {&app};
  for (size_t i = 0; i < parsed.size(); ++i)
    for (auto* sub : parsed[i]->get_subcommands([](CLI::App* s) { return s->parsed(); })) parsed.push_back(sub);
  for (auto* verb : parsed)
    for (const auto* opt : verb->get_options()) {
      if (opt->count() == 0 || opt->get_expected_min() == 0 || opt->get_name() == "--filter") continue;
      for (const auto& value : opt->results())
        if (value.empty())
          throw InvalidInput(opt->get_lnames().empty()
                                 ? fmt::format("an empty {} argument ('')", opt->get_name())
                                 : fmt::format("{} is given an empty value; leave it out or give one", opt->get_name()));
    }
}

// What narrows or changes a training preset (train --preset, run --preset): its mechanisms,
// tasks, seeds, threads and the image task's data. Every other field of its points is the
// preset's: giving one is an error, not ignored.
TrainPresetOptions preset_options(const GridOptions& g, const std::string& preset) {
  static const std::set<std::string> narrowing = {"attn", "task", "seed", "threads", "data_dir"};
  for (const auto& f : point_fields())
    if (!narrowing.count(f.key) && g.given(f.key))
      throw InvalidInput(fmt::format("--preset {} sets {} itself: --attn, --task, --seed, --threads and --data-dir narrow or change it",
                                     preset, f.option));
  TrainPresetOptions po;
  if (g.given("attn")) po.mechanisms = g.mechanism_list();
  if (g.given("task")) po.tasks = split(g.text.at("task"), ',');
  if (g.given("seed")) po.seeds = parse_int_list(g.text.at("seed"), 0);
  if (g.given("data_dir")) po.data_dir = g.text.at("data_dir");
  if (g.given("threads")) po.threads = static_cast<int>(parse_int_list(g.text.at("threads")).at(0));
  return po;
}

}  // namespace

int cli_main(int argc, char** argv) {
  guard_sweep_child();
  // Large buffers always come from (and go back to) mmap, so the resident set measured for one
  // point is not inflated by heap memory glibc kept from an earlier, larger point.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1 << 20);
  CLI::App app{"attnbench: efficient-attention mechanisms, benchmarked honestly on the CPU"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every verb");

  std::string list_what = "mechanisms", list_name;
  auto* list = app.add_subcommand("list", "list mechanisms, one mechanism's parameters, tasks, or a point's fields");
  list->add_option("what", list_what, "mechanisms | params | tasks | fields")->capture_default_str();
  list->add_option("name", list_name, "mechanism name (for params)");
  std::string list_data_dir;
  list->add_option("--data-dir", list_data_dir, "tasks: show what this directory provides");
  bool list_wide = false;
  list->add_flag("--wide", list_wide, "every column in full (default: fitted to 100 columns)");
  std::string list_format = "text";
  list->add_option("--format", list_format, "text | json (json: list fields, for scripts)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();

  // run
  GridOptions run_grid;
  MeasureOptions run_measure;
  std::string run_out, run_format = "md", run_preset;
  auto* run = app.add_subcommand("run", "benchmark mechanisms over sequence lengths and modes, in this process");
  run_grid.add_to(run, GridOptions::Verb::run);
  run_measure.add_to(run);
  run->add_option("--rounds", run_measure.run.rounds,
                  "passes over the list of points, one after another (--reps each), every repetition kept: "
                  "compared points are measured close together in every pass")
      ->capture_default_str();
  run->add_option("--out", run_out, "write the Google-Benchmark JSON result file here ('-': to stdout, instead of the table)");
  bool run_force = false;
  run->add_flag("--force", run_force, "overwrite --out when it exists");
  run->add_option("--preset", run_preset,
                  "lra-efficiency: LRA's efficiency table (text task, N = 1K..4K, train, every mechanism, batch 4 "
                  "unless --batch), printed in the LRA layout; " + train_preset_names() +
                      ": the training preset's configurations (model, batch, length), each one training step timed "
                      "(the speed and memory of its accuracy chart: scripts/plot.py bubbles --speed)");
  run->add_option("--format", run_format, "stdout format: md | csv | json")->capture_default_str();
  bool run_wide = false;
  run->add_flag("--wide", run_wide, "stdout: every column in full (default: fitted to 100 columns)");
  // Shared by the verbs that run points.
  bool dry_run = false;
  std::vector<std::string> user_context;
  auto add_dry_run_and_context = [&](CLI::App* verb) {
    verb->add_flag("--dry-run", dry_run,
                   "print the points (with predicted memory and a lower bound on the time) and run nothing");
    verb->add_option("--context", user_context,
                     "KEY=VALUE added to the result file's context, e.g. --context kernel_patch=v2 (repeatable)");
  };
  add_dry_run_and_context(run);
  bool status_only = false;
  const char* status_help =
      "print how far the sweep in --out (its --shard) has come: points done, failed and left; runs nothing";

  // sweep
  GridOptions sweep_grid;
  sweep_grid.text["seq"] = "256:16384:x2";
  MeasureOptions sweep_measure;
  std::string shard = "1/1";
  SweepOptions sweep_opts;
  auto* sweep = app.add_subcommand("sweep", "run a grid, each point in its own process, appended to --out as it finishes");
  sweep_grid.add_to(sweep, GridOptions::Verb::sweep);
  sweep_measure.add_to(sweep);
  sweep->add_option("--out", sweep_opts.out, "the result file, rewritten whole after every point ('-': stdout at the end)")->required();
  add_dry_run_and_context(sweep);
  sweep->add_flag("--status", status_only, status_help);
  sweep->add_flag("--resume", sweep_opts.resume, "keep the points already in --out and run only the missing ones");
  sweep->add_flag("--retry-failed", sweep_opts.retry_failed,
                  "with --resume: run again the points --out records as failed (CRASHED, OOM, TIMEOUT, FAILED); the "
                  "earlier attempts' statuses stay in the context's 'retried' list");
  sweep->add_option("--time-limit", sweep_opts.time_limit_s, "seconds one point may take before it is stopped as TIMEOUT (0: none)")->capture_default_str();
  sweep->add_option("--shard", shard, "i/n: run only the i-th of n disjoint parts of the grid (merge the files afterwards)")->capture_default_str();
  const std::string jobs_help =
      "training runs to make at the same time, each on its own CPUs (e.g. 2 on two cores with --threads 1); one file";
  sweep->add_option("--jobs", sweep_opts.jobs, jobs_help)->capture_default_str();
  sweep->add_option("--verb", sweep_opts.verb,
                    "run: benchmark points (the default) | train: training runs to accuracy (the train verb's options; "
                    "each run checkpoints in --train-dir and resumes there)")
      ->capture_default_str();
  sweep->add_option("--train-dir", sweep_opts.train_dir,
                    "--verb train: the runs' checkpoints and learning curves (default: OUT.train/)");
  sweep->add_option("--checkpoint-every", sweep_opts.checkpoint_every, "--verb train: steps between checkpoints")
      ->capture_default_str();
  sweep->add_option("--log-every", sweep_opts.log_every, "--verb train: steps per learning-curve line")->capture_default_str();

  // train
  GridOptions train_grid;
  TrainCliOptions train_opts;
  auto* train = app.add_subcommand("train", "train the model of a task to accuracy with any mechanism: held-out "
                                            "validation and test, checkpoints, a learning curve, a result entry");
  train_grid.add_to(train, GridOptions::Verb::train);
  train->add_option("--checkpoint", train_opts.checkpoint_dir,
                    "directory for the run's checkpoint (several runs: a subdirectory each)");
  train->add_option("--checkpoint-every", train_opts.checkpoint_every, "steps between checkpoints (0: at the end and when stopped)")
      ->capture_default_str();
  train->add_flag("--resume", train_opts.resume, "continue from the checkpoint in --checkpoint");
  train->add_option("--log", train_opts.log_path, "write the learning curve here, one JSON object per line");
  train->add_option("--log-every", train_opts.log_every, "steps per log line (the loss averaged over them)")->capture_default_str();
  train->add_option("--out", train_opts.out, "add each run's result entry to this result file (created if absent)");
  add_dry_run_and_context(train);
  train->add_flag("--status", status_only, std::string("--preset: ") + status_help);
  train->add_option("--format", train_opts.format, "stdout: md | json")->capture_default_str();
  bool train_wide = false;
  train->add_flag("--wide", train_wide, "stdout: every column in full (default: fitted to 100 columns)");
  std::string train_preset, train_shard = "1/1", train_dir;
  train->add_option("--preset", train_preset,
                    "a published comparison's grid of runs (" + train_preset_names() +
                        "; docs/reproductions.md), run like sweep --verb train: each run isolated, the file --out "
                        "saved after each, --resume continues, --shard splits; --attn, --task, --seed, --threads "
                        "narrow or change it");
  train->add_option("--shard", train_shard, "--preset: run the i-th of n disjoint parts of the grid")->capture_default_str();
  train->add_option("--train-dir", train_dir, "--preset: the runs' checkpoints and learning curves (default: OUT.train/)");
  int train_jobs = 1;
  train->add_option("--jobs", train_jobs, "--preset: " + jobs_help)->capture_default_str();
  bool train_retry_failed = false;
  train->add_flag("--retry-failed", train_retry_failed,
                  "--preset with --resume: run again the runs --out records as failed (a finished run's checkpoint "
                  "makes that a test evaluation); the earlier statuses stay in the context's 'retried' list");

  // table
  std::vector<std::string> table_files;
  TableOptions topts;
  auto* table = app.add_subcommand("table", "comparison tables from result files: rows mechanisms, columns N");
  table->add_option("files", table_files, "result files")->required();
  table->add_option("--metric", topts.metric, "time | cpu_time | " + table_metric_names())->capture_default_str();
  auto* table_baseline = table->add_option("--baseline", topts.baseline, "mechanism the ratios are taken against ('none' for no ratios)")->capture_default_str();
  table->add_option("--format", topts.format, "md | csv | latex")->capture_default_str();
  table->add_option("--published", topts.published,
                    "with --metric accuracy: 'lra' draws LRA Table 1's layout (a row per mechanism, LRA's five tasks, "
                    "'not run' where there is no run), its published row under each mechanism's, and the rank "
                    "correlation per task");
  table->add_flag("--growth", topts.growth,
                  "in brackets: each value over the same row's value at the previous N (how a time grows with N), "
                  "instead of the ratio to --baseline")
      ->excludes(table_baseline);
  table->add_option("--filter", topts.filter, "only the points whose name this regular expression matches");

  // report
  std::vector<std::string> report_files;
  ReportOptions ropts;
  auto* report = app.add_subcommand("report", "result files as one self-contained HTML page: machine, tables, plots, "
                                              "every point's command; sortable tables, no network");
  report->add_option("files", report_files, "result files")->required();
  report->add_option("--out", ropts.out_dir, "the directory the page goes to (DIR/index.html; made if missing)")->required();
  report->add_option("--image", ropts.images, "a further PNG to embed (learning curves, a frontier); repeatable");
  report->add_option("--title", ropts.title, "the page's title")->capture_default_str();
  bool report_no_plots = false;
  report->add_flag("--no-plots", report_no_plots, "leave out the plots (they need /usr/bin/python3 with matplotlib)");
  report->add_flag("--force", ropts.force, "replace DIR/index.html when it exists");

  // history
  std::vector<std::string> history_files;
  HistoryOptions hopts;
  auto* history = app.add_subcommand("history", "results across commits: a SQLite store of result files, and a page of "
                                                "each point's time against the runs");
  history->require_subcommand(1);
  auto* history_add_cmd = history->add_subcommand("add", "append result files to the history (a file already there is "
                                                         "recorded once)");
  history_add_cmd->add_option("files", history_files, "result files")->required();
  history_add_cmd->add_option("--db", hopts.db, "the history's SQLite file (made if missing)")->capture_default_str();
  auto* history_report_cmd = history->add_subcommand("report", "one HTML page: per machine, each point's median time "
                                                               "against the runs, the regressions marked");
  history_report_cmd->add_option("--db", hopts.db, "the history's SQLite file")->capture_default_str();
  history_report_cmd->add_option("--out", hopts.out_dir, "the directory the page goes to (DIR/index.html)")->required();
  history_report_cmd->add_option("--max-regress", hopts.max_regress, "slowdown a regression must exceed (0.05 = 5%)")
      ->capture_default_str();
  history_report_cmd->add_option("--alpha", hopts.alpha, "significance level of the Mann-Whitney U test")->capture_default_str();
  history_report_cmd->add_flag("--force", hopts.force, "replace DIR/index.html when it exists");

  // compare
  std::string base_file, new_file;
  CompareOptions copts;
  auto* compare = app.add_subcommand("compare", "the regression gate: exit 1 when NEW is significantly worse than BASE");
  compare->add_option("base", base_file, "the baseline result file")->required();
  compare->add_option("new", new_file, "the result file to judge")->required();
  compare->add_option("--metric", copts.metric,
                      "time (real time and tracked memory) | instructions | memory | accuracy (training runs' test "
                      "accuracy)")
      ->capture_default_str();
  compare->add_option("--max-regress", copts.max_regress,
                      "worsening tolerated: relative (0.05 = 5%), or for accuracy the drop (0.01 = one point)")
      ->capture_default_str();
  compare->add_option("--alpha", copts.alpha, "significance level of the Mann-Whitney U test")->capture_default_str();
  compare->add_option("--format", copts.format, "md | csv")->capture_default_str();
  bool compare_wide = false;
  compare->add_flag("--wide", compare_wide, "every point's whole name in its row");
  compare->add_flag("--any-machine", copts.any_machine,
                    "compare wall times measured on different machines (exit 3 without it)");
  compare->add_flag("--per-gemm", copts.per_gemm,
                    "time: each file's times in units of the GEMM rate measured in its own run (a uniformly slower "
                    "machine cancels out)");
  compare->add_option("--filter", copts.filter, "only the points whose name this regular expression matches");

  // export
  std::vector<std::string> export_paths;
  ExportOptions eopts;
  auto* exporter = app.add_subcommand("export", "result files as one long table: a row per repetition, every field, full "
                                                "precision (for spreadsheets, pandas, SQL)");
  exporter->add_option("files", export_paths, "result files")->required();
  exporter->add_option("--format", eopts.format, "csv | jsonl | sql (CREATE TABLE and INSERTs, e.g. for sqlite3)")
      ->capture_default_str();
  exporter->add_option("--out", eopts.out, "write here instead of stdout");
  exporter->add_option("--filter", eopts.filter, "only the points whose name this regular expression matches");
  exporter->add_flag("--force", eopts.force, "overwrite --out when it exists");

  // merge
  std::vector<std::string> merge_files;
  std::string merge_out;
  bool mixed_cpus = false;
  auto* merge = app.add_subcommand("merge", "join result files (e.g. the shards of a sweep) into one");
  merge->add_option("files", merge_files, "result files")->required();
  merge->add_option("--out", merge_out, "the merged file")->required();
  bool merge_force = false;
  merge->add_flag("--force", merge_force, "overwrite --out when it exists");
  merge->add_flag("--allow-mixed-cpus", mixed_cpus, "merge files measured on different CPU models");

  // dump
  GridOptions dump_grid;
  dump_grid.text["seq"] = "128";
  dump_grid.text["heads"] = "2";
  dump_grid.text["dhead"] = "16";
  std::string dump_dir;
  auto* dump = app.add_subcommand("dump", "write inputs, parameters and outputs of one call as .npy + config.json");
  dump_grid.add_to(dump, GridOptions::Verb::dump);
  dump->add_option("--out", dump_dir, "output directory")->required();

  // task sample | rate
  TaskCliOptions task_opts;
  auto* task = app.add_subcommand("task", "task data: sample examples, or measure the generation rate");
  task->require_subcommand(1);
  auto add_task_options = [&](CLI::App* sub) {
    sub->add_option("--task", task_opts.task, "task name (attnbench list tasks)")->required();
    sub->add_option("--seed", task_opts.task_opts.seed, "generator seed")->capture_default_str();
    sub->add_option("--seq", task_opts.task_opts.seq, "sequence length (0: the task's default)")->capture_default_str();
    sub->add_option("--data-dir", task_opts.task_opts.data_dir, "read the task's real data from here");
    sub->add_option("--difficulty", task_opts.task_opts.difficulty, "pathfinder, pathx: easy | intermediate | hard")->capture_default_str();
    sub->add_option("--split", task_opts.split, "train | val | test: the examples `train` draws that split from")->capture_default_str();
    sub->add_option("--vocab", task_opts.task_opts.vocab, "mqar: the vocabulary (0: the task's default)");
    sub->add_option("--kv-pairs", task_opts.task_opts.kv_pairs, "mqar: key-value pairs per example (0: N/16)");
  };
  auto* task_sample = task->add_subcommand("sample", "print examples a person can read, or JSON lines");
  add_task_options(task_sample);
  task_sample->add_option("--count", task_opts.count, "examples")->capture_default_str();
  task_sample->add_option("--first", task_opts.first, "index of the first example")->capture_default_str();
  task_sample->add_option("--format", task_opts.format, "md (readable) | jsonl (one JSON object per example) | labels (how many examples have each class)")->capture_default_str();
  task_sample->add_option("--png", task_opts.png_dir, "image tasks: also write each example as a PNG here");
  task_sample->add_option("--scale", task_opts.scale, "--png: each pixel as scale x scale pixels")->capture_default_str();
  auto* task_rate = task->add_subcommand("rate", "time batch generation (samples/s)");
  add_task_options(task_rate);
  task_rate->add_option("--batch", task_opts.batch, "examples per batch (0: the task's LRA batch)")->capture_default_str();
  task_rate->add_option("--reps", task_opts.reps, "timed batches")->capture_default_str();
  task_rate->add_option("--threads", task_opts.threads, "OpenMP threads")->capture_default_str();

  // Every verb's --help ends with examples a user can paste.
  const std::vector<std::pair<CLI::App*, std::vector<const char*>>> examples = {
      {list, {"attnbench list", "attnbench list params reformer", "attnbench list tasks --data-dir /usr/share/datasets/fashion-mnist",
              "attnbench list fields --format json"}},
      {run, {"attnbench run --attn flash,local,linear --seq 1024,4096 --mode fwd,fwdbwd",
             "attnbench run --attn all --seq 1024:16384:x2 --dry-run",
             "attnbench run --attn all --seq 2048 --error --out all.json",
             "attnbench run --level model --task text --mode train --seq 1024 --batch 4 --attn flash,linformer"}},
      {sweep, {"attnbench sweep --attn all --seq 256:16384:x2 --out sweep.json",
               "attnbench sweep --attn all --seq 256:16384:x2 --filter 'attn:(flash|linear)/' --out sweep.json --dry-run",
               "attnbench sweep --attn all --seq 256:16384:x2 --out sweep.json --resume --shard 2/4",
               "attnbench sweep --verb train --task copy --seq 64 --attn flash,linear --seed 1,2,3 --steps 2000 --out copy.json"}},
      {train, {"attnbench train --task copy --seq 64 --layers 2 --dmodel 64 --heads 4 --mlp 128 --attn linear --steps 2000 --log copy.jsonl",
               "attnbench train --task listops --seq 2000 --attn flash --steps 5000 --lr 1e-3 --schedule onecycle --warmup-steps 500 "
               "--checkpoint ckpt/ --checkpoint-every 500 --out listops.json",
               "attnbench train --preset lra-accuracy --out lra.json --resume"}},
      {table, {"attnbench table sweep.json --metric time --baseline flash", "attnbench table sweep.json --metric memory --format csv",
               "attnbench table lra.json --metric accuracy --published lra"}},
      {report, {"attnbench report results/main/default_sweep.json --out report/",
                "attnbench report sweep.json lra.json --image curves.png --title 'LRA on this machine' --out report/ --force"}},
      {history, {"attnbench history add results/ci/new.json --db history.db", "attnbench history report --db history.db --out history/"}},
      {history_add_cmd, {"attnbench history add results/ci/new.json --db history.db"}},
      {history_report_cmd, {"attnbench history report --db history.db --out history/ --force"}},
      {compare, {"attnbench compare base.json new.json", "attnbench compare base.json new.json --metric instructions --max-regress 0.01",
                 "attnbench compare base.json new.json --metric accuracy --max-regress 0.01"}},
      {merge, {"attnbench merge shard1.json shard2.json --out all.json"}},
      {exporter, {"attnbench export sweep.json --out sweep.csv", "attnbench export sweep.json --format sql | sqlite3 results.db",
                  "attnbench export a.json b.json --format jsonl --filter 'attn:flash/'"}},
      {dump, {"attnbench dump --attn performer --seq 128 --out perf_dump/", "attnbench dump --attn bigbird --param block=16 --seq 64 --causal --out bb/"}},
      {task, {"attnbench task sample --task listops --count 2", "attnbench task rate --task pathfinder"}},
      {task_sample, {"attnbench task sample --task listops --count 2", "attnbench task sample --task image --png samples/ --scale 4",
                      "attnbench task sample --task text --seq 1000 --split test --count 2000 --format labels"}},
      {task_rate, {"attnbench task rate --task pathfinder", "attnbench task rate --task text --batch 32 --threads 2"}},
  };
  for (const auto& [verb, lines] : examples) {
    std::string footer = "\nExamples:";
    for (const char* l : lines) footer += std::string("\n  ") + l;
    verb->footer(footer);
  }
  app.footer("\nRun `attnbench VERB --help` for a verb's options and examples; docs/cli.md has them all.");
  app.set_version_flag("--version", fmt::format("attnbench {} (commit {}, {} build, {})", ATTNBENCH_VERSION, build_git_commit(),
                                                ATTNBENCH_BUILD_TYPE, compiler_name()));

  if (argc > 1 && argv[1][0] != '-') {
    const std::string verb = argv[1];
    std::vector<std::string> verbs;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) verbs.push_back(sub->get_name());
    if (std::find(verbs.begin(), verbs.end(), verb) == verbs.end()) {
      std::cerr << "attnbench: error: " << unknown_name("verb", verb, verbs, "verbs").what() << "\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "attnbench: error: " << e.what() << option_suggestion(app, e) << " (see --help)\n";
    return 2;
  }

  const std::string command = join_args(argc, argv);
  try {
    refuse_empty_values(app);
    set_user_context(user_context);
    if (list->parsed())
      return cmd_list(list_what, list_what == "tasks" ? list_data_dir : list_name, list_wide ? 0 : kDefaultTableWidth,
                      list_format == "json");
    if (task_sample->parsed()) return cmd_task_sample(task_opts);
    if (task_rate->parsed()) return cmd_task_rate(task_opts);
    if (run->parsed()) {
      run_grid.set_training(false);
      std::vector<PointId> points;
      if (is_train_preset(run_preset)) {
        // A training preset's configurations, timed (the speed axis of its accuracy chart).
        points = filter_points(train_preset_timing_points(run_preset, preset_options(run_grid, run_preset)), run_grid.filter);
        run_measure.run.oom_as_status = true;
      } else {
        apply_run_preset(run_preset, run_grid, run_measure.run);
        points = run_grid.grid();
      }
      run_measure.finish(run_grid);
      if (dry_run) return cmd_dry_run(points, run_measure.run, false, run_wide ? 0 : kDefaultTableWidth);
      prepare_output_path(run_out, run_force);  // before any point runs
      return cmd_run(points, run_measure.run, run_out, run_format, command, run_preset, run_wide ? 0 : kDefaultTableWidth);
    }
    if (sweep->parsed()) {
      if (sweep_opts.verb != "run" && sweep_opts.verb != "train")
        throw unknown_name("--verb", sweep_opts.verb, {"run", "train"}, "verbs a sweep runs");
      sweep_grid.set_training(sweep_opts.verb == "train");
      if (sweep_opts.verb == "train" && !sweep->get_option("--time-limit")->count()) sweep_opts.time_limit_s = 0;
      if (sweep_opts.train_dir.empty()) sweep_opts.train_dir = sweep_opts.out + ".train";
      sweep_measure.finish(sweep_grid);
      parse_shard(shard, &sweep_opts.shard_index, &sweep_opts.shard_count);
      if (!(sweep_opts.time_limit_s >= 0) || !std::isfinite(sweep_opts.time_limit_s))
        throw InvalidInput(fmt::format("--time-limit {} is not a finite number of seconds >= 0", sweep_opts.time_limit_s));
      sweep_opts.command = command;
      if (dry_run) return cmd_sweep_dry_run(sweep_grid.grid(), sweep_measure.run, sweep_opts, kDefaultTableWidth);
      if (status_only) return cmd_sweep_status(sweep_grid.grid(), sweep_opts);
      if (sweep_opts.out == "-") return run_sweep_to_stdout(sweep_grid.grid(), sweep_measure.run, sweep_opts);
      return run_sweep(sweep_grid.grid(), sweep_measure.run, sweep_opts);
    }
    if (train->parsed()) {
      train_grid.set_training(true);
      if (train_wide) train_opts.width = 0;
      if (train_preset.empty()) {
        if (train_jobs != 1)
          throw InvalidInput("--jobs needs --preset (or sweep --verb train): runs in one train process run one after another");
        for (const char* preset_only : {"--shard", "--train-dir"})
          if (train->get_option(preset_only)->count())
            throw InvalidInput(fmt::format("{} needs --preset (or sweep --verb train); a plain train run takes --checkpoint DIR",
                                           preset_only));
        if (dry_run) return cmd_dry_run(train_grid.grid(), RunOptions{}, false, train_wide ? 0 : kDefaultTableWidth);
        if (status_only) throw InvalidInput("--status needs --preset (or use sweep --verb train ... --status)");
        if (train_retry_failed) throw InvalidInput("--retry-failed needs --preset (a single run has no failed points to retry)");
        return cmd_train(train_grid.grid(), train_opts, command);
      }
      // A preset: its grid through the sweep (isolated runs, resumable, shardable).
      const TrainPresetOptions po = preset_options(train_grid, train_preset);
      SweepOptions so;
      so.out = train_opts.out;
      so.resume = train_opts.resume;
      so.retry_failed = train_retry_failed;
      so.verb = "train";
      so.time_limit_s = 0;
      so.train_dir = train_dir.empty() ? train_opts.out + ".train" : train_dir;
      so.checkpoint_every = train_opts.checkpoint_every > 0 ? train_opts.checkpoint_every : 100;
      so.log_every = train_opts.log_every;
      so.command = command;
      so.jobs = train_jobs;
      parse_shard(train_shard, &so.shard_index, &so.shard_count);
      MeasureOptions mo;
      mo.finish(train_grid);
      const auto grid = filter_points(train_preset_grid(train_preset, po), train_grid.filter);
      if (dry_run) return cmd_sweep_dry_run(grid, mo.run, so, train_wide ? 0 : kDefaultTableWidth);
      if (train_opts.out.empty()) throw InvalidInput("--preset needs --out FILE (the runs' result file)");
      if (status_only) return cmd_sweep_status(grid, so);
      return run_sweep(grid, mo.run, so);
    }
    if (table->parsed()) return cmd_table(table_files, topts);
    if (history_add_cmd->parsed()) return cmd_history_add(history_files, hopts);
    if (history_report_cmd->parsed()) return cmd_history_report(hopts);
    if (report->parsed()) {
      ropts.plots = !report_no_plots;
      return cmd_report(report_files, ropts);
    }
    if (compare->parsed()) {
      copts.short_names = !compare_wide;
      return cmd_compare(base_file, new_file, copts);
    }
    if (exporter->parsed()) return cmd_export(export_paths, eopts);
    if (merge->parsed()) {
      refuse_overwriting_inputs(merge_out, merge_files);
      prepare_output_path(merge_out, merge_force);
      return cmd_merge(merge_files, merge_out, mixed_cpus, command);
    }
    if (dump->parsed()) {
      if (dump_grid.mechanism_list().size() != 1) throw InvalidInput("dump takes exactly one mechanism");
      const auto grid = dump_grid.grid();
      if (grid.size() != 1) throw InvalidInput("dump takes exactly one value of each size and parameter");
      dump_point(grid[0], dump_grid.seed(), dump_dir);
      std::cout << dump_dir << "\n";
      return 0;
    }
  } catch (const InvalidInput& e) {
    std::cerr << "attnbench: error: " << one_error_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "attnbench: failed: " << one_error_line(e.what()) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace ab
