#include "bench/points/grid.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>

#include "attention_impls/registry.hpp"

namespace ab {

namespace {
int64_t parse_at_least(const std::string& s, const std::string& whole, int64_t min_value) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno || v < min_value)
    throw InvalidInput(fmt::format("'{}' in '{}' is not a {} integer", s, whole, min_value > 0 ? "positive" : "non-negative"));
  return v;
}
constexpr size_t kMaxGridPoints = 100000;

// Sizes whose products no machine could hold are refused here, before any count of FLOPs or
// bytes is formed (those are int64 and would overflow): the largest tensor a point makes, in
// elements, must stay below 2^44 (64 TiB of floats).
void check_sizes_fit(const PointId& p) {
  // In long double: four factors of up to 2^63 each overflow any integer type.
  using real = long double;
  const real B = real(p.shape.B), H = real(p.shape.H), N = real(p.shape.N), D = real(p.shape.D);
  const real width = real(std::max<int64_t>({p.model.dmodel, p.model.mlp, 1}));
  const real layers = real(std::max<int64_t>(p.model.layers, 1));
  const real biggest = std::max({B * H * N * D, B * N * width * layers, B * H * N});
  // The quadratic mechanisms' counts (4·B·H·N²·D FLOPs, B·H·N² scores) are int64 everywhere.
  const real quadratic = 4 * B * H * N * N * D;
  if (biggest >= 17592186044416.0L || quadratic >= 4611686018427387904.0L)  // 2^44, 2^62
    throw InvalidInput(fmt::format("B={} H={} N={} D={}{}: tensors of this size exceed any machine's memory (2^44 elements, or 2^62 for the N x N counts)",
                                   p.shape.B, p.shape.H, p.shape.N, p.shape.D,
                                   p.model.dmodel ? fmt::format(" dmodel={} mlp={} layers={}", p.model.dmodel, p.model.mlp,
                                                                p.model.layers)
                                                  : ""));
}
}  // namespace

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

std::vector<int64_t> parse_int_list(const std::string& text, int64_t min_value) {
  constexpr size_t kMaxListValues = 10000;
  auto parse_positive = [&](const std::string& s, const std::string& whole) { return parse_at_least(s, whole, min_value); };
  std::vector<int64_t> out;
  if (text.empty()) throw InvalidInput("empty list");
  for (const auto& item : split(text, ',')) {
    auto parts = split(item, ':');
    if (parts.size() == 1) {
      out.push_back(parse_positive(item, text));
    } else if (parts.size() == 3 && parts[2].size() > 1 && (parts[2][0] == 'x' || parts[2][0] == '+')) {
      const int64_t lo = parse_positive(parts[0], text), hi = parse_positive(parts[1], text);
      const int64_t step = parse_at_least(parts[2].substr(1), text, 1);
      if (hi < lo) throw InvalidInput(fmt::format("range '{}' ends below its start", item));
      if (parts[2][0] == 'x' && step < 2) throw InvalidInput(fmt::format("range '{}' needs a factor >= 2", item));
      // The next value is computed only when it stays within hi (no overflow), and a range
      // gives at most kMaxListValues values.
      for (int64_t v = lo;;) {
        out.push_back(v);
        if (out.size() > kMaxListValues)
          throw InvalidInput(fmt::format("range '{}' gives more than {} values; use a coarser step or split the grid", item,
                                         kMaxListValues));
        if (parts[2][0] == 'x' ? v > hi / step : v > hi - step) break;
        v = parts[2][0] == 'x' ? v * step : v + step;
      }
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
  if (text.empty() || errno || mult < 0 || !(v > 0) || !(v * mult >= 1) || !(v * mult < 1.8e19))
    throw InvalidInput(fmt::format("'{}' is not a memory size (examples: 16G, 512M, 1048576)", text));
  return static_cast<size_t>(v * mult);
}

void GridOptions::set_training(bool on) {
  if (!on) {
    for (const auto& f : point_fields())
      if (f.scope == PointField::training && std::string(f.key) != "seed" && given(f.key))
        throw InvalidInput(fmt::format("{} belongs to a training run (attnbench train, or sweep --verb train)", f.option));
    return;
  }
  if (given("level") || given("mode")) throw InvalidInput("a training run is the model level's train mode: no --level or --mode");
  training = true;
  text["level"] = "model";
  text["mode"] = "train";
}

uint64_t GridOptions::seed() const {
  const auto it = text.find("seed");
  const std::string s = it == text.end() ? "0" : it->second;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno || s[0] == '-')
    throw InvalidInput(fmt::format("--seed '{}' is not one non-negative integer (a list of seeds is for training runs)", s));
  return v;
}

namespace {
// The train verb's recipe defaults (see point_fields()).
const std::map<std::string, std::string>& recipe_defaults() {
  static const std::map<std::string, std::string> d{
           {"steps", "1000"}, {"lr", "0.001"}, {"schedule", "constant"}, {"warmup", "0"}, {"beta1", "0.9"},
           {"beta2", "0.999"}, {"adam_eps", "1e-08"}, {"weight_decay", "0.01"}, {"clip", "0"}, {"clip_mode", "global"},
           {"dropout", "0"}, {"attn_dropout", "0"}, {"positions", "sinusoidal"}, {"eval_every", "0"},
           {"eval_examples", "1000"}, {"test_examples", "2000"}, {"seed", "0"}, {"train_examples", "0"}};
  return d;
}
}  // namespace

void GridOptions::init_defaults() {
  for (const auto& [k, v] : recipe_defaults())
    if (!text.count(k)) text[k] = v;
}

void GridOptions::add_to(CLI::App* app, Verb verb) {
  const bool multi = verb != Verb::dump, recipe = verb == Verb::sweep || verb == Verb::train;
  const std::string list = " (list: 1,2 or a range like 256:16384:x2 or 64:256:+64)";
  init_defaults();
  if (multi)
    app->add_option("--filter", filter,
                    "only the points whose name this regular expression matches, e.g. 'attn:(flash|linear)/.*N:4096' "
                    "(names: --dry-run lists them)");
  for (const auto& f : point_fields()) {
    const std::string key = f.key;
    std::string help = f.help;
    // The seed is every verb's option; the rest of the recipe, the training verbs'.
    if (f.scope == PointField::training && key != "seed" && !recipe) continue;
    if (key == "seed") {
      help = recipe ? "seed of the data, the initialisation, dropout and redraws (training runs: a list)"
                    : "seed of every random draw";
      options_[key] = app->add_option(f.option, text[key], help)->capture_default_str();
      continue;
    }
    if (recipe && f.scope == PointField::training) help += " (training runs)";
    // dump has no --task: the head size is its own option there.
    if (verb == Verb::dump && key == "dhead") help = "head dimension D";
    if (verb == Verb::train && key == "task") help = "the task to train on (attnbench list tasks); the model's shape defaults to its";
    // A training run is the model level's train mode: those two are not options of its verb.
    if (verb == Verb::train && (key == "level" || key == "mode")) continue;
    switch (f.type) {
      case PointFieldType::Mechanism:
        options_[key] = app->add_option(f.option, attn, multi ? help : "the mechanism")->delimiter(',')->capture_default_str();
        break;
      case PointFieldType::Params:
        options_[key] = app->add_option(f.option, params, multi ? help : "mechanism parameter name=value (repeatable)");
        break;
      case PointFieldType::Flag:
        if (!multi && f.scope == PointField::model) break;
        options_[key] = app->add_flag(f.option, flags[key], help);
        break;
      case PointFieldType::Text:
        // dump takes one point: of the words, only the position encoding inside the mechanism.
        if (multi || key == "positions")
          options_[key] = app->add_option(f.option, text[key],
                                          help + (multi && (f.scope == PointField::training || key == "positions") ? " (list: a,b)" : ""))
                              ->capture_default_str();
        break;
      case PointFieldType::Int:
        if (!multi && f.scope == PointField::model) break;
        options_[key] = app->add_option(f.option, text[key],
                                        help + (multi ? list : "") + (multi && f.task_default ? " (default with --task: the task's)" : ""))
                            ->capture_default_str();
        break;
    }
  }
}

void GridOptions::set_by_preset(const std::string& key, const std::string& value) {
  text[key] = value;
  preset_.insert(key);
}

bool GridOptions::given(const std::string& key) const {
  const auto it = options_.find(key);
  return preset_.count(key) || (it != options_.end() && it->second->count() > 0);
}


std::vector<std::string> GridOptions::mechanism_list() const {
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
std::vector<std::string> GridOptions::params_for(const std::string& mech, const std::vector<std::string>& all_mechs) const {
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
    // Unprefixed in a multi-mechanism run: applies to the mechanisms that declare it, and must be
    // declared by at least one.
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
std::vector<ParamValues> GridOptions::param_grid(const std::string& mech, const std::vector<std::string>& all_mechs) const {
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

std::string GridOptions::text_of(const std::string& key) const {
  const auto it = text.find(key);
  return it == text.end() ? std::string() : it->second;
}

// 1. One field's values, parsed and checked before any point is made.
std::vector<PointValue> GridOptions::option_values(const PointField& f, const std::vector<std::string>& mechs,
                                                   const TaskInfo* ti) const {
  const std::string key = f.key;
  std::vector<PointValue> v;
  if (f.scope == PointField::training && !training)
    return {f.type == PointFieldType::Int ? PointValue(int64_t{0}) : PointValue(std::string())};
  switch (f.type) {
    case PointFieldType::Mechanism:
      for (const auto& m : mechs) v.push_back(m);
      return v;
    case PointFieldType::Params:
      return v;  // per mechanism, in the product
    case PointFieldType::Flag:
      return {flags.count(key) ? flags.at(key) : false};
    case PointFieldType::Text:
      if (key == "task") return {ti ? ti->name : std::string("none")};
      // Not given: not in the point (a training run's recipe has a default for it, a run not).
      if (f.named_when_set && (text_of(key).empty() || (!training && !given(key)))) return {std::string()};
      if (f.scope == PointField::real_data || key == "test_seq")  // one path or one list of lengths, commas and all
        return {text_of(key)};
      for (const auto& word : split(text_of(key), ',')) {
        PointId probe;
        f.set(probe, word);  // parses: an unknown word throws InvalidInput naming the allowed ones
        v.push_back(f.get(probe));
      }
      return v;
    case PointFieldType::Int: {
      std::vector<int64_t> ints;
      if (ti && f.task_default && !given(key)) {
        ints = {f.task_default(*ti)};
      } else if (f.scope == PointField::model && !given(key)) {
        ints = {0};  // no task: no model point (refused below), and 0 at the attention level
      } else {
        try {
          ints = parse_int_list(text_of(key), f.scope == PointField::training || key == "mlp" ? 0 : 1);  // --mlp 0: no MLP
        } catch (const InvalidInput& e) {
          throw InvalidInput(fmt::format("{}: {}", f.option, e.what()));
        }
      }
      for (int64_t x : ints) {
        if (key == "threads" && x > 1024) throw InvalidInput(fmt::format("--threads {} is more than 1024", x));
        PointId probe;
        f.set(probe, x);  // checks the value's range
        v.push_back(x);
      }
      return v;
    }
  }
  return v;
}

// 2. The checks between options.
void GridOptions::check_option_combinations(const FieldValues& values, const TaskInfo* ti) const {
  for (const auto& d : values.at("dtype"))
    if (std::get<std::string>(d) == to_string(Dtype::bf16) && !cpu_has_bf16())
      throw InvalidInput("--dtype bf16 needs a CPU with AVX512-BF16 (vdpbf16ps); this one has none");
  bool model_level = false;
  for (const auto& l : values.at("level")) model_level |= std::get<std::string>(l) == to_string(Level::model);
  if (model_level && !ti) throw InvalidInput("--level model needs --task (attnbench list tasks)");
  if (model_level && given("dhead")) throw InvalidInput("--level model takes --dmodel and --heads; the head size is dmodel / heads");
  // --data-dir is a task's real data: at the attention level there is no task to read it
  // (a generated task refuses it itself, tasks/task.cpp), and it is never ignored.
  if (given("data_dir") && !model_level)
    throw InvalidInput("--data-dir is read by a task's model: it needs --level model --task T (or train --task T)");
}

// 3. A field whose values depend on the fields before it: the model's sizes (model level only),
// the head size (the model's dmodel / heads; at the attention level with a task, the task's
// dmodel / heads), the task's pairs per example, the validations of a run.
std::vector<PointValue> GridOptions::values_given_point(const PointField& f, const PointId& p, const FieldValues& values,
                                                        const TaskInfo* ti) const {
  const std::string key = f.key;
  const std::vector<PointValue>& vs = values.at(key);
  const bool model = p.level == Level::model;
  if (key == "eval_every" && std::get<int64_t>(vs.front()) == 0 && vs.size() == 1)
    return {std::max<int64_t>(1, p.train.steps / 10)};  // ten validations over the run
  if (f.scope == PointField::model && !model) return {f.type == PointFieldType::Flag ? PointValue(false) : PointValue(int64_t{0})};
  if (key == "dhead" && model) {
    if (p.model.dmodel % p.shape.H)
      throw InvalidInput(fmt::format("--dmodel {} is not a multiple of --heads {}", p.model.dmodel, p.shape.H));
    return {p.model.dmodel / p.shape.H};
  }
  if (key == "kv_pairs" && model && ti && task_takes_option(*ti, "kv_pairs") && !given(key))
    return {std::max<int64_t>(1, p.shape.N / 16)};  // the task's default, N/16, named with the point
  if ((key == "vocab" || key == "kv_pairs") && given(key) && !(ti && task_takes_option(*ti, key)))
    throw InvalidInput(fmt::format("{}: the {} task has no such option (attnbench list tasks)", f.option, ti ? ti->name : "none"));
  if (key == "dhead" && ti && !given("dhead")) {
    std::vector<PointValue> heads;
    for (const auto& dm : values.at("dmodel")) heads.push_back(std::max<int64_t>(1, std::get<int64_t>(dm) / p.shape.H));
    return heads;
  }
  return vs;
}

std::vector<PointId> GridOptions::grid() const {
  const auto mechs = mechanism_list();
  const std::string task_name = text_of("task");
  const TaskInfo* ti = task_name.empty() ? nullptr : &find_task(task_name);
  FieldValues values;
  for (const auto& f : point_fields()) values[f.key] = option_values(f, mechs, ti);
  check_option_combinations(values, ti);

  // The product, in grid order; the mechanism's parameters per mechanism.
  std::vector<const PointField*> order;
  for (const auto& f : point_fields()) order.push_back(&f);
  std::stable_sort(order.begin(), order.end(), [](const PointField* a, const PointField* b) { return a->grid_rank < b->grid_rank; });
  std::vector<PointId> out;
  std::function<void(size_t, PointId&)> expand = [&](size_t k, PointId& p) {
    if (k == order.size()) {
      PointId q = p;
      // Decoding is causal by definition; so is a next-token task's model.
      q.causal = q.causal || q.mode == RunMode::decode || (ti && ti->next_token);
      check_sizes_fit(q);
      if (out.size() >= kMaxGridPoints)
        throw InvalidInput(fmt::format("the grid has more than {} points; narrow its lists, or split it with --filter or "
                                       "sweep --shard",
                                       kMaxGridPoints));
      out.push_back(std::move(q));
      return;
    }
    const PointField& f = *order[k];
    if (f.type == PointFieldType::Params) {
      for (const auto& pv : param_grid(p.mechanism, mechs)) {
        p.params = pv;
        expand(k + 1, p);
      }
      return;
    }
    if (f.scope == PointField::training && !training) {
      expand(k + 1, p);  // not a training run: the recipe stays empty
      return;
    }
    for (const auto& v : values_given_point(f, p, values, ti)) {
      f.set(p, v);
      expand(k + 1, p);
    }
  };
  PointId p;
  expand(0, p);
  return filter_points(std::move(out), filter);
}

std::vector<PointId> filter_points(std::vector<PointId> points, const std::string& regex) {
  if (regex.empty()) return points;
  const NameFilter keep(regex);
  const size_t all = points.size();
  const std::string example = all ? points.front().name() : "";
  points.erase(std::remove_if(points.begin(), points.end(), [&](const PointId& id) { return !keep(id.name()); }), points.end());
  if (points.empty() && all)
    throw InvalidInput(fmt::format("--filter '{}' matches none of the {} points (the first is {})", regex, all, example));
  return points;
}


}  // namespace ab
