// copy: the synthetic causal copy task (Katharopoulos et al. 2020, tasks.md).
// n symbols uniform in 1..10, n uniform in [N/4, N/2), laid out as [s, 0, s, pad...] to length N
// (0 separator, 11 pad). The loss mask marks the positions of the separator and the copy, the
// only positions the loss and the accuracy count.
#include <fmt/format.h>

#include "core/params.hpp"  // InvalidInput
#include "core/rng.hpp"
#include "tasks/task.hpp"

namespace ab {
namespace {

constexpr int32_t kSeparator = 0, kPad = 11;

class CopyTask final : public Task {
 public:
  CopyTask(const TaskOptions& o) : seed_(o.seed) {
    seq_ = o.seq > 0 ? o.seq : 128;
    if (seq_ < 8) throw InvalidInput(fmt::format("copy: --seq {} is too short; at least 8 (two copies of N/4 symbols and a separator)", seq_));
  }
  Example example(int64_t index) const override {
    Rng rng(seed_, example_stream(index));
    const int64_t lo = seq_ / 4, hi = seq_ / 2;  // n in [lo, hi)
    const int64_t n = lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(std::max<int64_t>(1, hi - lo))));
    Example e;
    e.label = -1;
    e.tokens.assign(static_cast<size_t>(seq_), kPad);
    e.loss_mask.assign(static_cast<size_t>(seq_), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t s = 1 + static_cast<int32_t>(rng.below(10));
      e.tokens[static_cast<size_t>(i)] = s;
      e.tokens[static_cast<size_t>(n + 1 + i)] = s;
    }
    e.tokens[static_cast<size_t>(n)] = kSeparator;
    for (int64_t i = n; i <= 2 * n; ++i) e.loss_mask[static_cast<size_t>(i)] = 1;
    return e;
  }
  std::string readable(const Example& e) const override {
    std::string s;
    for (size_t i = 0; i < e.tokens.size(); ++i) {
      const int32_t t = e.tokens[i];
      if (t == kPad) break;
      s += t == kSeparator ? "| " : fmt::format("{} ", t);
    }
    return s + fmt::format("(+{} pad)", std::count(e.tokens.begin(), e.tokens.end(), kPad));
  }

 private:
  uint64_t seed_;
};

}  // namespace

TaskInfo copy_task_info() {
  TaskInfo t;
  t.name = "copy";
  t.summary = "causal copy: [s, 0, s, pad...], loss on the separator and the copy";
  t.alphabet = "0 separator, 1..10 symbols, 11 pad";
  t.default_seq = 128;
  t.vocab = 12;
  t.classes = 0;
  t.model = ModelShape{4, 256, 8, 1024, 64, Pooling::lm};
  t.next_token = true;
  t.make = [](const TaskOptions& o) { return std::make_unique<CopyTask>(o); };
  return t;
}

}  // namespace ab
