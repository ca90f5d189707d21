// A benchmark point's identity, and the one table of its fields that every place naming a point
// reads: the point's name (the join key between result files), the "point" object of a result
// entry and its reader, the `run` arguments that reproduce it, the columns of `run`'s tables and
// the groups of `table`. Adding a field is one row of point_fields() (and the member it reads).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "attention_impls/attention.hpp"
#include "core/params.hpp"
#include "core/tensor.hpp"
#include "model/trainer.hpp"
#include "model/transformer.hpp"
#include "tasks/task.hpp"

namespace ab {

// attention: the attention call alone on random Q, K, V; model: a whole Transformer on a task.
enum class Level { attention, model };
// What one timed call does. train exists at the model level only (forward, backward, AdamW).
enum class RunMode { fwd, fwdbwd, decode, train };
const char* to_string(Level l);
const char* to_string(RunMode m);
// Throw InvalidInput naming the allowed words.
Level parse_level(const std::string& text);
RunMode parse_run_mode(const std::string& text);
// The mechanism's mode of an attention-level point (fwd, fwdbwd or decode).
Mode attention_mode(RunMode m);
// The model's mode of a model-level point (fwd, fwdbwd or train).
ModelMode model_mode(RunMode m);

// The model's sizes beyond Shape4 (level model only; zero at the attention level).
struct ModelDims {
  int64_t layers = 0, dmodel = 0, mlp = 0;
  bool tie_embeddings = false;  // a language model's output layer is its embedding, transposed
  bool operator==(const ModelDims&) const = default;
};

// The lengths `train --test-seq` takes: powers of two in this range (one result field each).
constexpr int64_t kFirstTestSeq = 16, kLastTestSeq = int64_t{1} << 20;

// A training run's recipe (the `train` verb): everything that decides its accuracy beyond the
// model and the data; steps == 0 means the point is not a training run. Each real number is
// rounded to its spelling in the name ({:g}: six significant digits) when it is set, so a run
// trains with exactly the number its name shows (recipe_number()).
struct TrainSpec {
  int64_t steps = 0, warmup = 0, eval_every = 0, eval_examples = 0, test_examples = 0, seed = 0;
  double lr = 0, beta1 = 0, beta2 = 0, adam_eps = 0, weight_decay = 0, clip = 0, dropout = 0, attn_dropout = 0;
  Schedule schedule;  // the shape (kind, cosine's horizon, step's S and F); lr, warmup, steps are the fields above
  ClipMode clip_mode = ClipMode::global;
  // Every level: a training run's encoding; `run`'s when given (none at the attention level
  // means the mechanism alone, as without the option).
  std::optional<PositionEncoding> positions;
  // Named only when set (every earlier run's name stays what it was): a fixed training set of
  // this many examples cycled in epochs (0: fresh examples); stop at this validation accuracy
  // (0: never); test also at these lengths (increasing powers of two; none).
  int64_t train_examples = 0;
  double stop_at = 0;
  std::vector<int64_t> test_seq;
};
// A recipe number as the name spells it ({:g}), and back: the value a name's text trains with.
std::string recipe_text(double v);
double recipe_number(double v);

// Everything that identifies a point; `name()` is the join key between result files.
struct PointId {
  std::string mechanism;
  ParamValues params;
  Level level = Level::attention;
  RunMode mode = RunMode::fwd;
  std::string task = "none";
  Shape4 shape;  // model level: B batch, H heads, N seq, D = dmodel / heads
  ModelDims model;
  // Model level: the directory of the task's real data ("" for its generator). Part of the
  // identity: a run on real data is another point than one on generated data.
  std::string data_dir;
  // Model level, tasks with a configurable shape (mqar): the vocabulary and the key-value pairs
  // per example (0: the task has no such option; named only when set).
  int64_t vocab = 0, kv_pairs = 0;
  bool causal = false;
  Dtype dtype = Dtype::f32;
  int threads = 1;
  TrainSpec train;  // training runs only
  bool training() const { return train.steps > 0; }
  // attn:NAME/param:value/.../level:L/mode:M/task:T[/L:../dmodel:../mlp:..]/B:../H:../N:../D:../causal:0|1[/dtype:bf16]/threads:..
  std::string name() const;
  // The point a name() names: its segments read through the field table, in its order (a
  // value may hold '/', a data directory: it runs to the next '/' followed by a NAME: segment).
  // InvalidInput naming the segment for a name that is not one.
  static PointId from_name(const std::string& name);
};

// ---- the schema ----
using PointValue = std::variant<int64_t, bool, std::string>;
enum class PointFieldType {
  Text,        // a word: JSON string, `--option word`
  Int,         // JSON number, `--option 64`
  Flag,        // JSON bool, a bare `--option` when true, 0 or 1 in the name
  Mechanism,   // the mechanism: first in the name as attn:NAME
  Params,      // the mechanism's parameters: one name segment and one `--param k=v` each
};

struct PointField {
  const char* key;      // the JSON name under "point"
  const char* segment;  // in the name: ".../segment:value/..."
  const char* option;   // the `run` option that sets it
  const char* column;   // `run`'s table column; fields sharing one show their descriptions side by side
  int column_rank;      // the columns' order, left to right
  PointFieldType type;
  // Which points have it (name, JSON, arguments): every point, model-level points, or training runs.
  // `real_data`: model-level points that read real data (not in a generated point's name).
  // `low_precision`: points whose dtype is not f32 (an f32 point's name has no dtype).
  enum Scope { all, model, real_data, training, low_precision } scope;
  // `table` draws one table per group of points equal in every field with a cluster > 0; its
  // title shows them cluster by cluster (" · " between clusters). 0: the rows (mechanism,
  // params) and columns (N) of the tables.
  int group_cluster;
  PointValue (*get)(const PointId&);
  void (*set)(PointId&, const PointValue&);
  std::string (*describe)(const PointId&);  // in `run`'s column and `table`'s title ("B=4")
  bool (*in_arguments)(const PointId&);     // whether the reproducing command names it; nullptr: always
  // The grid (`run`, `sweep`): the option's help, the task's value when the option is not given
  // (nullptr: none), and the nesting of the grid's loops (lower: outer).
  const char* help;
  int64_t (*task_default)(const TaskInfo&);
  int grid_rank;
  // In the name, the JSON and the arguments only when its value is set (not 0, false or ""),
  // within its scope: a field added after results were written keeps their names.
  bool named_when_set = false;
};
// The task options of a model-level point (its length, vocabulary, pairs, fixed training set).
TaskOptions task_options(const PointId& id);
// In name order.
const std::vector<PointField>& point_fields();
// Whether point `id` has field `f` (its scope).
bool has_field(const PointField& f, const PointId& id);
const PointField& point_field(const std::string& key);  // logic_error when unknown

// A field's value as the name spells it: 64, fwd, 0/1.
std::string value_text(const PointValue& v);

// A result entry's identity fields: its "point" object (and "threads", Google Benchmark's own
// field), and back. The reader throws InvalidInput naming `where` and the field when one is
// missing or of the wrong type; params are read in the order `name` lists them.
void write_point(const PointId& id, nlohmann::json& entry);
PointId read_point(const nlohmann::json& entry, const std::string& name, const std::string& where);
// Sets each parameter of the point's mechanism that its file lacks to its declared default:
// today's name of a point written before that parameter existed (point.cpp says why).
void fill_declared_defaults(PointId& id);

// The `run` arguments that set every identity field of the point (mechanism, params, sizes, ...).
std::vector<std::string> point_identity_args(const PointId& id);

// The title of the group of points `table` draws together: every field with a cluster.
std::string group_title(const PointId& id);

// `run`'s table columns: (column title, the point's text in it), in table order.
std::vector<std::pair<std::string, std::string>> point_columns(const PointId& id);

// Names of several points split into the segments all of them share ("level:model/task:copy",
// in the first name's order) and each name without those (what tells the points apart; a name
// all of whose segments are shared stays whole). One name: nothing is shared.
// --filter REGEX: whether a point's name matches the ECMAScript regular expression anywhere
// (like Google Benchmark's --benchmark_filter); an empty one matches every name. InvalidInput
// for a malformed expression.
class NameFilter {
 public:
  explicit NameFilter(const std::string& regex);
  bool operator()(const std::string& name) const;

 private:
  std::string text_;
  std::shared_ptr<const void> re_;
};

struct ShortNames {
  std::string shared;
  std::vector<std::string> names;
};
ShortNames short_point_names(const std::vector<std::string>& names);

}  // namespace ab
