// The workloads of docs/tasks.md as data sources: each task yields examples of token ids
// and labels of its shape, deterministically from the seed and the example's index (so a batch
// can be generated in parallel and any example regenerated alone), with no download. Tasks with
// a real-data format read it from --data-dir, whole and validated when the task is made.
//
// Token alphabets (ids as the model sees them):
//   copy        0 separator, 1..10 symbols, 11 pad                       (vocab 12)
//   listops     0 pad, 1..10 digits 0..9, 11 [MIN, 12 [MAX, 13 [MED, 14 [SM, 15 ]   (vocab 16)
//   text, retrieval  0 pad, byte b as b + 1                              (vocab 257)
//   image, pathfinder, pathx  grey level 0..255                          (vocab 256)
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ab {

// How the model turns the encoder's rows into the task's prediction: the first row (a learned CLS
// vector's position), the mean of the rows, or a next-token prediction at every row (a causal
// language model).
enum class Pooling { cls, mean, lm };
const char* to_string(Pooling p);  // cls | mean | lm

// The model a task is benchmarked with (LRA's base configs, tasks.md).
struct ModelShape {
  int64_t layers = 0, dmodel = 0, heads = 0, mlp = 0, batch = 0;
  Pooling pooling = Pooling::cls;
};

// Training, validation and test data are disjoint by construction: a generated task draws each
// split from a stream of its own (split_seed), a task with real files reads each split's file or
// its own range of records (split_range).
enum class Split { train, val, test };
const char* to_string(Split s);  // train | val | test
Split parse_split(const std::string& text);  // throws InvalidInput

// The longest example a task makes: 2^28 tokens (1 GiB of int32 ids per example, and per
// document of a pair). Longer ones cannot be generated in memory alongside a batch; `run` bounds
// a model's shapes the same way before anything is allocated (bench/points/grid.cpp).
constexpr int64_t kMaxTaskSeq = int64_t{1} << 28;

struct TaskOptions {
  int64_t seq = 0;  // 0: the task's default length
  Split split = Split::train;
  uint64_t seed = 1;
  std::string data_dir;             // real data, for the tasks that read it
  std::string difficulty = "hard";  // pathfinder, pathx: easy | intermediate | hard
  // Generated tasks with a configurable shape (0: the task's default; a task without the option
  // refuses a value, InvalidInput): the vocabulary (mqar), the key-value pairs per example (mqar).
  int64_t vocab = 0, kv_pairs = 0;
  // The training split as a fixed set of this many examples, cycled in epochs (0: a fresh
  // example at every index). Validation and test are always their own examples.
  int64_t train_examples = 0;
};

struct Example {
  std::vector<int32_t> tokens;   // (N)
  std::vector<int32_t> tokens2;  // retrieval: the second document (N)
  int32_t label = 0;             // class; copy: -1 (next-token prediction)
  std::vector<uint8_t> loss_mask;  // copy: 1 at the separator and the copy
  // Per-position targets of a task whose answer is not the next input token (mqar: the value at
  // its key's query position; induction: the answer at the last position); -1 where nothing is
  // predicted. Empty: next-token prediction where loss_mask says (copy).
  std::vector<int32_t> targets;
  // pathfinder, pathx: the drawn contour map (snake id per pixel, 0 where nothing is drawn;
  // markers belong to their snake) and the pixel indices of the two markers.
  std::vector<int32_t> contour;
  int64_t marker_a = -1, marker_b = -1;
  int32_t depth = 0;  // listops: depth of the expression tree (a single digit has depth 1)
};

// A batch: examples [first, first + size) laid out row after row.
struct Batch {
  int64_t size = 0, seq = 0;
  std::vector<int32_t> tokens, tokens2, labels;
  std::vector<uint8_t> loss_mask;
  std::vector<int32_t> targets;  // (size·seq) when the examples have targets
};

class Task {
 public:
  virtual ~Task() = default;
  // Deterministic in (seed, index).
  virtual Example example(int64_t index) const = 0;
  // The example in a form a person can read: the expression, an excerpt, ASCII art.
  virtual std::string readable(const Example& e) const = 0;
  // "synthetic (in-process generator)" or the real files read and their record count.
  virtual std::string source() const { return "synthetic (in-process generator)"; }
  // Side of the square image for the image tasks, else 0.
  virtual int64_t image_side() const { return 0; }
  int64_t seq() const { return seq_; }
  // Real data, or a generator's fixed training set: the examples in this split (the trainer
  // cycles through them in epochs); 0 for a generator whose examples never repeat.
  virtual int64_t size() const { return 0; }
  // The vocabulary of this instance (a task with a configurable one: its value; else the task's).
  int64_t vocab() const { return vocab_; }
  // The most positions of one example that carry a loss (0: any number, up to every position):
  // the model computes its output layer only there (mqar: the D queries).
  int64_t loss_positions() const { return loss_positions_; }
  // Examples generated in parallel (OpenMP over examples): [first, first + size), or the given ones.
  Batch batch(int64_t first, int64_t size) const;
  Batch batch_of(const std::vector<int64_t>& indices) const;

 protected:
  friend std::unique_ptr<Task> make_task(const std::string& name, const struct TaskOptions& opts);
  int64_t seq_ = 0;
  int64_t vocab_ = 0, loss_positions_ = 0;  // make_task fills vocab_ from TaskInfo when 0
};

// How a task's accuracy is counted: one prediction per example (classifiers), the exact-sequence
// rate (copy: every counted position right), or the share of an example's queries answered
// exactly, averaged over examples (mqar, induction; Zoology's accuracy).
enum class AccuracyKind { per_example, exact_sequence, per_query };

struct TaskInfo {
  std::string name, summary, alphabet;
  int64_t default_seq = 0, vocab = 0, classes = 0;  // classes 0: next-token
  ModelShape model;
  // A causal language model over the tokens (copy): the model is a decoder, `classes` is 0.
  bool next_token = false;
  // Outputs at positions with explicit targets (mqar, induction; `classes` 0, pooling lm) whose
  // answers never follow their query in the input, so the model may be causal or not: a
  // mechanism that cannot be causal is scored on the same task.
  bool causal_optional = false;
  AccuracyKind accuracy = AccuracyKind::per_example;
  // The options of TaskOptions it takes beyond seq and seed ("vocab", "kv_pairs",
  // "train_examples"); make_task refuses the others when they are set.
  std::vector<std::string> options;
  // The most positions of an example that carry a loss at these options (nullptr: any number);
  // the model's compact output layer is sized by it (mqar: D; induction: 1).
  std::function<int64_t(const TaskOptions&)> loss_positions;
  // Two documents per example through one shared encoder (retrieval), the head on
  // [e1, e2, e1*e2, e1-e2].
  bool two_tower = false;
  // What --data-dir is read for, per split ("" when the task has no real source).
  std::string real_data;
  std::function<std::unique_ptr<Task>(const TaskOptions&)> make;
};

const std::vector<TaskInfo>& tasks();
// Whether the task takes an option of TaskOptions beyond seq and seed (TaskInfo::options).
bool task_takes_option(const TaskInfo& t, const std::string& option);
// The pooling in words, for `list tasks`: "CLS", "mean", "causal LM", "CLS per document, ...".
std::string pooling_text(const TaskInfo& t);
// Throws InvalidInput naming the known tasks.
const TaskInfo& find_task(const std::string& name);
std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& opts);

// One entry per file in tasks/.
TaskInfo copy_task_info();
TaskInfo listops_task_info();
TaskInfo text_task_info();
TaskInfo retrieval_task_info();
TaskInfo image_task_info();
TaskInfo pathfinder_task_info();
TaskInfo pathx_task_info();
TaskInfo mqar_task_info();
TaskInfo induction_task_info();

// ---- shared helpers ----
// The seed of a split's generated examples: the training split keeps the run's seed (the data
// the benchmarks have always timed), validation and test get streams of their own.
uint64_t split_seed(uint64_t seed, Split split);
// A split's records [begin, end) of `n` read from one file that holds them all: the first
// 90% train, the next 5% validation, the last 5% test (at least one record each when n >= 3).
std::pair<size_t, size_t> split_range(size_t n, Split split);
// The generator of example `index`: a stream of its own, so examples are independent.
uint64_t example_stream(int64_t index);
// Generated tasks whose examples could repeat across splits (a small alphabet, few random
// choices) keep the splits disjoint by construction: an example belongs to the split its token
// hash falls in (train 18 of 20 buckets, validation and test one each), and a generator draws
// candidates until one falls in its split. `attempt` is the candidate's number.
Split split_of_tokens(const std::vector<int32_t>& tokens);
uint64_t candidate_stream(int64_t index, int64_t attempt);
// How many of a split's examples an evaluation over `count` of them sees: `count`, or all of a
// real split that has fewer (its examples would otherwise repeat).
int64_t evaluated_examples(const Task& task, int64_t count);
// The classes of examples [first, first + evaluated_examples(count)) of a task with `classes`
// classes; `commonest` and its share are what a model answering one class for every input scores.
// Throws InvalidInput when `first` is past the end of a real split.
struct LabelCounts {
  int64_t first = 0, examples = 0;
  std::vector<int64_t> counts;  // (classes)
  int32_t commonest() const;
  double commonest_share() const;  // 0..1
};
LabelCounts label_counts(const Task& task, int64_t classes, int64_t first, int64_t count);
// ListOps: the value of a token sequence (pads ignored); throws InvalidInput when malformed.
int32_t listops_evaluate(const std::vector<int32_t>& tokens);
// ListOps in LRA's spelling, e.g. "[MAX 2 9 [MIN 4 7 ] 0 ]".
std::string listops_spelling(const std::vector<int32_t>& tokens);
// Text tokens back to bytes (pads dropped), non-printable bytes shown as '.'.
std::string text_of_tokens(const std::vector<int32_t>& tokens, size_t max_chars);
// The synthetic text and retrieval documents' vocabulary (tasks/text.cpp): the filler words, and
// the sentiment words whose counts decide a text label.
struct SyntheticWords {
  const std::vector<std::string>& neutral;
  const std::vector<std::string>& positive;
  const std::vector<std::string>& negative;
};
SyntheticWords synthetic_words();
// ListOps wrapped and indented by depth: an operator's arguments on one line when they fit in
// `width` columns, else one per line, two spaces deeper.
std::string listops_layout(const std::vector<int32_t>& tokens, size_t width = 96);
// A grey image as ASCII art, `side` x `side`, shrunk by `step` (the maximum of each block), two
// characters per pixel, and a key of the glyphs.
std::string ascii_art(const std::vector<int32_t>& pixels, int64_t side, int64_t step);
// Writes an 8-bit grey PNG.

void write_png_grey(const std::string& path, const std::vector<int32_t>& pixels, int64_t width, int64_t height);

}  // namespace ab
