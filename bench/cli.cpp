#include "bench/cli.hpp"

#include <fmt/format.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <sstream>

#include "bench/points/grid.hpp"
#include "bench/process/process.hpp"
#include "bench/engine/runner.hpp"
#include "bench/verbs/verb.hpp"

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
  // The verbs, registered in one list (bench/verbs/verbs.cpp); each --help ends with examples.
  SharedOptions shared;
  std::vector<std::pair<CLI::App*, VerbMain>> mains;
  for (const Verb& v : verbs()) {
    CLI::App* sub = app.add_subcommand(v.name, v.summary);
    mains.emplace_back(sub, v.add_options(*sub, shared));
    set_examples(*sub, v.examples);
  }
  app.footer("\nRun `attnbench VERB --help` for a verb's options and examples; docs/cli.md has them all.");
  app.set_version_flag("--version", fmt::format("attnbench {} (commit {}, {} build, {})", ATTNBENCH_VERSION, build_git_commit(),
                                                ATTNBENCH_BUILD_TYPE, compiler_name()));

  if (argc > 1 && argv[1][0] != '-') {
    const std::string verb = argv[1];
    std::vector<std::string> names;
    for (const Verb& v : verbs()) names.push_back(v.name);
    if (std::find(names.begin(), names.end(), verb) == names.end()) {
      std::cerr << "attnbench: error: " << unknown_name("verb", verb, names, "verbs").what() << "\n";
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
    set_user_context(shared.context);
    for (const auto& [sub, run] : mains)
      if (sub->parsed()) return run(command);
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
