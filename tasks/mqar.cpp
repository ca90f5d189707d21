// mqar: multi-query associative recall, the generator of Zoology (Arora, Eyuboglu et al. 2023,
// HazyResearch/zoology, zoology/data/multiquery_ar.py), as its Figure 2 configures it (filler 0).
//
//   vocabulary V (default 8192): keys from [1, V/2), values from [V/2, V), each drawn without
//   replacement within an example; D pairs (default N/16).
//   positions 0 .. 2D-1: k1 v1 k2 v2 ... kD vD
//   positions 2D ..     : each key once more, at 2D + 2·g_j, the gaps g_j drawn without replacement
//                         from [0, (N - 2D) / 2) with p(g) ∝ a·(g+1)^(a-1), a = 0.01 (a power law:
//                         most queries come soon after the pairs, a few far); 0 everywhere else.
//   target at a query's position: the value paired with its key (-1 elsewhere). The value never
//   follows its query in the input, so a non-causal model sees nothing a causal one does not.
//
// Accuracy is the share of an example's D queries answered exactly (argmax over all V), averaged
// over examples, as Zoology computes it; the model's output layer runs at the D query positions
// only (Task::loss_positions). Splits are disjoint by construction (split_of_tokens): a generator
// draws candidates until one falls in its split's hash buckets.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/params.hpp"  // InvalidInput
#include "core/rng.hpp"
#include "tasks/task.hpp"

namespace ab {
namespace {

constexpr int64_t kDefaultVocab = 8192, kMaxVocab = int64_t{1} << 20;
constexpr double kPowerA = 0.01;

class MqarTask final : public Task {
 public:
  explicit MqarTask(const TaskOptions& o) : seed_(o.seed), split_(o.split) {
    seq_ = o.seq > 0 ? o.seq : 64;
    vocab_ = o.vocab > 0 ? o.vocab : kDefaultVocab;
    pairs_ = o.kv_pairs > 0 ? o.kv_pairs : std::max<int64_t>(1, seq_ / 16);
    if (seq_ % 2) throw InvalidInput(fmt::format("mqar: --seq {} is odd; queries sit at even offsets, so N is even", seq_));
    if (4 * pairs_ > seq_)
      throw InvalidInput(fmt::format("mqar: {} key-value pairs need N >= {} (2D tokens of pairs, then D query slots of two), got {}",
                                     pairs_, 4 * pairs_, seq_));
    if (vocab_ > kMaxVocab || vocab_ / 2 - 1 < pairs_)
      throw InvalidInput(fmt::format("mqar: --vocab {} must hold {} distinct keys in [1, V/2) and values in [V/2, V), and "
                                     "be at most {}",
                                     vocab_, pairs_, kMaxVocab));
    loss_positions_ = pairs_;
    size_ = o.split == Split::train ? o.train_examples : 0;
    // The gap distribution over the query slots: p(g) ∝ a (g + 1)^(a - 1).
    const int64_t space = (seq_ - 2 * pairs_) / 2;
    for (int64_t g = 0; g < space; ++g) weights_.push_back(kPowerA * std::pow(static_cast<double>(g + 1), kPowerA - 1));
  }

  Example example(int64_t index) const override {
    if (size_ > 0 && index >= size_) index %= size_;  // a fixed training set: the index cycles
    for (int64_t attempt = 0;; ++attempt) {
      Example e = candidate(index, attempt);
      if (split_of_tokens(e.tokens) == split_) return e;
    }
  }

  std::string readable(const Example& e) const override {
    std::string pairs, queries;
    for (int64_t j = 0; j < pairs_; ++j)
      pairs += fmt::format("{}{}->{}", j ? " " : "", e.tokens[static_cast<size_t>(2 * j)], e.tokens[static_cast<size_t>(2 * j + 1)]);
    for (int64_t n = 2 * pairs_; n < seq_; ++n)
      if (e.targets[static_cast<size_t>(n)] >= 0)
        queries += fmt::format("{}@{}: {} (answer {})", queries.empty() ? "" : ", ", n, e.tokens[static_cast<size_t>(n)],
                               e.targets[static_cast<size_t>(n)]);
    return fmt::format("pairs  {}\nqueries {}\n(V = {}, D = {}, filler 0 elsewhere)", pairs, queries, vocab_, pairs_);
  }
  std::string source() const override {
    return fmt::format("synthetic (in-process generator, V = {}, D = {}{})", vocab_, pairs_,
                       size_ ? fmt::format(", a fixed training set of {}", size_) : "");
  }
  int64_t size() const override { return size_; }

 private:
  // D distinct integers of [lo, hi), in draw order.
  static std::vector<int32_t> distinct(Rng& rng, int64_t count, int64_t lo, int64_t hi) {
    std::vector<int32_t> out;
    while (static_cast<int64_t>(out.size()) < count) {
      const auto x = static_cast<int32_t>(lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo))));
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    }
    return out;
  }

  Example candidate(int64_t index, int64_t attempt) const {
    Rng rng(seed_, candidate_stream(index, attempt));
    const std::vector<int32_t> keys = distinct(rng, pairs_, 1, vocab_ / 2), values = distinct(rng, pairs_, vocab_ / 2, vocab_);
    // The gaps: D draws without replacement, each from the weights of the slots still free.
    std::vector<double> w = weights_;
    std::vector<int64_t> gaps;
    for (int64_t j = 0; j < pairs_; ++j) {
      double total = 0;
      for (double x : w) total += x;
      double u = rng.uniform() * total;
      int64_t g = 0, last = 0;
      for (; g < static_cast<int64_t>(w.size()); ++g) {
        if (w[static_cast<size_t>(g)] == 0) continue;  // taken
        last = g;
        if (u < w[static_cast<size_t>(g)]) break;
        u -= w[static_cast<size_t>(g)];
      }
      if (g == static_cast<int64_t>(w.size())) g = last;  // rounding at the end of the range
      gaps.push_back(g);
      w[static_cast<size_t>(g)] = 0;
    }
    Example e;
    e.label = -1;
    e.tokens.assign(static_cast<size_t>(seq_), 0);
    e.targets.assign(static_cast<size_t>(seq_), -1);
    for (int64_t j = 0; j < pairs_; ++j) {
      e.tokens[static_cast<size_t>(2 * j)] = keys[static_cast<size_t>(j)];
      e.tokens[static_cast<size_t>(2 * j + 1)] = values[static_cast<size_t>(j)];
      const size_t at = static_cast<size_t>(2 * pairs_ + 2 * gaps[static_cast<size_t>(j)]);
      e.tokens[at] = keys[static_cast<size_t>(j)];
      e.targets[at] = values[static_cast<size_t>(j)];
    }
    return e;
  }

  uint64_t seed_;
  Split split_;
  int64_t pairs_ = 0, size_ = 0;
  std::vector<double> weights_;
};

}  // namespace

TaskInfo mqar_task_info() {
  TaskInfo t;
  t.name = "mqar";
  t.summary = "multi-query associative recall (Zoology): D key-value pairs, then each key queried once; predict its value";
  t.alphabet = "0 filler, keys 1..V/2-1, values V/2..V-1 (V = --vocab, default 8192)";
  t.default_seq = 64;
  t.vocab = kDefaultVocab;
  t.classes = 0;
  // Zoology's Figure 2 model: 2 layers, no MLP, one head; d_model 64..512, batch 512 (N 64, 128).
  t.model = ModelShape{2, 64, 1, 0, 64, Pooling::lm};
  t.causal_optional = true;
  t.accuracy = AccuracyKind::per_query;
  t.options = {"vocab", "kv_pairs", "train_examples"};
  t.loss_positions = [](const TaskOptions& o) { return o.kv_pairs > 0 ? o.kv_pairs : std::max<int64_t>(1, (o.seq > 0 ? o.seq : 64) / 16); };
  t.make = [](const TaskOptions& o) { return std::make_unique<MqarTask>(o); };
  return t;
}

}  // namespace ab
