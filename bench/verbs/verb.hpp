// A verb of the command line as one entry of a table, registered in one list (verbs.cpp): its
// name, its one-line summary, the examples its --help ends with, and a function that adds its
// options to its CLI11 subcommand and returns what runs it once the command line is parsed.
// bench/cli.cpp keeps the parsing, the options verbs share (SharedOptions) and the exit codes.
//
//   cli_main ── for each Verb: app.add_subcommand(name) ── add_options(sub, shared) -> VerbMain
//            ── app.parse ── the parsed verb's VerbMain(command) -> exit code
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "bench/points/grid.hpp"
#include "bench/points/train_presets.hpp"

namespace ab {

// The options several verbs take: --dry-run and --context (run, sweep, train), --status (sweep,
// train). One value each, whichever verb set it.
struct SharedOptions {
  bool dry_run = false;
  std::vector<std::string> context;
  bool status = false;
  void add_dry_run_and_context(CLI::App& verb);
  // --status, its help after `prefix` ("--preset: " for train).
  void add_status(CLI::App& verb, const std::string& prefix = "");
  static const char* jobs_help();  // sweep --jobs, train --preset --jobs
};

// What runs a parsed verb: given the command line as typed (shell-quoted), the exit code.
using VerbMain = std::function<int(const std::string& command)>;

struct Verb {
  const char* name;
  const char* summary;
  std::vector<const char*> examples;
  // Adds the verb's options (and its sub-verbs, with their examples) to `app`, the verb's
  // subcommand; their values live in what it returns.
  VerbMain (*add_options)(CLI::App& app, SharedOptions& shared);
};

// The verbs in the order `attnbench --help` lists them.
const std::vector<Verb>& verbs();

// A verb's or sub-verb's --help footer: "Examples:" and the lines.
void set_examples(CLI::App& app, const std::vector<const char*>& lines);

// What narrows or changes a training preset (train --preset, run --preset): its mechanisms, tasks,
// seeds, threads and the image task's data. Any other identity option is an error (InvalidInput).
TrainPresetOptions preset_options(const GridOptions& g, const std::string& preset);

// The verbs, one file each in bench/verbs/.
Verb list_verb();
Verb run_verb();
Verb sweep_verb();
Verb train_verb();
Verb table_verb();
Verb report_verb();
Verb history_verb();
Verb compare_verb();
Verb export_verb();
Verb merge_verb();
Verb dump_verb();
Verb task_verb();

}  // namespace ab
