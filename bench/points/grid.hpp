// The grid of points a command line names, and the command line that reproduces one point.
// The options are the point schema's (bench/points/point.hpp): one option per identity field, each size
// a list, so `run` and `sweep` expand their product and `dump` takes one value of each.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bench/points/point.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace ab {

// "256,512,1024", "256:16384:x2" (geometric) or "1024:4096:+1024" (arithmetic), mixed freely
// with commas. Throws InvalidInput on malformed or non-positive items.
// Items below `min_value` are refused (0 allows zero: a seed, a warm-up).
std::vector<int64_t> parse_int_list(const std::string& text, int64_t min_value = 1);

// "17179869184", "16G", "512M", "64K" (binary units). Throws InvalidInput.
size_t parse_bytes(const std::string& text);

// "a,b,c" -> {a, b, c}.
std::vector<std::string> split(const std::string& s, char sep);

// The options naming points, shared by run, sweep and dump.
struct GridOptions {
  // The text of each identity option by field key; construct with a verb's defaults.
  std::map<std::string, std::string> text = {{"level", "attention"}, {"mode", "fwd"}, {"batch", "1"},
                                             {"heads", "8"},         {"seq", "1024"}, {"dhead", "64"},
                                             {"threads", "1"},       {"dtype", "f32"}};
  std::vector<std::string> attn{"flash"};
  std::string filter;  // --filter REGEX: only the points whose name it matches
  std::vector<std::string> params;
  std::map<std::string, bool> flags;  // the Flag fields' options (--causal, --tie-embeddings), by key

  // Which options a verb has: dump one point at the attention level; run every identity field,
  // each size a list; sweep those and a training run's recipe (for --verb train); train the
  // recipe without --level and --mode (its points are the model level's train mode).
  enum class Verb { dump, run, sweep, train };
  void add_to(CLI::App* app, Verb verb);
  // The recipe's defaults (add_to sets them too): for grids built in code (presets).
  void init_defaults();
  // The points are training runs (train, sweep --verb train): model level, mode train, with a
  // recipe. InvalidInput when --level or --mode were given, or (not training) a recipe option.
  void set_training(bool on);
  bool training = false;
  // The seed of a point that is not a training run: --seed holds one value.
  uint64_t seed() const;
  // Whether the user gave the field's option (or a preset set it).
  bool given(const std::string& key) const;
  void set_by_preset(const std::string& key, const std::string& value);

  std::vector<std::string> mechanism_list() const;
  // The points, nested in the schema's grid order (mechanism outermost, N innermost). Throws
  // InvalidInput naming a malformed option or an impossible combination.
  std::vector<PointId> grid() const;

 private:
  std::map<std::string, const CLI::Option*> options_;
  std::set<std::string> preset_;
  std::vector<std::string> params_for(const std::string& mech, const std::vector<std::string>& all_mechs) const;
  std::vector<ParamValues> param_grid(const std::string& mech, const std::vector<std::string>& all_mechs) const;
  // grid()'s passes: 1. a field's values from its option (or the task's default), parsed and
  // checked; 2. the checks between options; 3. a field's values given the point's earlier fields.
  using FieldValues = std::map<std::string, std::vector<PointValue>>;
  std::vector<PointValue> option_values(const PointField& f, const std::vector<std::string>& mechs, const TaskInfo* task) const;
  void check_option_combinations(const FieldValues& values, const TaskInfo* task) const;
  std::vector<PointValue> values_given_point(const PointField& f, const PointId& p, const FieldValues& values,
                                             const TaskInfo* task) const;
  std::string text_of(const std::string& key) const;
};

// The points whose name the ECMAScript regular expression `regex` matches anywhere (like Google
// Benchmark's --benchmark_filter); "" keeps all. InvalidInput for a malformed expression or when
// it matches none of them (a typo would otherwise run nothing and succeed).
std::vector<PointId> filter_points(std::vector<PointId> points, const std::string& regex);
// An argument as a POSIX shell reads it back: as it is when it is plain, else in single quotes.
std::string shell_quote(const std::string& arg);

}  // namespace ab
