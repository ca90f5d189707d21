// A point's result, its status, and the one definition of the result fields that every output
// format (JSON, markdown, CSV) is generated from and every reader reads back.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/points/point.hpp"
#include "tasks/task.hpp"

namespace ab {

// The version of the result file's layout, written into the context as "json_schema_version":
// a reader refuses a file of a later version (it may hold fields this one would misread). 1: the
// layout of attnbench 0.1 (files without the field are read as version 1).
constexpr int kResultSchemaVersion = 1;

// The fixed vocabulary of statuses; error_message in a result file begins with the word.
enum class Status { OK, SKIPPED, OOM, TIMEOUT, CRASHED, FAILED };
const char* to_string(Status s);

struct Repetition {
  double real_s = 0;  // wall time per iteration
  double cpu_s = 0;   // process CPU time per iteration
  int64_t iterations = 0;
  std::optional<double> loss;  // model level: mean loss of this repetition's steps
};

// What a training run (the train verb) measured beyond its step time.
struct TrainResult {
  double accuracy = 0;        // test, with the best-validation parameters (copy: exact-copy rate)
  double final_accuracy = 0;  // test, with the final parameters
  double val_accuracy = 0;    // the best validation accuracy
  double token_accuracy = 0;  // copy: test per-token accuracy (best-validation parameters); else = accuracy
  double eval_loss = 0;       // test loss per prediction (best-validation parameters)
  double train_steps = 0, best_step = 0;
  double train_seconds = 0;   // the training steps alone, over every resumed part
  double data_seconds = 0, eval_seconds = 0, checkpoint_seconds = 0, checkpoint_bytes = 0;
  // Test accuracy at other lengths (train --test-seq), by length: powers of two from
  // kFirstTestSeq to kLastTestSeq, one result field each (accuracy_at_N).
  std::map<int64_t, double> accuracy_at;
};

struct PointResult {
  PointId id;
  std::string label;  // the command that reproduces the point
  Status status = Status::OK;
  std::string message;
  std::vector<Repetition> reps;
  // Adds one clause to the message ("; " between clauses).
  void add_note(const std::string& note) { message += (message.empty() ? "" : "; ") + note; }
  double flops = 0;           // analytic, per call
  // Of the logits the forward pass computes, the fraction that are admissible (mechanisms that
  // score explicit pairs; see Attention::admissible_fraction).
  std::optional<double> admissible_fraction;
  double gemm_gflops = 0;     // GEMM's rate per thread on the point's threads, for peak_fraction
  size_t peak_bytes = 0;      // tracked working memory of the mechanism
  size_t peak_rss_bytes = 0;  // VmHWM over the measured calls
  int64_t rss_delta_bytes = 0;
  std::optional<double> nmse;
  // bf16 points with --error: against the same mechanism in float32 (same parameters, same seed,
  // same inputs): what bf16 costs, apart from the mechanism's own approximation.
  std::optional<double> nmse_f32;
  std::optional<double> instructions;  // per call, counted by callgrind (--instructions)
  // Model level: ms per step spent in each layer type (layer_type_names() order), from the
  // model's own timers over the measured steps.
  std::vector<double> layer_ms;
  std::optional<TrainResult> train;  // training runs
  // Tokens processed per call: the whole sequence, or one new token per sequence in decode; the
  // retrieval model encodes two documents per example.
  int64_t tokens() const {
    if (id.mode == RunMode::decode) return id.shape.B;
    return id.shape.B * id.shape.N * (id.level == Level::model && find_task(id.task).two_tower ? 2 : 1);
  }
};

// Summary statistics of a point's repetitions.
struct TimeStats {
  double median = 0, mean = 0, stddev = 0, min = 0, max = 0;
  double cv() const { return mean > 0 ? stddev / mean : 0; }
};
TimeStats real_stats(const PointResult& r);
TimeStats cpu_stats(const PointResult& r);

// A metric reported for a point: evaluated per repetition (from that repetition's time, `rep`
// set) in JSON, and at the median time in the tables and aggregates (`rep` null).
enum class Better { Higher, Lower, Neither };
struct Field {
  const char* key;     // JSON counter name and CSV column
  const char* header;  // markdown column header (in the display unit)
  int precision;       // digits after the point in tables
  Better better;       // which direction is an improvement (`table` ratios, `compare` gates)
  double display_scale;  // value / display_scale is shown (bytes as MiB, FLOPs as GFLOP)
  std::function<std::optional<double>(const PointResult&, double seconds, const Repetition* rep)> value;
  // How a reader stores the value back: into the result, or into the repetition for a value of
  // each repetition (`rep` is that entry's). Empty for a value derived from others (a rate).
  std::function<void(PointResult&, Repetition* rep, double v)> store;
  std::string format(double v) const;  // in the display unit, for tables
};
const std::vector<Field>& result_fields();
const Field* find_field(const std::string& key);  // nullptr when unknown

}  // namespace ab
