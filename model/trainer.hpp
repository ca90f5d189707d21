// Training to accuracy: the loop around TransformerModel::train_step that the `train` verb runs.
//
//   for step s = 1 .. steps:
//     1. the training batch: examples (s-1) B .. s B - 1 of the train split (real data: a fresh
//        seeded permutation of the split each epoch)
//     2. the learning rate of the schedule at s; train_step (redraws, dropout, backward,
//        clipping, AdamW)
//     3. every eval_every steps and at the last: the fixed validation set, without dropout; the
//        best validation accuracy's parameters are kept
//     4. every checkpoint_every steps (and when interrupted): the whole state, atomically
//   then the test set, once with the best-validation parameters (`accuracy`) and once with the
//   final ones.
//
// Everything random is a function of (seed, step) or (seed, split, example): the data, the
// epochs' permutations, the dropout masks and the mechanisms' redraws. A checkpoint therefore
// holds no generator state, and a run resumed from one at the same thread count continues bit for
// bit (parameters and the logged losses; wall-clock fields differ).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/transformer.hpp"
#include "tasks/task.hpp"

namespace ab {

// Learning-rate schedules, as the LRA code and its PyTorch ports use them (s from 1):
//   constant             lr
//   linear-warmup-rsqrt  lr min(1, s / warmup) / sqrt(max(s, warmup))   (LRA; lr is its "base")
//   cosine               lr s / warmup during warmup, then lr (1 + cos(pi (s - warmup) / (steps - warmup))) / 2
//   cosine:H             the same over H steps instead of the run's (Zoology's cosine over its epoch limit,
//                        of which a run capped earlier, or stopped early, sees the start)
//   onecycle             PyTorch's OneCycleLR, linear annealing, pct_start = warmup / steps:
//                        from lr / 25 up to lr at step warmup, then down to lr / 25 / 1e4 at the end
//   step:S:F             lr up to step S, lr F after it ("Transformers are RNNs": 1e-3, then 1e-4)
struct Schedule {
  enum Kind { constant, linear_warmup_rsqrt, cosine, onecycle, step } kind = constant;
  double lr = 1e-4;
  int64_t warmup = 0, steps = 1;
  int64_t decay_at = 0;
  double decay_factor = 1;
  int64_t horizon = 0;  // cosine:H: the steps the cosine spans (0: the run's)
  double at(int64_t s) const;
  // The shape a spelling names ("onecycle", "step:3000:0.1", "cosine:31250"; lr, warmup and
  // steps left as they are); throws InvalidInput naming the allowed spellings.
  static Schedule parse(const std::string& text);
  // This shape for a run of `steps` at peak `lr` with `warmup` steps; throws InvalidInput when
  // the shape needs what the run lacks (a warm-up, a cosine horizon not shorter than the warm-up).
  Schedule for_run(double lr, int64_t warmup, int64_t steps) const;
  static Schedule parse(const std::string& text, double lr, int64_t warmup, int64_t steps) {
    return parse(text).for_run(lr, warmup, steps);
  }
  // The canonical spelling of the shape: parse(name()) is this shape ("step:S:F" with F written).
  std::string name() const;
};

struct TrainConfig {
  std::string task;
  TaskOptions data;  // seq, seed, data directory, difficulty (the split is set per use)
  ModelConfig model;  // shape, mechanism, dropout, positions, clipping, AdamW's settings
  Schedule schedule;
  int64_t steps = 1;
  int64_t eval_every = 0;  // 0: only at the end
  int64_t eval_examples = 1000, test_examples = 2000;
  int64_t log_every = 10;
  uint64_t seed = 1;
  std::string identity;  // the point's name; a checkpoint of another point is refused
  // The names of this run in another --dtype. Their checkpoints are refused with a hint, or, with
  // convert_dtype, continued in this run's dtype: master weights and AdamW's moments are float32
  // in every dtype, so the state carries over as it is (bf16 copies are made per step).
  std::vector<std::string> other_dtype_identities;
  bool convert_dtype = false;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // 0: only when interrupted or finished
  double stop_at = 0;  // > 0: stop once a validation accuracy reaches it (Zoology's early stop)
  // Lengths the best-validation parameters are also tested at, each by a model of that length
  // sharing them (length extrapolation); a length the trained tensors do not fit is reported so.
  std::vector<int64_t> test_seqs;
};

// The test accuracy at another length (TrainConfig::test_seqs): measured, or why it cannot be.
struct LengthResult {
  int64_t seq = 0;
  std::optional<double> accuracy;
  std::string why_not;
};

// One evaluation of a set: loss per prediction, accuracy (classifiers: per example; copy: the
// exact-copy rate over whole sequences; mqar, induction: the share of an example's queries
// answered exactly, averaged over examples) and the per-position accuracy of language models.
struct EvalResult {
  double loss = 0, accuracy = 0, token_accuracy = 0;
  int64_t examples = 0;
};

// A line of the learning curve: a logged step (loss averaged over the steps since the last line)
// or an evaluation.
struct CurvePoint {
  int64_t step = 0, samples = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, elapsed_s = 0;
  std::optional<EvalResult> val;
};

struct TrainOutcome {
  EvalResult test_best, test_final;  // on the best-validation and on the final parameters
  double best_val_accuracy = 0;
  int64_t best_step = 0;
  EvalResult last_val;
  int64_t steps_done = 0;
  double train_seconds = 0;  // train steps only (batch ready to update done), not paused ones
  int64_t paused_steps = 0;  // steps the process was stopped and continued in (not in train_seconds)
  double data_seconds = 0, eval_seconds = 0, checkpoint_seconds = 0;
  int64_t checkpoints = 0, checkpoint_bytes = 0;
  size_t peak_bytes = 0;  // tracked: the training arena, the best copy, the evaluation sets
  bool interrupted = false;
  bool resumed = false;
  int64_t resumed_at = 0;
  std::string converted_from;  // the checkpoint's run, when convert_dtype continued another dtype's
  bool stopped_early = false;  // a validation accuracy reached stop_at at step steps_done
  std::vector<LengthResult> at_lengths;
};

class Trainer {
 public:
  // Validates and builds the model (no allocation of data or parameters yet); throws InvalidInput.
  explicit Trainer(TrainConfig c);
  ~Trainer();
  // Runs to the last step, from the checkpoint when `resume` (it must exist and match). `curve`
  // gets every log line and evaluation as it happens; `interrupt` stops the run after the
  // current step (with a checkpoint when there is a directory). Throws InvalidInput for a
  // mismatched or corrupt checkpoint.
  TrainOutcome run(bool resume, const std::function<void(const CurvePoint&)>& curve,
                   const std::atomic<bool>* interrupt);
  const TransformerModel& model() const { return *model_; }
  const TrainConfig& config() const { return config_; }
  // The tracked memory a run declares: the model's, the best-parameters copy, the evaluation
  // batches' token buffers are inside the model (evaluation reuses its arena).
  size_t working_bytes() const;

 private:
  struct State;
  EvalResult evaluate(Task& task, int64_t count) { return evaluate(*model_, task, count); }
  EvalResult evaluate(TransformerModel& model, Task& task, int64_t count);
  std::vector<LengthResult> test_at_lengths();
  Batch training_batch(int64_t step);
  void save_checkpoint(const State& st, TrainOutcome& out);
  void load_checkpoint(State& st);

  TrainConfig config_;
  std::unique_ptr<TransformerModel> model_;
  std::unique_ptr<Task> train_, val_, test_;
  std::vector<int64_t> order_;  // real data: the current epoch's permutation
  int64_t order_epoch_ = -1;
};

// The checkpoint file of a run's directory, and its format's version.
std::string checkpoint_path(const std::string& dir);
constexpr int kCheckpointVersion = 2;  // 2: the checksum covers the header too (1 is still read)
// Creates the checkpoint directory DIR where missing and checks that its checkpoint file, if any,
// is a regular file: InvalidInput naming the cause before a run starts.
void check_checkpoint_directory(const std::string& dir);

}  // namespace ab
