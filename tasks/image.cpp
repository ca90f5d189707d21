// image: CIFAR-10 as a sequence of grey pixels (LRA; tasks.md).
// Real data: the CIFAR-10 binary batches DIR/data_batch_*.bin (3073-byte records: label, then
// 1024 red, 1024 green, 1024 blue bytes, row-major), read whole and validated when the task is
// made, converted to grey as ITU-R 601 luma, round(0.299 R + 0.587 G + 0.114 B) (what
// tf.image.rgb_to_grayscale computes).
// Synthetic data: 32x32 grey images of 10 procedurally drawn shape classes (disc, square,
// triangle, ring, horizontal bar, vertical bar, cross, diagonal, two discs, frame) at a random
// place, size and contrast, over a random background with Gaussian noise.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/params.hpp"  // InvalidInput
#include "core/rng.hpp"
#include "tasks/task.hpp"

namespace ab {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kRecord = 3073, kSide = 32;

// Is (x, y) inside shape `cls` centred at (cx, cy) with size r (pixels)?
bool inside(int cls, double x, double y, double cx, double cy, double r) {
  const double dx = x - cx, dy = y - cy, d = std::hypot(dx, dy);
  const double t = std::max(1.0, r / 4);  // stroke width
  switch (cls) {
    case 0: return d <= r;                                                   // disc
    case 1: return std::abs(dx) <= r && std::abs(dy) <= r;                   // square
    case 2: return dy <= r && dy >= -r && std::abs(dx) <= (dy + r) / 2;     // triangle, apex up
    case 3: return d <= r && d >= r - t;                                     // ring
    case 4: return std::abs(dy) <= t && std::abs(dx) <= r;                   // horizontal bar
    case 5: return std::abs(dx) <= t && std::abs(dy) <= r;                   // vertical bar
    case 6: return (std::abs(dx) <= t / 2 + 0.5 && std::abs(dy) <= r) || (std::abs(dy) <= t / 2 + 0.5 && std::abs(dx) <= r);  // cross
    case 7: return std::abs(dx - dy) <= t && std::abs(dx) <= r;              // diagonal
    case 8: return std::hypot(dx - r / 2, dy) <= r / 2.5 || std::hypot(dx + r / 2, dy) <= r / 2.5;  // two discs
    default: return std::max(std::abs(dx), std::abs(dy)) <= r && std::max(std::abs(dx), std::abs(dy)) >= r - t;  // frame
  }
}

class ImageTask final : public Task {
 public:
  ImageTask(const TaskOptions& o) : seed_(o.seed) {
    seq_ = o.seq > 0 ? o.seq : kSide * kSide;
    if (seq_ != kSide * kSide) throw InvalidInput(fmt::format("image: --seq must be 1024 (32x32 pixels), not {}", seq_));
    if (!o.data_dir.empty()) load(o.data_dir);
  }
  Example example(int64_t index) const override {
    Example e;
    if (!labels_.empty()) {
      const size_t r = static_cast<size_t>(index % static_cast<int64_t>(labels_.size()));
      e.label = labels_[r];
      e.tokens.assign(pixels_.begin() + static_cast<int64_t>(r) * seq_, pixels_.begin() + static_cast<int64_t>(r + 1) * seq_);
      return e;
    }
    Rng rng(seed_, example_stream(index));
    e.label = static_cast<int32_t>(rng.below(10));
    const double r = rng.uniform(5.0, 11.0);
    const double cx = rng.uniform(r + 1, kSide - r - 2), cy = rng.uniform(r + 1, kSide - r - 2);
    const double bg = rng.uniform(0, 100), fg = rng.uniform(150, 255);
    e.tokens.resize(static_cast<size_t>(seq_));
    for (int64_t y = 0; y < kSide; ++y)
      for (int64_t x = 0; x < kSide; ++x) {
        const double v = (inside(e.label, double(x), double(y), cx, cy, r) ? fg : bg) + 12.0 * rng.normal();
        e.tokens[static_cast<size_t>(y * kSide + x)] = static_cast<int32_t>(std::clamp(std::lround(v), 0L, 255L));
      }
    return e;
  }
  std::string readable(const Example& e) const override { return ascii_art(e.tokens, kSide, 1); }
  std::string source() const override {
    return labels_.empty() ? Task::source() : fmt::format("real: {} ({} images)", files_, labels_.size());
  }
  int64_t image_side() const override { return kSide; }

 private:
  void load(const std::string& dir) {
    std::vector<fs::path> paths;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string n = entry.path().filename().string();
      if (n.rfind("data_batch_", 0) == 0 && entry.path().extension() == ".bin") paths.push_back(entry.path());
    }
    if (ec) throw InvalidInput(fmt::format("{}: cannot read the directory ({})", dir, ec.message()));
    if (paths.empty()) throw InvalidInput(fmt::format("{}: no CIFAR-10 batches (data_batch_*.bin)", dir));
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      std::ifstream in(p, std::ios::binary);
      if (!in) throw InvalidInput(fmt::format("{}: cannot open", p.string()));
      std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const int64_t n = static_cast<int64_t>(bytes.size());
      if (n == 0) throw InvalidInput(fmt::format("{}: empty", p.string()));
      if (n % kRecord != 0)
        throw InvalidInput(fmt::format("{}: record {} is truncated ({} of {} bytes)", p.string(), n / kRecord + 1, n % kRecord, kRecord));
      for (int64_t r = 0; r < n / kRecord; ++r) {
        const unsigned char* rec = bytes.data() + r * kRecord;
        if (rec[0] > 9) throw InvalidInput(fmt::format("{}: record {} has label {}, expected 0-9", p.string(), r + 1, rec[0]));
        labels_.push_back(rec[0]);
        for (int64_t i = 0; i < 1024; ++i) {
          const int v = (299 * rec[1 + i] + 587 * rec[1 + 1024 + i] + 114 * rec[1 + 2048 + i] + 500) / 1000;
          pixels_.push_back(v);
        }
      }
      files_ += (files_.empty() ? "" : ", ") + p.string();
    }
  }
  uint64_t seed_;
  std::string files_;
  std::vector<int32_t> labels_, pixels_;
};

}  // namespace

TaskInfo image_task_info() {
  TaskInfo t;
  t.name = "image";
  t.summary = "32x32 grey images, 10 classes (CIFAR-10 in LRA), pixels row-major";
  t.alphabet = "grey levels 0..255";
  t.default_seq = 1024;
  t.vocab = 256;
  t.classes = 10;
  t.model = ModelShape{1, 32, 1, 64, 256, Pooling::mean};
  t.real_data = "DIR/data_batch_*.bin: CIFAR-10 binary batches";
  t.make = [](const TaskOptions& o) { return std::make_unique<ImageTask>(o); };
  return t;
}

}  // namespace ab
