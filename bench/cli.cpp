#include "bench/cli.hpp"
#include "bench/task_cli.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <set>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "attention_impls/registry.hpp"
#include "bench/dump.hpp"
#include "bench/results.hpp"
#include "bench/analysis.hpp"
#include "bench/instructions.hpp"
#include "bench/runner.hpp"
#include "bench/sweep.hpp"
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

Mode parse_mode(const std::string& m) {
  if (m == "fwd") return Mode::fwd;
  if (m == "fwdbwd") return Mode::fwdbwd;
  if (m == "decode") return Mode::decode;
  if (m == "train") return Mode::train;
  throw InvalidInput(fmt::format("unknown mode '{}'; modes: fwd, fwdbwd, decode, train (model level)", m));
}

// The shape and mechanism options shared by run, sweep and dump. Every size option takes a list
// (run and sweep make a grid of them; dump needs one value each).
struct ShapeOptions {
  std::vector<std::string> attn{"flash"};
  std::string batch = "1", heads = "8", seq = "1024", dhead = "64", threads = "1";
  bool causal = false;
  uint64_t seed = 0;
  std::vector<std::string> params;
  // A task gives the defaults of every size (its model shape, tasks.md); the model level also
  // needs layers, d_model and the feed-forward width. Empty: the task's value.
  std::string task, layers, dmodel, mlp, data_dir;
  CLI::Option *batch_opt = nullptr, *heads_opt = nullptr, *seq_opt = nullptr, *dhead_opt = nullptr;
  std::set<const CLI::Option*> set_by_preset;  // count as given: a preset chose the value

  void add_to(CLI::App* app, bool multi) {
    const std::string list = multi ? " (list: 1,2 or a range like 256:16384:x2)" : "";
    app->add_option("--attn", attn,
                    multi ? "mechanisms, comma-separated, or 'all'" : "the mechanism")
        ->delimiter(',')
        ->capture_default_str();
    batch_opt = app->add_option("--batch", batch, "batch size B" + list + " (with --task: the task's)")->capture_default_str();
    heads_opt = app->add_option("--heads", heads, "heads H" + list + " (with --task: the task's)")->capture_default_str();
    seq_opt = app->add_option("--seq", seq,
                    multi ? "sequence lengths N: 256,512 or 256:16384:x2 or 1024:4096:+1024 (with --task: the task's)"
                          : "sequence length N")
        ->capture_default_str();
    dhead_opt = app->add_option("--dhead", dhead, "head dimension D" + list + " (with --task: dmodel / heads)")->capture_default_str();
    if (multi) {
      app->add_option("--task", task, "take the shape from this task's model (attnbench list tasks); needed by --level model");
      app->add_option("--layers", layers, "model level: Transformer blocks" + list + " (default: the task's)");
      app->add_option("--dmodel", dmodel, "model level: model width" + list + " (default: the task's)");
      app->add_option("--mlp", mlp, "model level: feed-forward width" + list + " (default: the task's)");
      app->add_option("--data-dir", data_dir, "model level: read the task's real data from here");
    }
    app->add_flag("--causal", causal, "causal masking (query i uses keys j <= i)");
    app->add_option("--threads", threads, "OpenMP threads" + list)->capture_default_str();
    app->add_option("--seed", seed, "seed of every random draw")->capture_default_str();
    app->add_option("--param", params,
                    multi ? "mechanism parameter name=value (repeatable; mech.name=value targets one "
                            "mechanism; name=v1,v2 makes a grid of the values)"
                          : "mechanism parameter name=value (repeatable)");
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

  // Every combination of one mechanism's list-valued parameters ("window=64,128").
  std::vector<ParamValues> param_grid(const std::string& mech, const std::vector<std::string>& all_mechs) const {
    std::vector<std::vector<std::string>> combos{{}};
    for (const auto& a : params_for(mech, all_mechs)) {
      const auto eq = a.find('=');
      const auto values = eq == std::string::npos ? std::vector<std::string>{""} : split(a.substr(eq + 1), ',');
      std::vector<std::vector<std::string>> next;
      for (const auto& c : combos)
        for (const auto& v : values) {
          auto c2 = c;
          c2.push_back(eq == std::string::npos ? a : a.substr(0, eq + 1) + v);
          next.push_back(std::move(c2));
        }
      combos = std::move(next);
    }
    std::vector<ParamValues> out;
    for (const auto& c : combos) out.push_back(resolve_params(find_mechanism(mech), c));
    return out;
  }

  // mechanisms x parameter values x levels x modes x threads x B x H x D x N, in that nesting.
  std::vector<PointId> grid(const std::vector<std::string>& modes, const std::vector<std::string>& levels) const {
    const auto mechs = mechanism_list();
    auto sizes = [](const char* option, const std::string& text) {
      try {
        return parse_int_list(text);
      } catch (const InvalidInput& e) {
        throw InvalidInput(fmt::format("{}: {}", option, e.what()));
      }
    };
    const TaskInfo* ti = task.empty() ? nullptr : &find_task(task);
    auto given = [&](const CLI::Option* o) { return o && (o->count() > 0 || set_by_preset.count(o)); };
    // A size list: what the user gave, else the task's value, else the option's default.
    auto size_list = [&](const char* option, const CLI::Option* opt, const std::string& text, int64_t task_value) {
      if (ti && !given(opt)) return std::vector<int64_t>{task_value};
      return sizes(option, text);
    };
    auto model_list = [&](const char* option, const std::string& text, int64_t task_value) {
      return text.empty() ? std::vector<int64_t>{task_value} : sizes(option, text);
    };
    const ModelShape ms = ti ? ti->model : ModelShape{};
    const auto seqs = size_list("--seq", seq_opt, seq, ti ? ti->default_seq : 0),
               bs = size_list("--batch", batch_opt, batch, ms.batch), hs = size_list("--heads", heads_opt, heads, ms.heads);
    std::vector<int> ts;
    for (int64_t t : sizes("--threads", threads)) {
      if (t > 1024) throw InvalidInput(fmt::format("--threads {} is more than 1024", t));
      ts.push_back(static_cast<int>(t));
    }
    std::vector<Mode> mode_list;
    for (const auto& m : modes) mode_list.push_back(parse_mode(m));
    bool model_level = false;
    for (const auto& l : levels) {
      if (l != "attention" && l != "model") throw InvalidInput(fmt::format("unknown level '{}'; levels: attention, model", l));
      model_level |= l == "model";
    }
    if (model_level && !ti) throw InvalidInput("--level model needs --task (attnbench list tasks)");
    if (model_level && given(dhead_opt)) throw InvalidInput("--level model takes --dmodel and --heads; the head size is dmodel / heads");
    const auto Ls = model_list("--layers", layers, ms.layers), dms = model_list("--dmodel", dmodel, ms.dmodel),
               mlps = model_list("--mlp", mlp, ms.mlp);
    // The attention level with a task: D = dmodel / heads unless --dhead is given.
    std::vector<int64_t> ds;
    if (ti && !given(dhead_opt)) {
      for (int64_t dm : dms)
        for (int64_t h : hs) ds.push_back(dm / h > 0 ? dm / h : 1);
      std::sort(ds.begin(), ds.end());
      ds.erase(std::unique(ds.begin(), ds.end()), ds.end());
    } else {
      ds = sizes("--dhead", dhead);
    }
    const bool task_causal = ti && ti->classes == 0;  // next-token tasks (copy) are causal
    std::vector<PointId> out;
    for (const auto& mech : mechs)
      for (const auto& params : param_grid(mech, mechs))
        for (const auto& level : levels)
          for (Mode mode : mode_list)
            for (int t : ts)
              for (int64_t b : bs)
                for (int64_t h : hs) {
                  // The model level runs over (layers, dmodel, mlp); the attention level over D.
                  std::vector<std::pair<ModelDims, int64_t>> shapes;
                  if (level == "model") {
                    for (int64_t L : Ls)
                      for (int64_t dm : dms) {
                        if (dm % h) throw InvalidInput(fmt::format("--dmodel {} is not a multiple of --heads {}", dm, h));
                        for (int64_t f : mlps) shapes.push_back({ModelDims{L, dm, f}, dm / h});
                      }
                  } else {
                    for (int64_t d : ds) shapes.push_back({ModelDims{}, d});
                  }
                  for (const auto& [dims, d] : shapes)
                    for (int64_t n : seqs) {
                      PointId id;
                      id.mechanism = mech;
                      id.params = params;
                      id.level = level;
                      id.mode = mode;
                      id.task = ti ? ti->name : "none";
                      id.shape = Shape4{b, h, n, d};
                      id.model = dims;
                      // Decoding is causal by definition; so is a next-token task's model.
                      id.causal = causal || mode == Mode::decode || task_causal;
                      id.threads = t;
                      out.push_back(std::move(id));
                    }
                }
    return out;
  }
};

void check_run_options(const RunOptions& opts) {
  if (opts.reps < 1) throw InvalidInput("--reps must be at least 1");
  if (opts.rounds < 1) throw InvalidInput("--rounds must be at least 1");
  if (opts.min_time < 0) throw InvalidInput("--min-time must not be negative");
  if (opts.warmup < 0) throw InvalidInput("--warmup must not be negative");
}

void check_format(const std::string& format, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (format == a) return;
  throw InvalidInput(fmt::format("unknown format '{}'; formats: {}", format, fmt::join(allowed, ", ")));
}

// A test hook (documented in the README): ATTNBENCH_FAULT=KIND:TEXT makes `run` misbehave on
// the points whose name contains TEXT, so the sweep's isolation can be tested. KIND: crash
// (SIGSEGV), kill (SIGKILL, as the out-of-memory killer does), hang, exit (exit code 3).
void inject_fault(const PointId& id) {
  const char* env = std::getenv("ATTNBENCH_FAULT");
  if (!env) return;
  const std::string spec = env;
  const auto colon = spec.find(':');
  if (colon == std::string::npos || id.name().find(spec.substr(colon + 1)) == std::string::npos) return;
  const std::string kind = spec.substr(0, colon);
  std::cerr << "ATTNBENCH_FAULT: " << kind << " on " << id.name() << "\n" << std::flush;
  if (kind == "crash") std::raise(SIGSEGV);
  if (kind == "kill") std::raise(SIGKILL);
  if (kind == "exit") std::_Exit(3);
  if (kind == "hang")
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
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
    TaskOptions o;
    o.data_dir = name;
    return cmd_list_tasks(o);
  }
  throw InvalidInput(fmt::format("unknown list '{}'; lists: mechanisms, params NAME, tasks", what));
}

int cmd_run(const std::vector<PointId>& grid, const RunOptions& opts, const std::string& out_path,
            const std::string& format, const std::string& command, const std::string& preset = "") {
  check_run_options(opts);
  check_format(format, {"md", "csv", "json"});
  if (opts.count_instructions) check_instruction_counting();

  // Validate every point before running any: bad input exits 2 with nothing written.
  std::vector<PreparedPoint> points;
  for (const auto& id : grid) {
    PreparedPoint pp = prepare_point(id, opts);
    pp.impl.reset();  // constructed again just before it runs, to hold one plan at a time
    pp.model.reset();
    pp.task.reset();
    points.push_back(std::move(pp));
  }

  const double gemm = opts.gemm_gflops > 0 ? opts.gemm_gflops : measure_gemm_gflops_1thread();
  // With --rounds, every point runs once per pass over the list: a point and those it is
  // compared with are measured close together in every pass, so a shared machine's slow drift
  // falls on all of them alike instead of on whichever ran during a slow minute.
  std::vector<PointResult> results(points.size());
  for (int round = 0; round < opts.rounds; ++round) {
    for (size_t i = 0; i < points.size(); ++i) {
      if (round > 0 && results[i].status != Status::OK) continue;  // skipped or failed: not again
      PreparedPoint pp = prepare_point(points[i].id, opts);
      const std::string label = point_label(pp.id, opts);
      const std::string pass = opts.rounds > 1 ? fmt::format("[round {}/{}] ", round + 1, opts.rounds) : "";
      std::cerr << fmt::format("{}[{}/{}] {} ...", pass, i + 1, points.size(), pp.id.name()) << std::flush;
      inject_fault(pp.id);
      PointResult r = run_point(pp, opts, label, gemm);
      if (round == 0 && r.status == Status::OK && opts.count_instructions) {
        RunOptions child = opts;  // one warm-up and one counted call, nothing else
        child.count_instructions = child.error = false;
        child.reps = child.warmup = child.rounds = 1;
        child.min_time = 0;
        count_point_instructions(point_args(pp.id, child), r);
      }
      if (r.status == Status::OK)
        std::cerr << fmt::format(" {:.4g} ms{}\n", real_stats(r).median * 1e3,
                                 r.instructions ? fmt::format(", {:.0f} instructions", *r.instructions) : "");
      else
        std::cerr << fmt::format(" {}: {}\n", to_string(r.status), r.message);
      if (round == 0) results[i] = std::move(r);
      else merge_round(results[i], std::move(r), round);
    }
  }
  const int threads = grid.empty() ? 1 : grid.front().threads;
  const nlohmann::json doc = results_document(run_context(command, opts.seed, threads, gemm), results);
  if (!out_path.empty()) write_file_atomic(out_path, doc.dump(2) + "\n");
  if (format == "json") std::cout << doc.dump(2) << "\n";
  else if (format == "csv") std::cout << to_csv(results);
  else if (preset == "lra-efficiency") std::cout << lra_efficiency_report(results, "flash");
  else std::cout << to_markdown(results);
  return 0;
}

// `run --preset lra-efficiency`: the LRA efficiency protocol (published.md, Table 2) at a batch
// this machine holds. Options the user gave explicitly win over the preset's.
void apply_preset(const std::string& preset, CLI::App* run, ShapeOptions& so, std::vector<std::string>& modes,
                  std::vector<std::string>& levels, RunOptions& opts) {
  if (preset.empty()) return;
  if (preset != "lra-efficiency") throw InvalidInput(fmt::format("unknown preset '{}'; presets: lra-efficiency", preset));
  auto given = [&](const char* name) { return run->get_option(name)->count() > 0; };
  if (given("--task") && so.task != "text") throw InvalidInput("--preset lra-efficiency is the text task");
  if (given("--level") || given("--mode")) throw InvalidInput("--preset lra-efficiency sets --level model --mode train");
  so.task = "text";
  if (!given("--attn")) so.attn = {"all"};
  if (!given("--seq")) so.seq = "1024:4096:+1024";
  if (!given("--batch")) so.batch = "4";  // LRA's 32 needs ~8x the memory and time; see README
  so.set_by_preset = {so.seq_opt, so.batch_opt};
  // A point this machine cannot hold is a row marked OOM, as LRA marks FAIL, not an abort.
  opts.oom_as_status = true;
  levels = {"model"};
  modes = {"train"};
}

void add_run_options(CLI::App* app, RunOptions& o, std::string& mem_limit, std::string& count) {
  app->add_option("--reps", o.reps, "repetitions, every one kept")->capture_default_str();
  app->add_option("--min-time", o.min_time, "seconds per repetition (iterations added to reach it)")->capture_default_str();
  app->add_option("--warmup", o.warmup, "untimed calls before timing")->capture_default_str();
  app->add_flag("--error", o.error, "report nmse of the output against flash");
  app->add_option("--mem-limit", mem_limit, "refuse points predicted above this, e.g. 16G (default 80% of RAM)");
  app->add_option("--count", count,
                  "'instructions': also count each point's instructions per call under valgrind's callgrind "
                  "(needs a build without AVX-512, see README)");
  // Internal: the sweep passes its measured GEMM rate to each child; callgrind children run one call.
  app->add_option("--gemm-gflops", o.gemm_gflops)->group("");
  app->add_flag("--callgrind-child", o.callgrind_child)->group("");
}

void finish_run_options(RunOptions& o, const ShapeOptions& so, const std::string& mem_limit, const std::string& count) {
  o.seed = so.seed;
  o.data_dir = so.data_dir;
  o.mem_limit = mem_limit.empty() ? physical_memory_bytes() / 5 * 4 : parse_bytes(mem_limit);
  if (!count.empty() && count != "instructions")
    throw InvalidInput(fmt::format("unknown --count '{}'; counts: instructions", count));
  o.count_instructions = count == "instructions";
}

}  // namespace

std::vector<std::string> point_args(const PointId& id, const RunOptions& o) {
  std::vector<std::string> a = {"run", "--attn", id.mechanism};
  for (const auto& [k, v] : id.params.items()) {
    a.push_back("--param");
    a.push_back(k + "=" + format_param_value(v));
  }
  auto add = [&](const char* flag, const std::string& value) {
    a.push_back(flag);
    a.push_back(value);
  };
  add("--level", id.level);
  add("--mode", to_string(id.mode));
  if (id.task != "none") add("--task", id.task);
  add("--batch", std::to_string(id.shape.B));
  add("--heads", std::to_string(id.shape.H));
  add("--seq", std::to_string(id.shape.N));
  if (id.level == "model") {
    add("--layers", std::to_string(id.model.layers));
    add("--dmodel", std::to_string(id.model.dmodel));
    add("--mlp", std::to_string(id.model.mlp));
    if (!o.data_dir.empty()) add("--data-dir", o.data_dir);
  } else {
    add("--dhead", std::to_string(id.shape.D));
  }
  // A next-token task's model is causal by itself; --causal is only given where it is a choice.
  const bool implied = id.task != "none" && find_task(id.task).classes == 0;
  if (id.causal && !implied) a.push_back("--causal");
  add("--threads", std::to_string(id.threads));
  add("--seed", std::to_string(o.seed));
  add("--reps", std::to_string(o.reps));
  if (o.rounds > 1) add("--rounds", std::to_string(o.rounds));
  add("--min-time", fmt::format("{:g}", o.min_time));
  add("--warmup", std::to_string(o.warmup));
  if (o.error) a.push_back("--error");
  if (o.count_instructions) add("--count", "instructions");
  return a;
}

std::string point_label(const PointId& id, const RunOptions& o) {
  std::string s = "attnbench";
  for (const auto& a : point_args(id, o)) s += " " + a;
  return s;
}

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
  std::string list_data_dir;
  list->add_option("--data-dir", list_data_dir, "tasks: show what this directory provides");

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
  };
  auto* task_sample = task->add_subcommand("sample", "print examples a person can read, or JSON lines");
  add_task_options(task_sample);
  task_sample->add_option("--count", task_opts.count, "examples")->capture_default_str();
  task_sample->add_option("--first", task_opts.first, "index of the first example")->capture_default_str();
  task_sample->add_option("--format", task_opts.format, "text | json (one object per example)")->capture_default_str();
  task_sample->add_option("--png", task_opts.png_dir, "image tasks: also write each example as a PNG here");
  auto* task_rate = task->add_subcommand("rate", "time batch generation (samples/s)");
  add_task_options(task_rate);
  task_rate->add_option("--batch", task_opts.batch, "examples per batch (0: the task's LRA batch)")->capture_default_str();
  task_rate->add_option("--reps", task_opts.reps, "timed batches")->capture_default_str();
  task_rate->add_option("--threads", task_opts.threads, "OpenMP threads")->capture_default_str();

  // run
  ShapeOptions run_shape;
  std::vector<std::string> run_modes{"fwd"}, run_levels{"attention"};
  std::string run_out, run_format = "md", run_mem, run_count;
  RunOptions ropts;
  auto* run = app.add_subcommand("run", "benchmark mechanisms over sequence lengths and modes, in this process");
  run_shape.add_to(run, true);
  run->add_option("--mode", run_modes, "fwd | fwdbwd | decode | train (comma-separated for several); decode: one new token after a context of N; train (model level): forward, backward and the AdamW step")->delimiter(',')->capture_default_str();
  run->add_option("--level", run_levels, "attention | model (a whole Transformer on --task's tokens)")->delimiter(',')->capture_default_str();
  add_run_options(run, ropts, run_mem, run_count);
  run->add_option("--rounds", ropts.rounds,
                  "passes over the list of points, one after another (--reps each), every repetition kept: "
                  "compared points are measured close together in every pass")
      ->capture_default_str();
  run->add_option("--out", run_out, "write the Google-Benchmark JSON result file here");
  std::string run_preset;
  run->add_option("--preset", run_preset,
                  "lra-efficiency: LRA's efficiency table (text task, N = 1K..4K, train, every mechanism, batch 4 "
                  "unless --batch), printed in the LRA layout");
  run->add_option("--format", run_format, "stdout format: md | csv | json")->capture_default_str();

  // sweep
  ShapeOptions sweep_shape;
  sweep_shape.seq = "256:16384:x2";
  std::vector<std::string> sweep_modes{"fwd"}, sweep_levels{"attention"};
  std::string sweep_mem, sweep_count, shard = "1/1";
  RunOptions sopts;
  SweepOptions sweep_opts;
  auto* sweep = app.add_subcommand("sweep", "run a grid, each point in its own process, appended to --out as it finishes");
  sweep_shape.add_to(sweep, true);
  sweep->add_option("--mode", sweep_modes, "fwd | fwdbwd | decode | train, comma-separated")->delimiter(',')->capture_default_str();
  sweep->add_option("--level", sweep_levels, "attention | model")->delimiter(',')->capture_default_str();
  add_run_options(sweep, sopts, sweep_mem, sweep_count);
  sweep->add_option("--out", sweep_opts.out, "the result file, rewritten whole after every point")->required();
  sweep->add_flag("--resume", sweep_opts.resume, "keep the points already in --out and run only the missing ones");
  sweep->add_option("--time-limit", sweep_opts.time_limit_s, "seconds one point may take before it is stopped as TIMEOUT (0: none)")->capture_default_str();
  sweep->add_option("--shard", shard, "i/n: run only the i-th of n disjoint parts of the grid (merge the files afterwards)")->capture_default_str();

  // table
  std::vector<std::string> table_files;
  TableOptions topts;
  auto* table = app.add_subcommand("table", "comparison tables from result files: rows mechanisms, columns N");
  table->add_option("files", table_files, "result files")->required();
  table->add_option("--metric", topts.metric, "time | cpu_time | " + table_metric_names())->capture_default_str();
  auto* table_baseline = table->add_option("--baseline", topts.baseline, "mechanism the ratios are taken against ('none' for no ratios)")->capture_default_str();
  table->add_option("--format", topts.format, "md | csv | latex")->capture_default_str();
  table->add_flag("--growth", topts.growth,
                  "in brackets: each value over the same row's value at the previous N (how a time grows with N), "
                  "instead of the ratio to --baseline")
      ->excludes(table_baseline);

  // compare
  std::string base_file, new_file;
  CompareOptions copts;
  auto* compare = app.add_subcommand("compare", "the regression gate: exit 1 when NEW is significantly worse than BASE");
  compare->add_option("base", base_file, "the baseline result file")->required();
  compare->add_option("new", new_file, "the result file to judge")->required();
  compare->add_option("--metric", copts.metric, "time (real time and tracked memory) | instructions | memory")->capture_default_str();
  compare->add_option("--max-regress", copts.max_regress, "relative worsening tolerated, 0.05 = 5%")->capture_default_str();
  compare->add_option("--alpha", copts.alpha, "significance level of the Mann-Whitney U test")->capture_default_str();
  compare->add_option("--format", copts.format, "md | csv")->capture_default_str();
  compare->add_flag("--any-machine", copts.any_machine,
                    "compare wall times measured on different machines (exit 3 without it)");

  // merge
  std::vector<std::string> merge_files;
  std::string merge_out;
  bool mixed_cpus = false;
  auto* merge = app.add_subcommand("merge", "join result files (e.g. the shards of a sweep) into one");
  merge->add_option("files", merge_files, "result files")->required();
  merge->add_option("--out", merge_out, "the merged file")->required();
  merge->add_flag("--allow-mixed-cpus", mixed_cpus, "merge files measured on different CPU models");

  // dump
  ShapeOptions dump_shape;
  dump_shape.seq = "128";
  dump_shape.heads = "2";
  dump_shape.dhead = "16";
  std::string dump_dir;
  auto* dump = app.add_subcommand("dump", "write inputs, parameters and outputs of one call as .npy + config.json");
  dump_shape.add_to(dump, false);
  dump->add_option("--out", dump_dir, "output directory")->required();

  if (argc > 1 && argv[1][0] != '-') {
    const std::string verb = argv[1];
    bool known = false;
    for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) known |= sub->get_name() == verb;
    if (!known) {
      std::cerr << "attnbench: error: unknown verb '" << verb << "'; verbs: list, run, sweep, table, compare, merge, dump, task\n";
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

  const std::string command = join_args(argc, argv);
  try {
    if (list->parsed()) return cmd_list(list_what, list_what == "tasks" ? list_data_dir : list_name);
    if (task_sample->parsed()) return cmd_task_sample(task_opts);
    if (task_rate->parsed()) return cmd_task_rate(task_opts);
    if (run->parsed()) {
      apply_preset(run_preset, run, run_shape, run_modes, run_levels, ropts);
      finish_run_options(ropts, run_shape, run_mem, run_count);
      return cmd_run(run_shape.grid(run_modes, run_levels), ropts, run_out, run_format, command, run_preset);
    }
    if (sweep->parsed()) {
      finish_run_options(sopts, sweep_shape, sweep_mem, sweep_count);
      check_run_options(sopts);
      if (sopts.count_instructions) check_instruction_counting();
      parse_shard(shard, &sweep_opts.shard_index, &sweep_opts.shard_count);
      if (sweep_opts.time_limit_s < 0) throw InvalidInput("--time-limit must not be negative");
      sweep_opts.command = command;
      return run_sweep(sweep_shape.grid(sweep_modes, sweep_levels), sopts, sweep_opts);
    }
    if (table->parsed()) return cmd_table(table_files, topts);
    if (compare->parsed()) return cmd_compare(base_file, new_file, copts);
    if (merge->parsed()) return cmd_merge(merge_files, merge_out, mixed_cpus, command);
    if (dump->parsed()) {
      if (dump_shape.mechanism_list().size() != 1) throw InvalidInput("dump takes exactly one mechanism");
      const auto grid = dump_shape.grid({"fwd"}, {"attention"});
      if (grid.size() != 1) throw InvalidInput("dump takes exactly one value of each size and parameter");
      dump_point(grid[0], dump_shape.seed, dump_dir);
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
