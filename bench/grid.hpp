// The grid of points a command line names, and the command line that reproduces one point.
// The options are the point schema's (bench/point.hpp): one option per identity field, each size
// a list, so `run` and `sweep` expand their product and `dump` takes one value of each.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bench/point.hpp"
#include "bench/runner.hpp"

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
                                             {"threads", "1"}};
  std::vector<std::string> attn{"flash"};
  // The train verb's defaults for the recipe (see point_fields()).
  void use_training_defaults();
  std::vector<std::string> params;
  bool causal = false;
  uint64_t seed = 0;
  std::string data_dir;  // model level: the task's real data

  // Registers the options on a verb: `multi` for the verbs that expand a grid (every field; each
  // size a list), else (dump) one point at the attention level. `training`: the train verb's
  // points (model level, mode train, the recipe's fields; the seed is one of them, a list).
  void add_to(CLI::App* app, bool multi, bool training = false);
  bool training = false;
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
};

// The arguments of the `attnbench run` command that reproduces one point (without the program
// name), and that command as one line: the label of every result entry.
std::vector<std::string> point_args(const PointId& id, const RunOptions& o);
std::string point_label(const PointId& id, const RunOptions& o);

}  // namespace ab
