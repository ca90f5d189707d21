// attnbench task sample | rate: a task's data, or how fast it is generated.
#include <memory>

#include "bench/engine/task_cli.hpp"
#include "bench/verbs/verb.hpp"

namespace ab {
namespace {

VerbMain add_task(CLI::App& app, SharedOptions&) {
  auto o = std::make_shared<TaskCliOptions>();
  app.require_subcommand(1);
  auto add_task_options = [o](CLI::App* sub) {
    sub->add_option("--task", o->task, "task name (attnbench list tasks)")->required();
    sub->add_option("--seed", o->task_opts.seed, "generator seed")->capture_default_str();
    sub->add_option("--seq", o->task_opts.seq, "sequence length (0: the task's default)")->capture_default_str();
    sub->add_option("--data-dir", o->task_opts.data_dir, "read the task's real data from here");
    sub->add_option("--difficulty", o->task_opts.difficulty, "pathfinder, pathx: easy | intermediate | hard")->capture_default_str();
    sub->add_option("--split", o->split, "train | val | test: the examples `train` draws that split from")->capture_default_str();
    sub->add_option("--vocab", o->task_opts.vocab, "mqar: the vocabulary (0: the task's default)");
    sub->add_option("--kv-pairs", o->task_opts.kv_pairs, "mqar: key-value pairs per example (0: N/16)");
  };
  auto* sample = app.add_subcommand("sample", "print examples a person can read, or JSON lines");
  add_task_options(sample);
  sample->add_option("--count", o->count, "examples")->capture_default_str();
  sample->add_option("--first", o->first, "index of the first example")->capture_default_str();
  sample->add_option("--format", o->format, "md (readable) | jsonl (one JSON object per example) | labels (how many examples have each class)")
      ->capture_default_str();
  sample->add_option("--png", o->png_dir, "image tasks: also write each example as a PNG here");
  sample->add_option("--scale", o->scale, "--png: each pixel as scale x scale pixels")->capture_default_str();
  set_examples(*sample, {"attnbench task sample --task listops --count 2", "attnbench task sample --task image --png samples/ --scale 4",
                         "attnbench task sample --task text --seq 1000 --split test --count 2000 --format labels"});
  auto* rate = app.add_subcommand("rate", "time batch generation (samples/s)");
  add_task_options(rate);
  rate->add_option("--batch", o->batch, "examples per batch (0: the task's LRA batch)")->capture_default_str();
  rate->add_option("--reps", o->reps, "timed batches")->capture_default_str();
  rate->add_option("--threads", o->threads, "OpenMP threads")->capture_default_str();
  set_examples(*rate, {"attnbench task rate --task pathfinder", "attnbench task rate --task text --batch 32 --threads 2"});
  return [o, sample](const std::string&) { return sample->parsed() ? cmd_task_sample(*o) : cmd_task_rate(*o); };
}

}  // namespace

Verb task_verb() {
  return {"task", "task data: sample examples, or measure the generation rate",
          {"attnbench task sample --task listops --count 2", "attnbench task rate --task pathfinder"}, add_task};
}

}  // namespace ab
