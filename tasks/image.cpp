// image: CIFAR-10 as a sequence of grey pixels (LRA; tasks.md).
// Real data: the CIFAR-10 binary batches DIR/data_batch_*.bin and test_batch.bin (3073-byte
// records: label, then 1024 red, 1024 green, 1024 blue bytes, row-major), read whole and
// validated when the task is made, converted to grey as ITU-R 601 luma,
// round(0.299 R + 0.587 G + 0.114 B) (what tf.image.rgb_to_grayscale computes); or Fashion-MNIST
// (Debian's dataset-fashion-mnist: /usr/share/datasets/fashion-mnist/), its 28 x 28 grey images
// padded to 32 x 32.
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
#include "core/files.hpp"

#include <zlib.h>

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
    if (!o.data_dir.empty()) load(o.data_dir, o.split);
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
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }

 private:
  // Fashion-MNIST (or MNIST) IDX files when the directory has them, else CIFAR-10 batches.
  void load(const std::string& dir, Split split) {
    if (fs::exists(fs::path(dir) / "train-images-idx3-ubyte.gz") || fs::exists(fs::path(dir) / "train-images-idx3-ubyte"))
      load_idx(dir, split);
    else
      load_cifar(dir, split);
    if (labels_.empty()) throw InvalidInput(fmt::format("{}: no images for the {} split", dir, to_string(split)));
  }

  // CIFAR-10: train and validation from data_batch_*.bin (the last tenth validation, as LRA's
  // 45,000 / 5,000), test from test_batch.bin.
  void load_cifar(const std::string& dir, Split split) {
    std::vector<fs::path> paths;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string n = entry.path().filename().string();
      const bool wanted = split == Split::test ? n == "test_batch.bin"
                                               : n.rfind("data_batch_", 0) == 0 && entry.path().extension() == ".bin";
      if (wanted) paths.push_back(entry.path());
    }
    if (ec) throw InvalidInput(fmt::format("{}: cannot read the directory ({})", dir, ec.message()));
    if (paths.empty())
      throw InvalidInput(fmt::format("{}: no CIFAR-10 {} (data_batch_*.bin for train and val, test_batch.bin for test) "
                                     "and no Fashion-MNIST IDX files", dir, split == Split::test ? "test batch" : "batches"));
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      require_regular_file(p.string());
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
    if (split != Split::test) keep_tenth(split);
  }

  // Fashion-MNIST's IDX files (gzip or plain): train and validation from train-* (the last
  // tenth validation: 54,000 / 6,000), test from t10k-*. 28 x 28 images are padded with black
  // to 32 x 32 (two pixels each side), so N stays 1024, CIFAR's.
  void load_idx(const std::string& dir, Split split) {
    const std::string prefix = split == Split::test ? "t10k" : "train";
    const std::vector<unsigned char> images = read_idx(dir, prefix + "-images-idx3-ubyte", 3);
    const std::vector<unsigned char> labels = read_idx(dir, prefix + "-labels-idx1-ubyte", 1);
    const int64_t n = static_cast<int64_t>(labels.size()), side = 28, pad = (kSide - side) / 2;
    if (static_cast<int64_t>(images.size()) != n * side * side)
      throw InvalidInput(fmt::format("{}: {} images of 28 x 28 expected for {} labels, found {} bytes", dir, n, n, images.size()));
    for (int64_t r = 0; r < n; ++r) {
      if (labels[static_cast<size_t>(r)] > 9)
        throw InvalidInput(fmt::format("{}/{}-labels-idx1-ubyte: label {} of image {}, expected 0-9", dir, prefix,
                                       labels[static_cast<size_t>(r)], r + 1));
      labels_.push_back(labels[static_cast<size_t>(r)]);
      for (int64_t y = 0; y < kSide; ++y)
        for (int64_t x = 0; x < kSide; ++x) {
          const int64_t sy = y - pad, sx = x - pad;
          const bool in = sy >= 0 && sy < side && sx >= 0 && sx < side;
          pixels_.push_back(in ? images[static_cast<size_t>((r * side + sy) * side + sx)] : 0);
        }
    }
    files_ = fmt::format("{}/{}-{{images,labels}}", dir, prefix);
    if (split != Split::test) keep_tenth(split);
  }

  // An IDX file's data, checked against its header: magic 0x00000800 + 0x08 (unsigned bytes)
  // and `dims` big-endian sizes. NAME or NAME.gz.
  static std::vector<unsigned char> read_idx(const std::string& dir, const std::string& name, int dims) {
    fs::path path = fs::path(dir) / (name + ".gz");
    if (!fs::exists(path)) path = fs::path(dir) / name;
    require_regular_file(path.string());
    gzFile f = gzopen(path.c_str(), "rb");  // reads plain files too
    if (!f) throw InvalidInput(fmt::format("{}: cannot open", path.string()));
    std::vector<unsigned char> bytes;
    unsigned char buf[1 << 16];
    int got = 0;
    while ((got = gzread(f, buf, sizeof buf)) > 0) bytes.insert(bytes.end(), buf, buf + got);
    const bool failed = got < 0;
    gzclose(f);
    if (failed) throw InvalidInput(fmt::format("{}: corrupt (gzip)", path.string()));
    const size_t header = 4 + 4 * static_cast<size_t>(dims);
    auto be32 = [&](size_t at) {
      return (uint32_t{bytes[at]} << 24) | (uint32_t{bytes[at + 1]} << 16) | (uint32_t{bytes[at + 2]} << 8) | bytes[at + 3];
    };
    if (bytes.size() < header || be32(0) != 0x800u + static_cast<uint32_t>(dims))
      throw InvalidInput(fmt::format("{}: not an IDX file of unsigned bytes with {} dimensions", path.string(), dims));
    size_t count = 1;
    for (int d = 0; d < dims; ++d) count *= be32(4 + 4 * static_cast<size_t>(d));
    if (bytes.size() - header != count)
      throw InvalidInput(fmt::format("{}: the header declares {} bytes of data, the file has {}", path.string(), count,
                                     bytes.size() - header));
    return std::vector<unsigned char>(bytes.begin() + static_cast<int64_t>(header), bytes.end());
  }

  // Train keeps the first nine tenths of the training images, val the last tenth.
  void keep_tenth(Split split) {
    const size_t n = labels_.size(), cut = n - n / 10;
    const size_t b = split == Split::train ? 0 : cut, e = split == Split::train ? cut : n;
    labels_ = std::vector<int32_t>(labels_.begin() + static_cast<int64_t>(b), labels_.begin() + static_cast<int64_t>(e));
    pixels_ = std::vector<int32_t>(pixels_.begin() + static_cast<int64_t>(b) * seq_, pixels_.begin() + static_cast<int64_t>(e) * seq_);
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
  t.real_data =
      "Fashion-MNIST IDX files DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (28 x 28 padded to 32 x 32; "
      "val: the last tenth of train), or CIFAR-10 binary batches DIR/data_batch_*.bin (val: the last tenth) and "
      "DIR/test_batch.bin";
  t.make = [](const TaskOptions& o) { return std::make_unique<ImageTask>(o); };
  return t;
}

}  // namespace ab
