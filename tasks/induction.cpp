// induction: the induction-heads task of the Mamba paper's synthetic experiments (Gu & Dao 2023,
// section 4.1.2 and Table 11): a random sequence over a small vocabulary holds one trigger token
// somewhere; the token after it must be produced at the end, where the trigger comes again.
//
//   vocabulary 16: 0 the trigger, 1..15 ordinary tokens
//   positions 0 .. N-2: ordinary tokens, uniform, except the trigger at one uniform position
//                       p in [0, N-3] (the answer, tokens[p+1], is ordinary)
//   position N-1: the trigger again; its target is tokens[p+1] (-1 everywhere else)
//
// Fresh examples every step (the Mamba setup), one prediction per example (accuracy: its share of
// right answers). A model trained at one N is tested at others (`train --test-seq`): what a
// position encoding lets it carry over. Splits are disjoint by construction (split_of_tokens).
#include <fmt/format.h>

#include "core/params.hpp"  // InvalidInput
#include "core/rng.hpp"
#include "tasks/task.hpp"

namespace ab {
namespace {

constexpr int32_t kTrigger = 0, kOrdinary = 15;

class InductionTask final : public Task {
 public:
  explicit InductionTask(const TaskOptions& o) : seed_(o.seed), split_(o.split) {
    seq_ = o.seq > 0 ? o.seq : 256;
    if (seq_ < 8) throw InvalidInput(fmt::format("induction: --seq {} is too short; at least 8", seq_));
    loss_positions_ = 1;
  }
  Example example(int64_t index) const override {
    for (int64_t attempt = 0;; ++attempt) {
      Rng rng(seed_, candidate_stream(index, attempt));
      Example e;
      e.label = -1;
      e.tokens.resize(static_cast<size_t>(seq_));
      for (auto& t : e.tokens) t = 1 + static_cast<int32_t>(rng.below(kOrdinary));
      const int64_t p = static_cast<int64_t>(rng.below(static_cast<uint64_t>(seq_ - 2)));
      e.tokens[static_cast<size_t>(p)] = kTrigger;
      e.tokens[static_cast<size_t>(seq_ - 1)] = kTrigger;
      e.targets.assign(static_cast<size_t>(seq_), -1);
      e.targets[static_cast<size_t>(seq_ - 1)] = e.tokens[static_cast<size_t>(p + 1)];
      if (split_of_tokens(e.tokens) == split_) return e;
    }
  }
  std::string readable(const Example& e) const override {
    std::string s;
    for (size_t i = 0; i < e.tokens.size(); ++i) {
      if (i == 48 && e.tokens.size() > 64) {
        s += fmt::format("... ({} more) ", e.tokens.size() - 56);
        i = e.tokens.size() - 8;
      }
      s += e.tokens[i] == kTrigger ? "[T] " : fmt::format("{} ", e.tokens[i]);
    }
    size_t p = 0;
    while (e.tokens[p] != kTrigger) ++p;
    return s + fmt::format("\ntrigger at {}, answer {} (the token after it)", p, e.targets.back());
  }

 private:
  uint64_t seed_;
  Split split_;
};

}  // namespace

TaskInfo induction_task_info() {
  TaskInfo t;
  t.name = "induction";
  t.summary = "induction heads (Mamba): recall the token that followed the trigger, at the sequence's end";
  t.alphabet = "0 trigger, 1..15 tokens";
  t.default_seq = 256;
  t.vocab = 16;
  t.classes = 0;
  // The Mamba paper's attention models: 2 layers (137K parameters); batch 8.
  t.model = ModelShape{2, 64, 4, 256, 8, Pooling::lm};
  t.causal_optional = true;
  t.accuracy = AccuracyKind::per_query;
  t.options = {"train_examples"};
  t.loss_positions = [](const TaskOptions&) -> int64_t { return 1; };
  t.make = [](const TaskOptions& o) { return std::make_unique<InductionTask>(o); };
  return t;
}

}  // namespace ab
