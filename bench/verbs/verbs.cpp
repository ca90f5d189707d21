#include <fmt/format.h>

#include <set>

#include "bench/verbs/verb.hpp"
#include "core/dtype.hpp"

namespace ab {

const std::vector<Verb>& verbs() {
  static const std::vector<Verb> all = {list_verb(),   run_verb(),     sweep_verb(),   train_verb(),
                                        table_verb(),  report_verb(),  history_verb(), compare_verb(),
                                        export_verb(), merge_verb(),   dump_verb(),    task_verb()};
  return all;
}

void set_examples(CLI::App& app, const std::vector<const char*>& lines) {
  std::string footer = "\nExamples:";
  for (const char* l : lines) footer += std::string("\n  ") + l;
  app.footer(footer);
}

void SharedOptions::add_dry_run_and_context(CLI::App& verb) {
  verb.add_flag("--dry-run", dry_run, "print the points (with predicted memory and a lower bound on the time) and run nothing");
  verb.add_option("--context", context, "KEY=VALUE added to the result file's context, e.g. --context kernel_patch=v2 (repeatable)");
}

void SharedOptions::add_status(CLI::App& verb, const std::string& prefix) {
  verb.add_flag("--status", status,
                prefix + "print how far the sweep in --out (its --shard) has come: points done, failed and left; runs nothing");
}

const char* SharedOptions::jobs_help() {
  return "training runs to make at the same time, each on its own CPUs (e.g. 2 on two cores with --threads 1); one file";
}

TrainPresetOptions preset_options(const GridOptions& g, const std::string& preset) {
  static const std::set<std::string> narrowing = {"attn", "task", "seed", "threads", "data_dir", "dtype"};
  for (const auto& f : point_fields())
    if (!narrowing.count(f.key) && g.given(f.key))
      throw InvalidInput(fmt::format("--preset {} sets {} itself: --attn, --task, --seed, --threads, --data-dir and --dtype narrow or "
                                     "change it",
                                     preset, f.option));
  TrainPresetOptions po;
  if (g.given("attn")) po.mechanisms = g.mechanism_list();
  if (g.given("task")) po.tasks = split(g.text.at("task"), ',');
  if (g.given("seed")) po.seeds = parse_int_list(g.text.at("seed"), 0);
  if (g.given("data_dir")) po.data_dir = g.text.at("data_dir");
  if (g.given("threads")) po.threads = static_cast<int>(parse_int_list(g.text.at("threads")).at(0));
  if (g.given("dtype")) {
    const auto dtypes = split(g.text.at("dtype"), ',');
    if (dtypes.size() != 1) throw InvalidInput(fmt::format("--preset {} takes one --dtype (a result file per precision)", preset));
    po.dtype = parse_dtype(dtypes[0]);
    if (po.dtype == Dtype::bf16 && !cpu_has_bf16())
      throw InvalidInput("--dtype bf16 needs a CPU with AVX512-BF16 (vdpbf16ps); this one has none");
  }
  return po;
}

}  // namespace ab
