#include "bench/cli.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "attention_impls/registry.hpp"
#include "bench/dump.hpp"
#include "bench/results.hpp"
#include "bench/runner.hpp"
#include "core/matmul.hpp"
#include "core/sysinfo.hpp"

namespace ab {

namespace {
int64_t parse_positive(const std::string& s, const std::string& whole) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno || v <= 0)
    throw InvalidInput(fmt::format("'{}' in '{}' is not a positive integer", s, whole));
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string join_args(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.find_first_of(" \t'\"") != std::string::npos) a = "'" + a + "'";
    s += (i ? " " : "") + a;
  }
  return s;
}
}  // namespace

std::vector<int64_t> parse_int_list(const std::string& text) {
  std::vector<int64_t> out;
  if (text.empty()) throw InvalidInput("empty list");
  for (const auto& item : split(text, ',')) {
    auto parts = split(item, ':');
    if (parts.size() == 1) {
      out.push_back(parse_positive(item, text));
    } else if (parts.size() == 3 && parts[2].size() > 1 && (parts[2][0] == 'x' || parts[2][0] == '+')) {
      const int64_t lo = parse_positive(parts[0], text), hi = parse_positive(parts[1], text);
      const int64_t step = parse_positive(parts[2].substr(1), text);
      if (hi < lo) throw InvalidInput(fmt::format("range '{}' ends below its start", item));
      if (parts[2][0] == 'x' && step < 2) throw InvalidInput(fmt::format("range '{}' needs a factor >= 2", item));
      for (int64_t v = lo; v <= hi; v = parts[2][0] == 'x' ? v * step : v + step) out.push_back(v);
    } else {
      throw InvalidInput(fmt::format("'{}' is not a number or a range like 256:16384:x2 or 1024:4096:+1024", item));
    }
  }
  return out;
}

size_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  std::string unit = end ? end : "";
  double mult = 1;
  if (unit == "K" || unit == "KiB") mult = 1024.0;
  else if (unit == "M" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) mult = -1;
  if (text.empty() || errno || mult < 0 || !(v > 0))
    throw InvalidInput(fmt::format("'{}' is not a memory size (examples: 16G, 512M, 1048576)", text));
  return static_cast<size_t>(v * mult);
}

namespace {

struct ShapeOptions {
  std::vector<std::string> attn{"flash"};
  int64_t batch = 1, heads = 8, dhead = 64;
  std::string seq = "1024";
  bool causal = false;
  int threads = 1;
  uint64_t seed = 0;
  std::vector<std::string> params;

  void add_to(CLI::App* app, bool multi) {
    app->add_option("--attn", attn,
                    multi ? "mechanisms, comma-separated, or 'all'" : "the mechanism")
        ->delimiter(',')
        ->capture_default_str();
    app->add_option("--batch", batch, "batch size B")->capture_default_str();
    app->add_option("--heads", heads, "heads H")->capture_default_str();
    app->add_option("--seq", seq,
                    multi ? "sequence lengths N: 256,512 or 256:16384:x2 or 1024:4096:+1024"
                          : "sequence length N")
        ->capture_default_str();
    app->add_option("--dhead", dhead, "head dimension D")->capture_default_str();
    app->add_flag("--causal", causal, "causal masking (query i uses keys j <= i)");
    app->add_option("--threads", threads, "OpenMP threads")->capture_default_str();
    app->add_option("--seed", seed, "seed of every random draw")->capture_default_str();
    app->add_option("--param", params,
                    "mechanism parameter name=value (repeatable; mech.name=value targets one mechanism)");
  }

  std::vector<std::string> mechanism_list() const {
    std::vector<std::string> out;
    for (const auto& a : attn) {
      if (a == "all") {
        for (const auto& n : mechanism_names()) out.push_back(n);
      } else {
        find_mechanism(a);  // throws with the list of known names
        out.push_back(a);
      }
    }
    if (out.empty()) throw InvalidInput("--attn names no mechanism");
    return out;
  }

  // The --param assignments that apply to one mechanism (prefix stripped).
  std::vector<std::string> params_for(const std::string& mech, const std::vector<std::string>& all_mechs) const {
    std::vector<std::string> out;
    for (const auto& p : params) {
      const auto eq = p.find('='), dot = p.find('.');
      if (dot != std::string::npos && dot < eq) {
        const std::string target = p.substr(0, dot);
        find_mechanism(target);
        if (target == mech) out.push_back(p.substr(dot + 1));
        continue;
      }
      if (all_mechs.size() == 1) {
        out.push_back(p);
        continue;
      }
      // Unprefixed in a multi-mechanism run: applies to the mechanisms that declare it, and
      // must be declared by at least one.
      const std::string name = p.substr(0, eq);
      bool anyone = false;
      for (const auto& m : all_mechs)
        for (const auto& spec : find_mechanism(m).params) anyone |= spec.name == name;
      if (!anyone)
        throw InvalidInput(fmt::format("no selected mechanism has a parameter '{}' (see attnbench list params NAME)", name));
      for (const auto& spec : find_mechanism(mech).params)
        if (spec.name == name) out.push_back(p);
    }
    return out;
  }
};

Mode parse_mode(const std::string& m) {
  if (m == "fwd") return Mode::fwd;
  if (m == "fwdbwd") return Mode::fwdbwd;
  if (m == "decode") return Mode::decode;
  throw InvalidInput(fmt::format("unknown mode '{}'; modes: fwd, fwdbwd, decode", m));
}

std::string point_label(const PointId& id, const RunOptions& o) {
  std::string s = "attnbench run --attn " + id.mechanism;
  for (const auto& [k, v] : id.params.items()) s += fmt::format(" --param {}={}", k, format_param_value(v));
  s += fmt::format(" --level {} --mode {} --batch {} --heads {} --seq {} --dhead {}{} --threads {} --seed {} --reps {} --min-time {:g} --warmup {}{}",
                   id.level, to_string(id.mode), id.shape.B, id.shape.H, id.shape.N, id.shape.D,
                   id.causal ? " --causal" : "", id.threads, o.seed, o.reps, o.min_time, o.warmup,
                   o.error ? " --error" : "");
  return s;
}

int cmd_list(const std::string& what, const std::string& name) {
  if (what == "mechanisms") {
    std::string out = "| mechanism | family | exact | causal | backward | decode | complexity | summary |\n"
                      "|---|---|---|---|---|---|---|---|\n";
    for (const auto& m : mechanisms())
      out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |\n", m.name, m.family,
                         m.caps.exact ? "exact" : "approximate", m.caps.causal ? "yes" : "no",
                         m.caps.backward ? "yes" : "no", m.caps.decode ? "yes" : "no", m.complexity, m.summary);
    std::cout << out;
    return 0;
  }
  if (what == "params") {
    if (name.empty()) throw InvalidInput(fmt::format("list params needs a mechanism name; known: {}", fmt::join(mechanism_names(), ", ")));
    const auto& m = find_mechanism(name);
    if (m.params.empty()) {
      std::cout << m.name << " has no parameters\n";
      return 0;
    }
    std::string out = "| parameter | default | allowed | meaning |\n|---|---|---|---|\n";
    for (const auto& p : m.params)
      out += fmt::format("| {} | {} | {} | {} |\n", p.name, format_param_value(p.def), p.describe_range(), p.help);
    std::cout << out;
    return 0;
  }
  if (what == "tasks") {
    throw InvalidInput("no tasks are built yet (the tasks issue adds them); attention-level runs use --batch --heads --seq --dhead");
  }
  throw InvalidInput(fmt::format("unknown list '{}'; lists: mechanisms, params NAME, tasks", what));
}

int cmd_run(const ShapeOptions& so, const std::vector<std::string>& modes, const std::string& level,
            const RunOptions& opts_in, const std::string& out_path, const std::string& format,
            const std::string& command) {
  RunOptions opts = opts_in;
  if (level != "attention") throw InvalidInput(fmt::format("unknown level '{}'; levels: attention", level));
  if (opts.reps < 1) throw InvalidInput("--reps must be at least 1");
  if (opts.min_time < 0) throw InvalidInput("--min-time must not be negative");
  if (opts.warmup < 0) throw InvalidInput("--warmup must not be negative");
  if (format != "md" && format != "csv" && format != "json")
    throw InvalidInput(fmt::format("unknown format '{}'; formats: md, csv, json", format));
  const auto mechs = so.mechanism_list();
  const auto seqs = parse_int_list(so.seq);
  std::vector<Mode> mode_list;
  for (const auto& m : modes) mode_list.push_back(parse_mode(m));

  // Validate every point before running any: bad input exits 2 with nothing written.
  std::vector<PreparedPoint> points;
  for (const auto& mech : mechs) {
    const ParamValues params = resolve_params(find_mechanism(mech), so.params_for(mech, mechs));
    for (Mode mode : mode_list)
      for (int64_t n : seqs) {
        PointId id;
        id.mechanism = mech;
        id.params = params;
        id.level = level;
        id.mode = mode;
        id.shape = Shape4{so.batch, so.heads, n, so.dhead};
        id.causal = so.causal || mode == Mode::decode;  // decoding is causal by definition
        id.threads = so.threads;
        PreparedPoint pp = prepare_point(id, opts);
        pp.impl.reset();  // constructed again just before it runs, to hold one plan at a time
        points.push_back(std::move(pp));
      }
  }

  const double gemm = measure_gemm_gflops_1thread();
  std::vector<PointResult> results;
  for (size_t i = 0; i < points.size(); ++i) {
    PreparedPoint pp = prepare_point(points[i].id, opts);
    const std::string label = point_label(pp.id, opts);
    std::cerr << fmt::format("[{}/{}] {} ...", i + 1, points.size(), pp.id.name()) << std::flush;
    PointResult r = run_point(pp, opts, label, gemm);
    if (r.status == Status::OK)
      std::cerr << fmt::format(" {:.4g} ms\n", real_stats(r).median * 1e3);
    else
      std::cerr << fmt::format(" {}: {}\n", to_string(r.status), r.message);
    results.push_back(std::move(r));
  }
  const nlohmann::json doc = results_document(run_context(command, opts.seed, so.threads, gemm), results);
  if (!out_path.empty()) write_file_atomic(out_path, doc.dump(2) + "\n");
  if (format == "json") std::cout << doc.dump(2) << "\n";
  else if (format == "csv") std::cout << to_csv(results);
  else std::cout << to_markdown(results);
  return 0;
}

}  // namespace

int cli_main(int argc, char** argv) {
  // Large buffers always come from (and go back to) mmap, so the resident set measured for one
  // point is not inflated by heap memory glibc kept from an earlier, larger point.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1 << 20);
  CLI::App app{"attnbench: efficient-attention mechanisms, benchmarked honestly on the CPU"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every verb");

  std::string list_what = "mechanisms", list_name;
  auto* list = app.add_subcommand("list", "list mechanisms, one mechanism's parameters, or tasks");
  list->add_option("what", list_what, "mechanisms | params | tasks")->capture_default_str();
  list->add_option("name", list_name, "mechanism name (for params)");

  ShapeOptions run_shape;
  std::vector<std::string> modes{"fwd"};
  std::string level = "attention", out_path, format = "md", mem_limit;
  RunOptions ropts;
  auto* run = app.add_subcommand("run", "benchmark mechanisms over sequence lengths and modes");
  run_shape.add_to(run, true);
  run->add_option("--mode", modes, "fwd | fwdbwd | decode (comma-separated for several); decode: one new token after a context of N")->delimiter(',')->capture_default_str();
  run->add_option("--level", level, "attention")->capture_default_str();
  run->add_option("--reps", ropts.reps, "repetitions, every one kept")->capture_default_str();
  run->add_option("--min-time", ropts.min_time, "seconds per repetition (iterations added to reach it)")->capture_default_str();
  run->add_option("--warmup", ropts.warmup, "untimed calls before timing")->capture_default_str();
  run->add_flag("--error", ropts.error, "report nmse of the output against flash");
  run->add_option("--mem-limit", mem_limit, "refuse points predicted above this (default 80% of RAM)");
  run->add_option("--out", out_path, "write the Google-Benchmark JSON result file here");
  run->add_option("--format", format, "stdout format: md | csv | json")->capture_default_str();

  ShapeOptions dump_shape;
  dump_shape.seq = "128";
  dump_shape.heads = 2;
  dump_shape.dhead = 16;
  std::string dump_dir;
  auto* dump = app.add_subcommand("dump", "write inputs, parameters and outputs of one call as .npy + config.json");
  dump_shape.add_to(dump, false);
  dump->add_option("--out", dump_dir, "output directory")->required();

  if (argc > 1 && argv[1][0] != '-') {
    const std::string verb = argv[1];
    if (verb != "list" && verb != "run" && verb != "dump") {
      std::cerr << "attnbench: error: unknown verb '" << verb << "'; verbs: list, run, dump\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "attnbench: error: " << e.what() << " (see --help)\n";
    return 2;
  }

  try {
    if (list->parsed()) return cmd_list(list_what, list_name);
    if (run->parsed()) {
      ropts.seed = run_shape.seed;
      ropts.mem_limit = mem_limit.empty() ? physical_memory_bytes() / 5 * 4 : parse_bytes(mem_limit);
      return cmd_run(run_shape, modes, level, ropts, out_path, format, join_args(argc, argv));
    }
    if (dump->parsed()) {
      const auto mechs = dump_shape.mechanism_list();
      if (mechs.size() != 1) throw InvalidInput("dump takes exactly one mechanism");
      const auto seqs = parse_int_list(dump_shape.seq);
      if (seqs.size() != 1) throw InvalidInput("dump takes exactly one sequence length");
      PointId id;
      id.mechanism = mechs[0];
      id.params = resolve_params(find_mechanism(mechs[0]), dump_shape.params_for(mechs[0], mechs));
      id.shape = Shape4{dump_shape.batch, dump_shape.heads, seqs[0], dump_shape.dhead};
      id.causal = dump_shape.causal;
      id.threads = dump_shape.threads;
      dump_point(id, dump_shape.seed, dump_dir);
      std::cout << dump_dir << "\n";
      return 0;
    }
  } catch (const InvalidInput& e) {
    std::cerr << "attnbench: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "attnbench: failed: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace ab
