#include "bench/points/point.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <regex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <stdexcept>

#include "attention_impls/registry.hpp"
#include "model/trainer.hpp"
#include "tasks/task.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace ab {

const char* to_string(Level l) { return l == Level::model ? "model" : "attention"; }

const char* to_string(RunMode m) {
  switch (m) {
    case RunMode::fwd: return "fwd";
    case RunMode::fwdbwd: return "fwdbwd";
    case RunMode::decode: return "decode";
    case RunMode::train: return "train";
  }
  return "?";
}

Level parse_level(const std::string& text) {
  for (Level l : {Level::attention, Level::model})
    if (text == to_string(l)) return l;
  throw unknown_name("level", text, {"attention", "model"}, "levels");
}

RunMode parse_run_mode(const std::string& text) {
  for (RunMode m : {RunMode::fwd, RunMode::fwdbwd, RunMode::decode, RunMode::train})
    if (text == to_string(m)) return m;
  throw unknown_name("mode", text, {"fwd", "fwdbwd", "decode", "train"}, "modes");
}

Mode attention_mode(RunMode m) {
  switch (m) {
    case RunMode::fwd: return Mode::fwd;
    case RunMode::fwdbwd: return Mode::fwdbwd;
    case RunMode::decode: return Mode::decode;
    case RunMode::train: break;
  }
  throw InvalidInput("--mode train needs --level model");
}

ModelMode model_mode(RunMode m) {
  switch (m) {
    case RunMode::fwd: return ModelMode::fwd;
    case RunMode::fwdbwd: return ModelMode::fwdbwd;
    case RunMode::train: return ModelMode::train;
    case RunMode::decode: break;
  }
  throw InvalidInput("the model level runs --mode fwd, fwdbwd or train (decode is an attention-level mode)");
}

std::string value_text(const PointValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "1" : "0";
  return std::get<std::string>(v);
}

std::string recipe_text(double v) { return fmt::format("{:g}", v); }
double recipe_number(double v) { return std::strtod(recipe_text(v).c_str(), nullptr); }

namespace {
int64_t as_int(const PointValue& v) { return std::get<int64_t>(v); }
const std::string& as_text(const PointValue& v) { return std::get<std::string>(v); }
bool is_model(const PointId& id) { return id.level == Level::model; }

// Checks and canonical spellings of the training recipe's values (InvalidInput naming the option).
int64_t at_least_one(const char* opt, int64_t v) {
  if (v < 1) throw InvalidInput(fmt::format("{} must be at least 1, got {}", opt, v));
  return v;
}
int64_t not_negative(const char* opt, int64_t v) {
  if (v < 0) throw InvalidInput(fmt::format("{} must not be negative, got {}", opt, v));
  return v;
}
double number(const char* opt, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) throw InvalidInput(fmt::format("{} '{}' is not a number", opt, text));
  return v;
}
double positive_number(const char* opt, const std::string& text) {
  const double v = number(opt, text);
  if (!(v > 0)) throw InvalidInput(fmt::format("{} must be positive, got {}", opt, text));
  return recipe_number(v);
}
double non_negative_number(const char* opt, const std::string& text) {
  const double v = number(opt, text);
  if (!(v >= 0)) throw InvalidInput(fmt::format("{} must not be negative, got {}", opt, text));
  return recipe_number(v);
}
double unit_interval(const char* opt, const std::string& text) {
  const double v = number(opt, text);
  if (!(v >= 0 && v < 1)) throw InvalidInput(fmt::format("{} must be in [0, 1), got {}", opt, text));
  return recipe_number(v);
}
double unit_interval_closed(const char* opt, const std::string& text) {
  const double v = number(opt, text);
  if (!(v > 0 && v <= 1)) throw InvalidInput(fmt::format("{} must be in (0, 1], got {}", opt, text));
  return recipe_number(v);
}
const char* clip_mode_name(ClipMode m) { return m == ClipMode::per_tensor ? "per-tensor" : "global"; }
ClipMode parse_clip_mode(const char* opt, const std::string& text) {
  if (text == "global") return ClipMode::global;
  if (text == "per-tensor") return ClipMode::per_tensor;
  throw InvalidInput(fmt::format("unknown {} '{}'; clip modes: global, per-tensor", opt, text));
}
// "512,1024": distinct lengths of at least 2 in increasing order.
std::vector<int64_t> length_list(const char* opt, const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string w = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(w.c_str(), &end, 10);
    if (w.empty() || *end != '\0' || errno || v < kFirstTestSeq || v > kLastTestSeq || (v & (v - 1)) ||
        (!out.empty() && v <= out.back()))
      throw InvalidInput(fmt::format("{} '{}': powers of two from {} to {} (one result field each) in increasing order, "
                                     "comma-separated",
                                     opt, text, kFirstTestSeq, kLastTestSeq));
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}
std::string length_list_text(const std::vector<int64_t>& lengths) { return fmt::format("{}", fmt::join(lengths, ",")); }

// The fields, in name order. Accessors are captureless lambdas (plain function pointers).
std::vector<PointField> make_fields() {
  using T = PointFieldType;
  using V = PointValue;
  using P = const PointId&;
  return {
      {"attn", "attn", "--attn", "mechanism", 0, T::Mechanism, PointField::all, 0,
       [](P p) -> V { return p.mechanism; }, [](PointId& p, const V& v) { p.mechanism = as_text(v); },
       [](P p) { return p.mechanism; }, nullptr,
       "mechanisms, comma-separated, or 'all'",
       nullptr, 0},
      {"params", "", "--param", "params", 1, T::Params, PointField::all, 0,
       [](P) -> V { return std::string(); }, [](PointId&, const V&) {},  // read and written by items
       [](P p) { return params_text(p.params); }, nullptr,
       "mechanism parameter name=value (repeatable; mech.name=value targets one mechanism; name=v1,v2 makes a grid of the values)",
       nullptr, 1},
      {"level", "level", "--level", "level", 2, T::Text, PointField::all, 1,
       [](P p) -> V { return std::string(to_string(p.level)); }, [](PointId& p, const V& v) { p.level = parse_level(as_text(v)); },
       [](P p) { return fmt::format("level {}", to_string(p.level)); }, [](P p) { return !p.training(); },
       "attention | model (a whole Transformer on --task's tokens), comma-separated",
       nullptr, 2},
      {"mode", "mode", "--mode", "mode", 5, T::Text, PointField::all, 2,
       [](P p) -> V { return std::string(to_string(p.mode)); }, [](PointId& p, const V& v) { p.mode = parse_run_mode(as_text(v)); },
       [](P p) { return fmt::format("mode {}", to_string(p.mode)); }, [](P p) { return !p.training(); },
       "fwd | fwdbwd | decode | train, comma-separated; decode: one new token after a context of N; train (model level): forward, backward and the AdamW step",
       nullptr, 3},
      {"task", "task", "--task", "task", 3, T::Text, PointField::all, 3,
       [](P p) -> V { return p.task; }, [](PointId& p, const V& v) { p.task = as_text(v); },
       [](P p) { return fmt::format("task {}", p.task); }, [](P p) { return p.task != "none"; },
       "take the shape from this task's model (attnbench list tasks); needed by --level model",
       nullptr, 4},
      {"layers", "L", "--layers", "model", 4, T::Int, PointField::model, 4,
       [](P p) -> V { return p.model.layers; }, [](PointId& p, const V& v) { p.model.layers = as_int(v); },
       [](P p) { return fmt::format("L={}", p.model.layers); }, nullptr,
       "model level: Transformer blocks",
       [](const TaskInfo& t) { return t.model.layers; }, 8},
      {"dmodel", "dmodel", "--dmodel", "model", 4, T::Int, PointField::model, 4,
       [](P p) -> V { return p.model.dmodel; }, [](PointId& p, const V& v) { p.model.dmodel = as_int(v); },
       [](P p) { return fmt::format("d_model={}", p.model.dmodel); }, nullptr,
       "model level: model width",
       [](const TaskInfo& t) { return t.model.dmodel; }, 9},
      {"mlp", "mlp", "--mlp", "model", 4, T::Int, PointField::model, 4,
       [](P p) -> V { return p.model.mlp; }, [](PointId& p, const V& v) { p.model.mlp = as_int(v); },
       [](P p) { return fmt::format("mlp={}", p.model.mlp); }, nullptr,
       "model level: feed-forward width (0: blocks of attention alone)",
       [](const TaskInfo& t) { return t.model.mlp; }, 10},
      {"tie", "tie", "--tie-embeddings", "model", 4, T::Flag, PointField::model, 4,
       [](P p) -> V { return p.model.tie_embeddings; }, [](PointId& p, const V& v) { p.model.tie_embeddings = std::get<bool>(v); },
       [](P p) { return std::string(p.model.tie_embeddings ? "tied" : "untied"); }, nullptr,
       "model level: a language model's output layer is its token embedding, transposed (Zoology, GPT-2)",
       nullptr, 10, true},
      {"vocab", "V", "--vocab", "task", 3, T::Int, PointField::model, 3,
       [](P p) -> V { return p.vocab; }, [](PointId& p, const V& v) { p.vocab = not_negative("--vocab", as_int(v)); },
       [](P p) { return fmt::format("V={}", p.vocab); }, nullptr,
       "model level, mqar: the vocabulary (keys in [1, V/2), values in [V/2, V))",
       [](const TaskInfo& t) -> int64_t { return task_takes_option(t, "vocab") ? t.vocab : 0; }, 4, true},
      // Its default depends on N (N/16), so it nests inside the lengths: see GridOptions::grid.
      {"kv_pairs", "kv", "--kv-pairs", "task", 3, T::Int, PointField::model, 3,
       [](P p) -> V { return p.kv_pairs; }, [](PointId& p, const V& v) { p.kv_pairs = not_negative("--kv-pairs", as_int(v)); },
       [](P p) { return fmt::format("D={}", p.kv_pairs); }, nullptr,
       "model level, mqar: key-value pairs per example (default N/16)",
       nullptr, 13, true},
      // The real data's directory: a path, so not split into a list.
      {"data_dir", "data", "--data-dir", "data", 13, T::Text, PointField::real_data, 3,
       [](P p) -> V { return p.data_dir; }, [](PointId& p, const V& v) { p.data_dir = as_text(v); },
       [](P p) { return fmt::format("data {}", p.data_dir); }, nullptr,
       "model level: read the task's real data from this directory (attnbench list tasks says which files)",
       nullptr, 5},
      {"batch", "B", "--batch", "B", 7, T::Int, PointField::all, 5,
       [](P p) -> V { return p.shape.B; }, [](PointId& p, const V& v) { p.shape.B = as_int(v); },
       [](P p) { return fmt::format("B={}", p.shape.B); }, nullptr,
       "batch size B",
       [](const TaskInfo& t) { return t.model.batch; }, 6},
      {"heads", "H", "--heads", "H", 8, T::Int, PointField::all, 5,
       [](P p) -> V { return p.shape.H; }, [](PointId& p, const V& v) { p.shape.H = as_int(v); },
       [](P p) { return fmt::format("H={}", p.shape.H); }, nullptr,
       "heads H",
       [](const TaskInfo& t) { return t.model.heads; }, 7},
      {"seq", "N", "--seq", "N", 9, T::Int, PointField::all, 0,
       [](P p) -> V { return p.shape.N; }, [](PointId& p, const V& v) { p.shape.N = as_int(v); },
       [](P p) { return fmt::format("N={}", p.shape.N); }, nullptr,
       "sequence lengths N",
       [](const TaskInfo& t) { return t.default_seq; }, 12},
      // The model's head size is dmodel / heads: named, but not an argument of its own.
      {"dhead", "D", "--dhead", "D", 10, T::Int, PointField::all, 5,
       [](P p) -> V { return p.shape.D; }, [](PointId& p, const V& v) { p.shape.D = as_int(v); },
       [](P p) { return fmt::format("D={}", p.shape.D); }, [](P p) { return !is_model(p); },
       "head dimension D (attention level; with --task: dmodel / heads)",
       nullptr, 11},
      // A next-token task's model is causal by itself: --causal is only given where it is a choice.
      {"causal", "causal", "--causal", "causal", 6, T::Flag, PointField::all, 6,
       [](P p) -> V { return p.causal; }, [](PointId& p, const V& v) { p.causal = std::get<bool>(v); },
       [](P p) { return std::string(p.causal ? "causal" : "non-causal"); },
       [](P p) { return !(p.task != "none" && find_task(p.task).next_token); },
       "causal masking (query i uses keys j <= i)",
       nullptr, 13},
      // Named only when it is not f32: every earlier result's name stays what it was.
      // Its own column (not beside causal): a fitted terminal table shortens shared cells, and
      // "non-causal bf16" lost its dtype there.
      {"dtype", "dtype", "--dtype", "dtype", 14, T::Text, PointField::low_precision, 6,
       [](P p) -> V { return std::string(to_string(p.dtype)); }, [](PointId& p, const V& v) { p.dtype = parse_dtype(as_text(v)); },
       [](P p) { return std::string(to_string(p.dtype)); }, nullptr,
       "f32 | bf16 (inputs and matrix products in bf16, float accumulation and softmax; forward, mechanisms with a bf16 path, "
       "a CPU with AVX512-BF16), comma-separated",
       nullptr, 13},
      // The thread count is Google Benchmark's own entry field "threads", not under "point".
      {"threads", "threads", "--threads", "threads", 11, T::Int, PointField::all, 7,
       [](P p) -> V { return static_cast<int64_t>(p.threads); },
       [](PointId& p, const V& v) { p.threads = static_cast<int>(as_int(v)); },
       [](P p) { return fmt::format("{} thread{}", p.threads, p.threads == 1 ? "" : "s"); }, nullptr,
       "OpenMP threads",
       nullptr, 5},
      // ---- training runs (the `train` verb): the recipe, one column, one title cluster ----
#define AB_TRAIN_INT(key, seg, opt, member, help, rank, check)                                               \
  {key, seg, opt, "training", 12, T::Int, PointField::training, 8,                                             \
   [](P p) -> V { return p.train.member; },                                                                     \
   [](PointId& p, const V& v) { p.train.member = check(opt, as_int(v)); },                                     \
   [](P p) { return fmt::format("{}={}", seg, p.train.member); }, nullptr, help, nullptr, rank}
#define AB_TRAIN_NUMBER(key, seg, opt, member, help, rank, check)                                            \
  {key, seg, opt, "training", 12, T::Text, PointField::training, 8,                                            \
   [](P p) -> V { return recipe_text(p.train.member); },                                                        \
   [](PointId& p, const V& v) { p.train.member = check(opt, as_text(v)); },                                    \
   [](P p) { return fmt::format("{}={}", seg, recipe_text(p.train.member)); }, nullptr, help, nullptr, rank}
      AB_TRAIN_INT("steps", "steps", "--steps", steps, "training steps (optimizer updates)", 14, at_least_one),
      AB_TRAIN_NUMBER("lr", "lr", "--lr", lr, "learning rate (linear-warmup-rsqrt: LRA's base rate)", 15, positive_number),
      {"schedule", "schedule", "--schedule", "training", 12, T::Text, PointField::training, 8,
       [](P p) -> V { return p.train.schedule.name(); },
       [](PointId& p, const V& v) { p.train.schedule = Schedule::parse(as_text(v)); },
       [](P p) { return fmt::format("schedule={}", p.train.schedule.name()); }, nullptr,
       "constant | linear-warmup-rsqrt | cosine | cosine:H (over H steps; a run may stop before) | onecycle | step:S[:F] (F times the rate after step S)",
       nullptr, 16},
      AB_TRAIN_INT("warmup", "warmup", "--warmup-steps", warmup, "warm-up steps of the schedule", 17, not_negative),
      AB_TRAIN_NUMBER("beta1", "beta1", "--beta1", beta1, "AdamW's first-moment decay", 18, unit_interval),
      AB_TRAIN_NUMBER("beta2", "beta2", "--beta2", beta2, "AdamW's second-moment decay", 19, unit_interval),
      AB_TRAIN_NUMBER("adam_eps", "adam_eps", "--adam-eps", adam_eps, "AdamW's epsilon", 20, positive_number),
      AB_TRAIN_NUMBER("weight_decay", "wd", "--weight-decay", weight_decay,
                    "decoupled weight decay (AdamW: w -= lr * wd * w)", 21, non_negative_number),
      AB_TRAIN_NUMBER("clip", "clip", "--clip", clip, "clip gradients to this norm (0: no clipping)", 22, non_negative_number),
      {"clip_mode", "clip_mode", "--clip-mode", "training", 12, T::Text, PointField::training, 8,
       [](P p) -> V { return std::string(clip_mode_name(p.train.clip_mode)); },
       [](PointId& p, const V& v) { p.train.clip_mode = parse_clip_mode("--clip-mode", as_text(v)); },
       [](P p) { return fmt::format("clip_mode={}", clip_mode_name(p.train.clip_mode)); }, nullptr,
       "global (the norm of every gradient together) | per-tensor (each tensor's own)", nullptr, 23},
      AB_TRAIN_NUMBER("dropout", "dropout", "--dropout", dropout, "dropout on the embedding and the residual branches", 24,
                    unit_interval),
      AB_TRAIN_NUMBER("attn_dropout", "attn_dropout", "--attn-dropout", attn_dropout,
                    "dropout on the attention probabilities (mechanisms that form them; see attnbench list)", 25,
                    unit_interval),
      // Every level: a training run always names its encoding; `run` only when given (the
      // attention level takes the additive ones, which live inside the mechanism).
      {"positions", "positions", "--positions", "training", 12, T::Text, PointField::all, 8,
       [](P p) -> V { return p.train.positions ? to_string(*p.train.positions) : std::string(); },
       [](PointId& p, const V& v) {
         p.train.positions.reset();
         if (!as_text(v).empty()) p.train.positions = parse_position_encoding(as_text(v));
       },
       [](P p) { return fmt::format("positions={}", p.train.positions ? to_string(*p.train.positions) : ""); }, nullptr,
       "sinusoidal | learned | none (added to the embedding) | rope (each layer's q, k rotated) | alibi | "
       "bias[:BUCKETS:MAX_DISTANCE] | shaw[:CLIP] (added to the logits inside the kernels). The default is a training "
       "run's; at the attention level only none (the mechanism alone, as without the option), alibi, bias, shaw and rope "
       "(linear and performer, which rotate their feature maps inside) apply",
       nullptr, 26, true},
      AB_TRAIN_INT("eval_every", "eval_every", "--eval-every", eval_every,
                   "steps between validations (0: ten over the run); the best one's parameters are tested", 27,
                   not_negative),
      AB_TRAIN_INT("eval_examples", "eval", "--eval-examples", eval_examples, "validation examples", 28, at_least_one),
      AB_TRAIN_INT("test_examples", "test", "--test-examples", test_examples, "test examples", 29, at_least_one),
      AB_TRAIN_INT("seed", "seed", "--seed", seed, "seed of the data, the initialisation, dropout and redraws", 13,
                   not_negative),
      // Named only when set.
      {"train_examples", "examples", "--train-examples", "training", 12, T::Int, PointField::training, 8,
       [](P p) -> V { return p.train.train_examples; },
       [](PointId& p, const V& v) { p.train.train_examples = not_negative("--train-examples", as_int(v)); },
       [](P p) { return fmt::format("examples={}", p.train.train_examples); }, nullptr,
       "a fixed training set of this many examples, cycled in epochs of examples/batch steps (0: fresh examples every step)",
       nullptr, 30, true},
      {"stop_at", "stop_at", "--stop-at", "training", 12, T::Text, PointField::training, 8,
       [](P p) -> V { return p.train.stop_at > 0 ? recipe_text(p.train.stop_at) : std::string(); },
       [](PointId& p, const V& v) { p.train.stop_at = as_text(v).empty() ? 0 : unit_interval_closed("--stop-at", as_text(v)); },
       [](P p) { return fmt::format("stop_at={}", recipe_text(p.train.stop_at)); }, nullptr,
       "stop once a validation accuracy reaches this (e.g. 0.99; Zoology's early stop)", nullptr, 31, true},
      {"test_seq", "test_seq", "--test-seq", "training", 12, T::Text, PointField::training, 8,
       [](P p) -> V { return length_list_text(p.train.test_seq); },
       [](PointId& p, const V& v) {
         p.train.test_seq = as_text(v).empty() ? std::vector<int64_t>{} : length_list("--test-seq", as_text(v));
       },
       [](P p) { return fmt::format("test_seq={}", length_list_text(p.train.test_seq)); }, nullptr,
       "also test at these lengths, e.g. 512,1024 (length extrapolation; one value, commas and all)", nullptr, 32, true},
#undef AB_TRAIN_INT
#undef AB_TRAIN_NUMBER
  };
}

bool present(const PointField& f, const PointId& id) { return has_field(f, id); }
// Fields Google Benchmark's entry has of its own, written there instead of under "point".
bool in_entry(const PointField& f) { return std::string(f.key) == "threads"; }
}  // namespace

namespace {
bool in_scope(const PointField& f, const PointId& id) {
  switch (f.scope) {
    case PointField::all: return true;
    case PointField::model: return id.level == Level::model;
    case PointField::real_data: return id.level == Level::model && !id.data_dir.empty();
    case PointField::training: return id.training();
    case PointField::low_precision: return id.dtype != Dtype::f32;
  }
  return false;
}
bool is_set(const PointValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return *i != 0;
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  return !std::get<std::string>(v).empty();
}
}  // namespace

bool has_field(const PointField& f, const PointId& id) {
  return in_scope(f, id) && (!f.named_when_set || is_set(f.get(id)));
}

TaskOptions task_options(const PointId& id) {
  TaskOptions o;
  o.seq = id.shape.N;
  o.data_dir = id.data_dir;
  o.vocab = id.vocab;
  o.kv_pairs = id.kv_pairs;
  o.train_examples = id.train.train_examples;
  return o;
}

const std::vector<PointField>& point_fields() {
  static const std::vector<PointField> fields = make_fields();
  return fields;
}

const PointField& point_field(const std::string& key) {
  for (const auto& f : point_fields())
    if (key == f.key) return f;
  throw std::logic_error("no point field " + key);
}

std::string PointId::name() const {
  std::string n;
  for (const auto& f : point_fields()) {
    if (!present(f, *this)) continue;
    if (f.type == PointFieldType::Params) {
      for (const auto& [k, v] : params.items()) n += "/" + k + ":" + format_param_value(v);
      continue;
    }
    n += fmt::format("{}{}:{}", n.empty() ? "" : "/", f.segment, value_text(f.get(*this)));
  }
  return n;
}

PointId PointId::from_name(const std::string& name) {
  const auto& fields = point_fields();
  auto bad = [&](const std::string& why) { return InvalidInput(fmt::format("point name '{}': {}", name, why)); };
  // Whether a segment of field `after` or later begins at `pos`.
  auto later_segment_at = [&](size_t pos, size_t after) {
    for (size_t j = after; j < fields.size(); ++j)
      if (fields[j].type != PointFieldType::Params && name.compare(pos, std::strlen(fields[j].segment) + 1, std::string(fields[j].segment) + ":") == 0)
        return true;
    return false;
  };
  // A '/' ends a value unless what follows it, up to the next '/', holds no ':' (a directory).
  auto piece_has_colon = [&](size_t pos) {
    const size_t colon = name.find(':', pos);
    return colon != std::string::npos && colon < std::min(name.find('/', pos), name.size());
  };
  PointId id;
  size_t at = 0;  // where the next segment begins
  for (size_t i = 0; i < fields.size() && at < name.size(); ++i) {
    const PointField& f = fields[i];
    if (f.type == PointFieldType::Params) {
      // The mechanism's parameters: segments up to the first later field's (the level's).
      while (at < name.size() && !later_segment_at(at, i + 1)) {
        const size_t end = std::min(name.find('/', at), name.size()), colon = name.find(':', at);
        if (colon == std::string::npos || colon >= end) throw bad(fmt::format("segment '{}' has no ':'", name.substr(at, end - at)));
        id.params.set(name.substr(at, colon - at), name.substr(colon + 1, end - colon - 1));
        at = end + 1;
      }
      continue;
    }
    const std::string head = std::string(f.segment) + ":";
    if (name.compare(at, head.size(), head) != 0) continue;  // not named: its default
    const size_t from = at + head.size();
    size_t end = name.find('/', from);
    while (end != std::string::npos && !piece_has_colon(end + 1)) end = name.find('/', end + 1);
    if (end == std::string::npos) end = name.size();
    const std::string text = name.substr(from, end - from);
    switch (f.type) {
      case PointFieldType::Int: {
        int64_t v = 0;
        const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (ec != std::errc() || ptr != text.data() + text.size()) throw bad(fmt::format("{} '{}' is not an integer", f.segment, text));
        f.set(id, v);
        break;
      }
      case PointFieldType::Flag:
        if (text != "0" && text != "1") throw bad(fmt::format("{} '{}' is not 0 or 1", f.segment, text));
        f.set(id, text == "1");
        break;
      default:
        f.set(id, text);
    }
    at = end + 1;
  }
  if (at < name.size()) throw bad(fmt::format("segment '{}' is not a field, or out of order", name.substr(at, name.find('/', at) - at)));
  if (id.mechanism.empty()) throw bad("it does not begin with attn:NAME");
  return id;
}

void write_point(const PointId& id, nlohmann::json& entry) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : point_fields()) {
    if (!present(f, id)) continue;
    nlohmann::json& into = in_entry(f) ? entry : j;
    if (f.type == PointFieldType::Params) {
      nlohmann::json p = nlohmann::json::object();
      for (const auto& [k, v] : id.params.items()) p[k] = format_param_value(v);
      into[f.key] = p;
      continue;
    }
    std::visit([&](const auto& v) { into[f.key] = v; }, f.get(id));
  }
  entry["point"] = j;
}

namespace {
// A mechanism's parameters in declaration order, each one the file lacks at its default. A
// parameter added to a mechanism takes the default that computes what the mechanism computed
// before it existed (docs/results-format.md), so a file written before then names the same point
// without that segment: with it filled in, the file joins today's points by name (a regression
// baseline still gates the point, `--resume` does not run it again). A parameter the mechanism
// no longer declares, or a mechanism it no longer has, is kept as the file names it.
ParamValues with_declared_defaults(const std::string& mechanism, const ParamValues& from_file) {
  const std::vector<std::string> known = mechanism_names();
  if (std::find(known.begin(), known.end(), mechanism) == known.end()) return from_file;
  // Declaration order, then the file's values over the defaults (set keeps a name's place).
  ParamValues out;
  for (const auto& spec : find_mechanism(mechanism).params) out.set(spec.name, format_param_value(spec.def));
  for (const auto& [k, v] : from_file.items()) out.set(k, v);
  return out;
}
}  // namespace

PointId read_point(const nlohmann::json& entry, const std::string& name, const std::string& where) {
  if (!entry.contains("point")) throw InvalidInput(where + " has no 'point'");
  const nlohmann::json& point = entry.at("point");
  if (!point.is_object()) throw InvalidInput(where + ": 'point' is not an object");
  PointId id;
  auto value_of = [&](const PointField& f) -> const nlohmann::json& {
    const nlohmann::json& from = in_entry(f) ? entry : point;
    if (!from.contains(f.key)) throw InvalidInput(fmt::format("{}{} has no '{}'", where, in_entry(f) ? "" : " point", f.key));
    return from.at(f.key);
  };
  auto wrong = [&](const PointField& f) { return InvalidInput(fmt::format("{} point: '{}' has the wrong type", where, f.key)); };
  // The level first, and whether it is a training run (it has steps): they decide which fields
  // a point has.
  for (const char* first : {"level", "attn"}) {
    const PointField& f = point_field(first);
    const auto& v = value_of(f);
    if (!v.is_string()) throw wrong(f);
    f.set(id, v.get<std::string>());
  }
  if (point.contains("steps")) {
    const PointField& f = point_field("steps");
    if (!point.at("steps").is_number_integer()) throw wrong(f);
    f.set(id, point.at("steps").get<int64_t>());
  }
  // Likewise the fields a point has only by their own value (real data's directory, a dtype
  // other than f32): they are there when the file has them.
  for (const auto& f : point_fields()) {
    if (f.scope != PointField::real_data && f.scope != PointField::low_precision && !f.named_when_set) continue;
    if (!point.contains(f.key)) continue;
    const auto& v = point.at(f.key);
    if (f.type == PointFieldType::Int && v.is_number_integer()) f.set(id, v.get<int64_t>());
    else if (f.type == PointFieldType::Flag && v.is_boolean()) f.set(id, v.get<bool>());
    else if (f.type == PointFieldType::Text && v.is_string()) f.set(id, v.get<std::string>());
    else throw wrong(f);
  }
  for (const auto& f : point_fields()) {
    if (!present(f, id)) continue;
    const auto& v = value_of(f);
    switch (f.type) {
      case PointFieldType::Mechanism:
      case PointFieldType::Text:
        if (!v.is_string()) throw wrong(f);
        f.set(id, v.get<std::string>());
        break;
      case PointFieldType::Int:
        if (!v.is_number_integer()) throw wrong(f);
        f.set(id, v.get<int64_t>());
        break;
      case PointFieldType::Flag:
        if (!v.is_boolean()) throw wrong(f);
        f.set(id, v.get<bool>());
        break;
      case PointFieldType::Params: {
        // In declaration order, as the name lists them (a JSON object is unordered): the
        // segments between the mechanism's and the first field's.
        if (!v.is_object()) throw InvalidInput(where + ": 'params' is not an object");
        const std::string next = std::string(point_field("level").segment) + ":";
        size_t pos = name.find('/');
        while (pos != std::string::npos && name.compare(pos + 1, next.size(), next) != 0) {
          const size_t end = name.find('/', pos + 1);
          const std::string kv = name.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1);
          const std::string k = kv.substr(0, kv.find(':'));
          if (!v.contains(k) || !v.at(k).is_string())
            throw InvalidInput(fmt::format("{}: parameter '{}' of its name is not in its point fields", where, k));
          id.params.set(k, v.at(k).get<std::string>());
          pos = end;
        }
        break;
      }
    }
  }
  return id;
}

void fill_declared_defaults(PointId& id) { id.params = with_declared_defaults(id.mechanism, id.params); }

std::vector<std::string> point_identity_args(const PointId& id) {
  std::vector<std::string> a;
  for (const auto& f : point_fields()) {
    if (!present(f, id) || (f.in_arguments && !f.in_arguments(id))) continue;
    switch (f.type) {
      case PointFieldType::Params:
        for (const auto& [k, v] : id.params.items()) {
          a.push_back(f.option);
          a.push_back(k + "=" + format_param_value(v));
        }
        break;
      case PointFieldType::Flag:
        if (std::get<bool>(f.get(id))) a.push_back(f.option);
        break;
      default:
        a.push_back(f.option);
        a.push_back(value_text(f.get(id)));
    }
  }
  return a;
}

std::string group_title(const PointId& id) {
  std::string out;
  int cluster = 0;
  for (const auto& f : point_fields()) {
    if (f.group_cluster == 0 || !present(f, id)) continue;
    out += (out.empty() ? "" : f.group_cluster == cluster ? " " : " · ") + f.describe(id);
    cluster = f.group_cluster;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> point_columns(const PointId& id) {
  std::map<int, std::pair<std::string, std::vector<const PointField*>>> by_rank;
  for (const auto& f : point_fields()) {
    auto& [title, fields] = by_rank[f.column_rank];
    title = f.column;
    fields.push_back(&f);
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [rank, col] : by_rank) {
    const auto& [title, fields] = col;
    std::string text;
    for (const PointField* f : fields) {
      if (!present(*f, id)) continue;
      // Alone in its column a field shows its value; sharing one, its description ("L=2").
      const std::string t = fields.size() > 1 ? f->describe(id)
                            : f->type == PointFieldType::Params ? f->describe(id)
                                                                 : value_text(f->get(id));
      text += (text.empty() ? "" : " ") + t;
    }
    out.emplace_back(title, text);
  }
  return out;
}

ShortNames short_point_names(const std::vector<std::string>& names) {
  auto segments = [](const std::string& n) {
    std::vector<std::string> s;
    size_t at = 0;
    while (true) {
      const size_t slash = n.find('/', at);
      s.push_back(n.substr(at, slash == std::string::npos ? std::string::npos : slash - at));
      if (slash == std::string::npos) break;
      at = slash + 1;
    }
    return s;
  };
  ShortNames out{"", names};
  if (names.size() < 2) return out;
  std::vector<std::string> shared = segments(names.front());
  for (const auto& n : names) {
    const auto mine = segments(n);
    shared.erase(std::remove_if(shared.begin(), shared.end(),
                                [&](const std::string& s) { return std::find(mine.begin(), mine.end(), s) == mine.end(); }),
                 shared.end());
  }
  for (const auto& s : shared) out.shared += (out.shared.empty() ? "" : "/") + s;
  for (auto& n : out.names) {
    std::string shortened;
    for (const auto& s : segments(n))
      if (std::find(shared.begin(), shared.end(), s) == shared.end()) shortened += (shortened.empty() ? "" : "/") + s;
    if (!shortened.empty()) n = shortened;
  }
  return out;
}

NameFilter::NameFilter(const std::string& regex) : text_(regex) {
  if (regex.empty()) return;
  try {
    re_ = std::make_shared<const std::regex>(regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw InvalidInput(fmt::format("--filter '{}' is not a regular expression: {}", regex, e.what()));
  }
}

bool NameFilter::operator()(const std::string& name) const {
  return !re_ || std::regex_search(name, *static_cast<const std::regex*>(re_.get()));
}

}  // namespace ab
