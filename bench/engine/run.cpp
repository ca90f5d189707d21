#include "bench/engine/run.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "bench/engine/instructions.hpp"
#include "bench/results/lra_report.hpp"
#include "bench/results/result_writer.hpp"
#include "bench/text/terminal.hpp"
#include "bench/points/train_presets.hpp"
#include "bench/results/warnings.hpp"
#include "core/matmul.hpp"
#include "core/sysinfo.hpp"

namespace ab {

void MeasureOptions::add_to(CLI::App* app) {
  app->add_option("--reps", run.reps, "repetitions, every one kept")->capture_default_str();
  app->add_option("--min-time", run.min_time, "seconds per repetition (iterations added to reach it)")->capture_default_str();
  app->add_option("--warmup", run.warmup, "untimed calls before timing")->capture_default_str();
  app->add_flag("--error", run.error, "report nmse of the output against flash");
  app->add_option("--mem-limit", mem_limit, "refuse points predicted above this, e.g. 16G (default 80% of RAM)");
  app->add_flag("--instructions", run.count_instructions,
                "also count each point's instructions per call under valgrind's callgrind (needs a build without "
                "AVX-512: docs/testing.md)");
  // Internal: the sweep passes its measured GEMM rate to each child; callgrind children run one call.
  app->add_option("--gemm-gflops", run.gemm_gflops)->group("");
  app->add_flag("--callgrind-child", run.callgrind_child)->group("");
  app->add_option("--reference-dir", run.reference_dir)->group("");
}

void MeasureOptions::finish(const GridOptions& grid) {
  run.seed = grid.training ? 0 : grid.seed();  // a training run carries its seeds in its points
  run.mem_limit = mem_limit.empty() ? default_memory_limit() : parse_bytes(mem_limit);
  if (run.reps < 1) throw InvalidInput("--reps must be at least 1");
  if (run.rounds < 1) throw InvalidInput("--rounds must be at least 1");
  if (!(run.min_time >= 0) || !(run.min_time <= 3600))
    throw InvalidInput(fmt::format("--min-time {} is not a number of seconds in [0, 3600]", run.min_time));
  if (run.warmup < 0) throw InvalidInput("--warmup must not be negative");
  if (run.count_instructions) check_instruction_counting();
}

// `run --preset lra-efficiency`: the LRA efficiency protocol (published.md, Table 2) at a batch
// this machine holds.
void apply_run_preset(const std::string& preset, GridOptions& grid, RunOptions& opts) {
  if (preset.empty()) return;
  if (preset != "lra-efficiency") {
    std::vector<std::string> known = {"lra-efficiency"};
    known.insert(known.end(), train_presets().begin(), train_presets().end());
    throw unknown_name("preset", preset, known, "presets");
  }
  if (grid.given("task") && grid.text["task"] != "text") throw InvalidInput("--preset lra-efficiency is the text task");
  if (grid.given("level") || grid.given("mode")) throw InvalidInput("--preset lra-efficiency sets --level model --mode train");
  grid.text["task"] = "text";
  grid.text["level"] = "model";
  grid.text["mode"] = "train";
  if (!grid.given("attn")) grid.attn = {"all"};
  if (!grid.given("seq")) grid.set_by_preset("seq", "1024:4096:+1024");
  if (!grid.given("batch")) grid.set_by_preset("batch", "4");  // LRA's 32 needs ~8x the memory and time; see README
  // A point this machine cannot hold is a row marked OOM, as LRA marks FAIL, not an abort.
  opts.oom_as_status = true;
}

namespace {
void check_format(const std::string& format, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (format == a) return;
  throw unknown_name("format", format, std::vector<std::string>(allowed.begin(), allowed.end()), "formats");
}

}  // namespace

int cmd_run(const std::vector<PointId>& grid, const RunOptions& opts, const std::string& out_path,
            const std::string& format, const std::string& command, const std::string& preset, int width) {
  check_format(format, {"md", "csv", "json"});

  // Validate every point before running any: bad input exits 2 with nothing written. The
  // prepared points are the ones that run (constructing allocates nothing; setup does).
  std::vector<PreparedPoint> points;
  for (const auto& id : grid) points.push_back(prepare_point(id, opts));

  std::set<int> thread_counts;
  for (const auto& id : grid) thread_counts.insert(id.threads);
  const GemmReference gemm = gemm_reference(opts.gemm_gflops, thread_counts);
  // With --rounds, every point runs once per pass over the list: a point and those it is
  // compared with are measured close together in every pass, so a shared machine's slow drift
  // falls on all of them alike instead of on whichever ran during a slow minute.
  std::vector<PointResult> results(points.size());
  ProgressLine progress;
  std::vector<std::string> names;
  for (const auto& pp : points) names.push_back(pp.id.name());
  const ShortNames short_names = short_point_names(names);
  if (progress.tty && !short_names.shared.empty()) progress.show("run: every point " + short_names.shared, true);
  for (int round = 0; round < opts.rounds; ++round) {
    for (size_t i = 0; i < points.size(); ++i) {
      if (round > 0 && results[i].status != Status::OK) continue;  // skipped or failed: not again
      // run_point frees a point's mechanism and model; a later pass prepares it afresh.
      if (round > 0) points[i] = prepare_point(points[i].id, opts);
      PreparedPoint& pp = points[i];
      const std::string label = point_label(pp.id, opts);
      const std::string pass = opts.rounds > 1 ? fmt::format("[round {}/{}] ", round + 1, opts.rounds) : "";
      const std::string where =
          fmt::format("{}[{}/{}] {}", pass, i + 1, points.size(), progress.tty ? short_names.names[i] : pp.id.name());
      progress.show(where + " ...", false);
      inject_fault(pp.id);
      PointResult r = run_point(pp, opts, label, gemm.per_thread(pp.id.threads));
      if (round == 0 && r.status == Status::OK && opts.count_instructions) {
        RunOptions child = opts;  // one warm-up and one counted call, nothing else
        child.count_instructions = child.error = false;
        child.reps = child.warmup = child.rounds = 1;
        child.min_time = 0;
        count_point_instructions(point_args(pp.id, child), r);
      }
      if (r.status == Status::OK)
        progress.show(fmt::format("{} {:.4g} ms{}", where, real_stats(r).median * 1e3,
                                  r.instructions ? fmt::format(", {:.0f} instructions", *r.instructions) : ""),
                      true);
      else
        progress.show(fmt::format("{} {}: {}", where, to_string(r.status), r.message), true);
      if (round == 0) results[i] = std::move(r);
      else merge_round(results[i], std::move(r), round);
    }
  }
  const int threads = grid.empty() ? 1 : grid.front().threads;
  nlohmann::json context = run_context(command, opts.seed, threads, gemm.one_thread);
  gemm.record(context);
  // A sweep's children are given its GEMM rate; the sweep judges their results together.
  if (opts.gemm_gflops <= 0) attach_warnings(context, results);
  const nlohmann::json doc = results_document(context, results);
  // --out -: the result file is stdout (and takes the place of the table there).
  if (out_path == "-") {
    std::cout << doc.dump(2) << "\n";
    return 0;
  }
  if (!out_path.empty()) {
    try {
      write_file_atomic(out_path, doc.dump(2) + "\n");
    } catch (const std::exception& e) {
      // Nothing measured is lost: the result file goes to stdout instead.
      std::cout << doc.dump(2) << "\n";
      std::cerr << "attnbench: error: " << e.what() << "; the result file was written to stdout instead\n";
      return 1;
    }
  }
  if (format == "json") std::cout << doc.dump(2) << "\n";
  else if (format == "csv") std::cout << to_csv(results);
  else if (preset == "lra-efficiency") std::cout << lra_efficiency_report(results, "flash");
  else std::cout << to_markdown(results, width);
  return 0;
}

}  // namespace ab
