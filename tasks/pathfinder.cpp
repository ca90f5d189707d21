// pathfinder (32x32) and pathx (128x128): are two markers joined by one contour? (Linsley et al.
// 2018, as used by LRA; tasks.md). Generated in-process.
// A snake is a chain of `contour_length` paddles, straight strokes of side/16 pixels whose
// direction turns by at most 30 degrees from one paddle to the next; strokes are rasterised at
// half-pixel steps, so a snake is one 8-connected set of pixels. Snakes keep one pixel of clear
// space from every other snake (they never touch, so connectivity is exactly snake identity).
// Positive: both markers (discs) sit on the two ends of one snake, and a second snake of the
// same length has none. Negative: each of two snakes of that length carries one marker at an
// end. Then distractor snakes of half the length, as many as fit (up to 2 at 32x32, 12 at
// 128x128). Labels are a fair coin per example. Difficulty: contour length 6 (easy), 9
// (intermediate), 14 (hard, LRA's default). The generator keeps the contour map (snake id per
// pixel) so tests can check the label by flood fill.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/params.hpp"  // InvalidInput
#include "core/rng.hpp"
#include "tasks/task.hpp"

namespace ab {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kMaxTurn = kPi / 6;

int contour_length(const std::string& difficulty, const std::string& task) {
  if (difficulty == "easy") return 6;
  if (difficulty == "intermediate") return 9;
  if (difficulty == "hard") return 14;
  throw InvalidInput(fmt::format("{}: unknown difficulty '{}'; known: easy (6 paddles), intermediate (9), hard (14)", task, difficulty));
}

class PathfinderTask final : public Task {
 public:
  PathfinderTask(const TaskOptions& o, const std::string& name, int64_t side)
      : seed_(o.seed), name_(name), side_(side), length_(contour_length(o.difficulty, name)) {
    seq_ = o.seq > 0 ? o.seq : side * side;
    if (seq_ != side * side)
      throw InvalidInput(fmt::format("{}: --seq must be {} ({}x{} pixels), not {}", name, side * side, side, side, seq_));
    paddle_ = static_cast<double>(side) / 16.0;
    marker_radius_ = side >= 64 ? 2 : 1;
    distractors_ = side >= 64 ? 12 : 2;
  }

  Example example(int64_t index) const override {
    Rng rng(seed_, example_stream(index));
    Example e;
    e.label = static_cast<int32_t>(rng.below(2));
    const size_t n = static_cast<size_t>(side_ * side_);
    while (true) {
      e.contour.assign(n, 0);
      e.tokens.assign(n, 0);
      int64_t ends[2][2];
      // Two long snakes: the first carries both markers (positive) or one (negative); the
      // second carries none (positive) or the other (negative).
      if (!place(rng, e, 1, length_, ends[0]) || !place(rng, e, 2, length_, ends[1])) continue;
      e.marker_a = ends[0][0];
      e.marker_b = e.label ? ends[0][1] : ends[1][0];
      if (!mark(e, e.marker_a, 1) || !mark(e, e.marker_b, e.label ? 1 : 2)) continue;
      for (int d = 0; d < distractors_; ++d) {
        int64_t unused[2];
        place(rng, e, 3 + d, std::max(2, length_ / 2), unused);
      }
      return e;
    }
  }

  std::string readable(const Example& e) const override {
    std::vector<int32_t> art = e.tokens;
    return ascii_art(art, side_, side_ > 64 ? 4 : 1);
  }
  int64_t image_side() const override { return side_; }

 private:
  bool clear_of_others(const Example& e, int64_t x, int64_t y, int32_t id) const {
    for (int64_t dy = -1; dy <= 1; ++dy)
      for (int64_t dx = -1; dx <= 1; ++dx) {
        const int64_t xx = x + dx, yy = y + dy;
        if (xx < 0 || yy < 0 || xx >= side_ || yy >= side_) continue;
        const int32_t c = e.contour[static_cast<size_t>(yy * side_ + xx)];
        if (c != 0 && c != id) return false;
      }
    return true;
  }

  // Draws snake `id` of `paddles` paddles where it fits; its two end pixels go to ends[0..1].
  bool place(Rng& rng, Example& e, int32_t id, int paddles, int64_t ends[2]) const {
    const double margin = marker_radius_ + 1;
    std::vector<int64_t> pixels;
    for (int attempt = 0; attempt < 100; ++attempt) {
      pixels.clear();
      double x = rng.uniform(margin, double(side_ - 1) - margin), y = rng.uniform(margin, double(side_ - 1) - margin);
      double angle = rng.uniform(0, 2 * kPi);
      bool ok = true;
      auto add = [&](double px, double py) {
        const int64_t ix = std::lround(px), iy = std::lround(py);
        const int64_t p = iy * side_ + ix;
        if (pixels.empty() || pixels.back() != p) pixels.push_back(p);
      };
      add(x, y);
      for (int k = 0; k < paddles && ok; ++k) {
        if (k > 0) angle += rng.uniform(-kMaxTurn, kMaxTurn);
        const double nx = x + paddle_ * std::cos(angle), ny = y + paddle_ * std::sin(angle);
        if (nx < margin || ny < margin || nx > double(side_ - 1) - margin || ny > double(side_ - 1) - margin) {
          ok = false;
          break;
        }
        const int steps = static_cast<int>(std::ceil(paddle_ * 2));
        for (int s = 1; s <= steps; ++s) add(x + (nx - x) * s / steps, y + (ny - y) * s / steps);
        x = nx;
        y = ny;
      }
      if (!ok) continue;
      for (int64_t p : pixels) ok = ok && clear_of_others(e, p % side_, p / side_, id);
      if (!ok) continue;
      const int32_t grey = 100 + static_cast<int32_t>(rng.below(101));  // markers (255) stand out
      for (int64_t p : pixels) {
        e.contour[static_cast<size_t>(p)] = id;
        e.tokens[static_cast<size_t>(p)] = grey;
      }
      ends[0] = pixels.front();
      ends[1] = pixels.back();
      return true;
    }
    return false;
  }

  // A marker disc at pixel p, part of snake id; false when it would touch another snake.
  bool mark(Example& e, int64_t p, int32_t id) const {
    const int64_t cx = p % side_, cy = p / side_, r = marker_radius_;
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t y = cy - r; y <= cy + r; ++y)
        for (int64_t x = cx - r; x <= cx + r; ++x) {
          if ((x - cx) * (x - cx) + (y - cy) * (y - cy) > r * r + r) continue;
          if (pass == 0) {
            if (x < 0 || y < 0 || x >= side_ || y >= side_ || !clear_of_others(e, x, y, id)) return false;
          } else {
            e.contour[static_cast<size_t>(y * side_ + x)] = id;
            e.tokens[static_cast<size_t>(y * side_ + x)] = 255;
          }
        }
    return true;
  }

  uint64_t seed_;
  std::string name_;
  int64_t side_;
  int length_;
  double paddle_ = 2;
  int64_t marker_radius_ = 1;
  int distractors_ = 2;
};

TaskInfo pathfinder_like(const std::string& name, int64_t side, int64_t batch) {
  TaskInfo t;
  t.name = name;
  t.summary = fmt::format("{0}x{0} canvas of snakes: are the two markers on one contour?", side);
  t.alphabet = "grey levels 0..255";
  t.default_seq = side * side;
  t.vocab = 256;
  t.classes = 2;
  t.model = ModelShape{1, 32, 2, 32, batch, Pooling::mean};
  t.make = [name, side](const TaskOptions& o) { return std::make_unique<PathfinderTask>(o, name, side); };
  return t;
}

}  // namespace

TaskInfo pathfinder_task_info() { return pathfinder_like("pathfinder", 32, 512); }
TaskInfo pathx_task_info() { return pathfinder_like("pathx", 128, 64); }

}  // namespace ab
