// The task registry (explicit, in one place), batching, and helpers shared by the tasks.
#include "tasks/task.hpp"

#include "core/files.hpp"

#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <zlib.h>

#include <algorithm>
#include <functional>
#include <array>
#include <cstdio>
#include <stdexcept>

#include "core/dropout.hpp"  // mix64
#include "core/params.hpp"  // InvalidInput

namespace ab {

const char* to_string(Pooling p) {
  switch (p) {
    case Pooling::cls: return "cls";
    case Pooling::mean: return "mean";
    case Pooling::lm: return "lm";
  }
  return "?";
}

std::string pooling_text(const TaskInfo& t) {
  switch (t.model.pooling) {
    case Pooling::lm: return "causal LM";
    case Pooling::mean: return "mean";
    case Pooling::cls: break;
  }
  return t.two_tower ? "CLS per document, MLP on [e1, e2, e1*e2, e1-e2]" : "CLS";
}

const char* to_string(Split s) {
  switch (s) {
    case Split::train: return "train";
    case Split::val: return "val";
    case Split::test: return "test";
  }
  return "?";
}

Split parse_split(const std::string& text) {
  for (Split s : {Split::train, Split::val, Split::test})
    if (text == to_string(s)) return s;
  throw unknown_name("split", text, {"train", "val", "test"}, "splits");
}

uint64_t split_seed(uint64_t seed, Split split) {
  if (split == Split::train) return seed;
  const uint64_t salt = split == Split::val ? 0x56414c49444154ull : 0x54455354534554ull;  // "VALIDAT", "TESTSET"
  return mix64(seed ^ mix64(salt));
}

std::pair<size_t, size_t> split_range(size_t n, Split split) {
  const size_t held = n >= 3 ? std::max<size_t>(1, n / 20) : 0;  // 5% each for val and test
  const size_t train_end = n - 2 * held, val_end = n - held;
  switch (split) {
    case Split::train: return {0, train_end};
    case Split::val: return {train_end, val_end};
    case Split::test: return {val_end, n};
  }
  return {0, 0};
}

const std::vector<TaskInfo>& tasks() {
  static const std::vector<TaskInfo> all = {copy_task_info(),  listops_task_info(),    text_task_info(),
                                            retrieval_task_info(), image_task_info(), pathfinder_task_info(),
                                            pathx_task_info(), mqar_task_info(), induction_task_info()};
  return all;
}

const TaskInfo& find_task(const std::string& name) {
  for (const auto& t : tasks())
    if (t.name == name) return t;
  std::vector<std::string> names;
  for (const auto& t : tasks()) names.push_back(t.name);
  throw unknown_name("task", name, names);
}

std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& opts) {
  const auto& info = find_task(name);
  if (opts.seq < 0) throw InvalidInput(fmt::format("{}: --seq must be positive", name));
  if (opts.seq > kMaxTaskSeq)
    throw InvalidInput(fmt::format("{}: --seq {} is above the {} tokens any task generates or reads per example", name,
                                   opts.seq, kMaxTaskSeq));
  if (!opts.data_dir.empty() && info.real_data.empty())
    throw InvalidInput(fmt::format("--data-dir {}: the {} task is generated in-process and reads no data; leave --data-dir out",
                                   opts.data_dir, name));
  if (!opts.data_dir.empty()) require_directory("--data-dir", opts.data_dir);
  auto takes = [&](const char* option) { return task_takes_option(info, option); };
  for (const auto& [option, value] : {std::pair{"vocab", opts.vocab}, std::pair{"kv_pairs", opts.kv_pairs},
                                      std::pair{"train_examples", opts.train_examples}})
    if (value != 0 && !takes(option))
      throw InvalidInput(fmt::format("the {} task has no option {} (--{}); tasks that take it: attnbench list tasks", name,
                                     option, std::string(option) == "kv_pairs" ? "kv-pairs" : std::string(option) == "train_examples" ? "train-examples" : option));
    else if (value < 0)
      throw InvalidInput(fmt::format("{}: {} must not be negative, got {}", name, option, value));
  TaskOptions o = opts;
  o.seed = split_seed(opts.seed, opts.split);
  auto task = info.make(o);
  if (task->vocab_ == 0) task->vocab_ = info.vocab;
  return task;
}

bool task_takes_option(const TaskInfo& t, const std::string& option) {
  return std::find(t.options.begin(), t.options.end(), option) != t.options.end();
}

Split split_of_tokens(const std::vector<int32_t>& tokens) {
  uint64_t h = 0x53504c4954ull;  // "SPLIT"
  for (int32_t t : tokens) h = mix64(h ^ static_cast<uint32_t>(t));
  const uint64_t bucket = h % 20;
  return bucket < 18 ? Split::train : bucket == 18 ? Split::val : Split::test;
}

uint64_t candidate_stream(int64_t index, int64_t attempt) {
  return mix64(example_stream(index) ^ (static_cast<uint64_t>(attempt) << 40) ^ 0x43414e44ull);  // "CAND"
}

uint64_t example_stream(int64_t index) { return 0x7a5c0000ull + static_cast<uint64_t>(index); }

int64_t evaluated_examples(const Task& task, int64_t count) { return task.size() > 0 ? std::min(count, task.size()) : count; }

int32_t LabelCounts::commonest() const {
  return static_cast<int32_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
}
double LabelCounts::commonest_share() const {
  return examples > 0 ? static_cast<double>(counts[static_cast<size_t>(commonest())]) / static_cast<double>(examples) : 0;
}

LabelCounts label_counts(const Task& task, int64_t classes, int64_t first, int64_t count) {
  if (classes < 1) throw std::logic_error("label_counts: a task without classes");
  if (task.size() > 0 && first >= task.size())
    throw InvalidInput(fmt::format("example {} is past the split's {} examples", first, task.size()));
  LabelCounts r;
  r.first = first;
  r.examples = evaluated_examples(task, task.size() > 0 ? std::min(count, task.size() - first) : count);
  r.counts.assign(static_cast<size_t>(classes), 0);
  constexpr int64_t kBatch = 256;  // examples generated at a time (in parallel)
  for (int64_t at = first; at < first + r.examples; at += kBatch)
    for (const int32_t label : task.batch(at, std::min(kBatch, first + r.examples - at)).labels) {
      if (label < 0 || label >= classes) throw std::logic_error(fmt::format("label {} out of range 0..{}", label, classes - 1));
      ++r.counts[static_cast<size_t>(label)];
    }
  return r;
}

Batch Task::batch(int64_t first, int64_t size) const {
  std::vector<int64_t> indices(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) indices[static_cast<size_t>(i)] = first + i;
  return batch_of(indices);
}

Batch Task::batch_of(const std::vector<int64_t>& indices) const {
  const int64_t size = static_cast<int64_t>(indices.size());
  Batch b;
  b.size = size;
  b.seq = seq_;
  const size_t n = static_cast<size_t>(size * seq_);
  b.tokens.assign(n, 0);
  b.labels.assign(static_cast<size_t>(size), 0);
  bool two = false, mask = false, targets = false;
  std::vector<Example> ex(static_cast<size_t>(size));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < size; ++i) ex[static_cast<size_t>(i)] = example(indices[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < size; ++i) {
    const Example& e = ex[static_cast<size_t>(i)];
    std::copy(e.tokens.begin(), e.tokens.end(), b.tokens.begin() + i * seq_);
    b.labels[static_cast<size_t>(i)] = e.label;
    two |= !e.tokens2.empty();
    mask |= !e.loss_mask.empty();
    targets |= !e.targets.empty();
  }
  if (targets) {
    b.targets.assign(n, -1);
    for (int64_t i = 0; i < size; ++i)
      std::copy(ex[static_cast<size_t>(i)].targets.begin(), ex[static_cast<size_t>(i)].targets.end(), b.targets.begin() + i * seq_);
  }
  if (two) {
    b.tokens2.assign(n, 0);
    for (int64_t i = 0; i < size; ++i)
      std::copy(ex[static_cast<size_t>(i)].tokens2.begin(), ex[static_cast<size_t>(i)].tokens2.end(), b.tokens2.begin() + i * seq_);
  }
  if (mask) {
    b.loss_mask.assign(n, 0);
    for (int64_t i = 0; i < size; ++i)
      std::copy(ex[static_cast<size_t>(i)].loss_mask.begin(), ex[static_cast<size_t>(i)].loss_mask.end(),
                b.loss_mask.begin() + i * seq_);
  }
  return b;
}

std::string text_of_tokens(const std::vector<int32_t>& tokens, size_t max_chars) {
  std::string s;
  for (int32_t t : tokens) {
    if (t == 0) continue;
    if (s.size() >= max_chars) {
      s += "...";
      break;
    }
    const int c = t - 1;
    s += (c >= 32 && c < 127) ? static_cast<char>(c) : '.';
  }
  return s;
}

std::string ascii_art(const std::vector<int32_t>& pixels, int64_t side, int64_t step) {
  static const char* ramp = " .:-=+*#%@";
  std::string out;
  for (int64_t y = 0; y < side; y += step) {
    for (int64_t x = 0; x < side; x += step) {
      int32_t v = 0;
      for (int64_t dy = 0; dy < step && y + dy < side; ++dy)
        for (int64_t dx = 0; dx < step && x + dx < side; ++dx) v = std::max(v, pixels[static_cast<size_t>((y + dy) * side + x + dx)]);
      // Two characters per pixel: a terminal cell is about twice as tall as wide, so the
      // picture keeps its proportions.
      out.append(2, ramp[std::clamp(v * 10 / 256, 0, 9)]);
    }
    out += '\n';
  }
  out += "key (dark to light, 0-255 in tenths): ";
  for (int i = 0; i < 10; ++i) out += fmt::format("{}'{}'={}-{}", i ? " " : "", ramp[i], (i * 256 + 9) / 10, ((i + 1) * 256 + 9) / 10 - 1);
  if (step > 1) out += fmt::format(" (each cell the brightest of {} x {} pixels)", step, step);
  return out + "\n";
}

std::string listops_layout(const std::vector<int32_t>& tokens, size_t width) {
  // The expression as a tree of spelled tokens: an operator's arguments on its line when they fit
  // in `width` at its indent, else one per line, indented two spaces per level.
  const std::string flat = listops_spelling(tokens);
  std::vector<std::string> words;
  {
    size_t at = 0;
    while (at < flat.size()) {
      const size_t sp = flat.find(' ', at);
      words.push_back(flat.substr(at, sp == std::string::npos ? std::string::npos : sp - at));
      if (sp == std::string::npos) break;
      at = sp + 1;
    }
  }
  // The span of each subtree: from an operator to its closing bracket.
  std::vector<size_t> close(words.size(), 0);
  {
    std::vector<size_t> open;
    for (size_t i = 0; i < words.size(); ++i) {
      if (words[i].rfind("[", 0) == 0) open.push_back(i);
      else if (words[i] == "]" && !open.empty()) {
        close[open.back()] = i;
        open.pop_back();
      }
    }
  }
  auto span_text = [&](size_t a, size_t b) {
    std::string s;
    for (size_t i = a; i <= b; ++i) s += (i > a ? " " : "") + words[i];
    return s;
  };
  std::string out, line;
  size_t line_indent = 0;
  auto flush = [&] {
    if (!line.empty()) out += std::string(line_indent, ' ') + line + "\n";
    line.clear();
  };
  // The items of [a, b] at `indent`: packed onto lines up to `width`; an operator too long for a
  // line of its own opens a block of its arguments two spaces deeper.
  std::function<void(size_t, size_t, size_t)> emit = [&](size_t a, size_t b, size_t indent) {
    for (size_t i = a; i <= b;) {
      const bool op = words[i].rfind("[", 0) == 0;
      const size_t end = op ? close[i] : i;
      const std::string one = span_text(i, end);
      if (indent + one.size() <= width) {
        if (!line.empty() && indent + line.size() + 1 + one.size() > width) flush();
        line_indent = indent;
        line += (line.empty() ? "" : " ") + one;
      } else {
        flush();
        out += std::string(indent, ' ') + words[i] + "\n";
        if (end > i + 1) emit(i + 1, end - 1, indent + 2);
        flush();
        out += std::string(indent, ' ') + "]\n";
      }
      i = end + 1;
    }
  };
  if (!words.empty()) emit(0, words.size() - 1, 0);
  flush();
  return out;
}

namespace {
void put_u32(std::string& s, uint32_t v) {
  for (int k = 3; k >= 0; --k) s += static_cast<char>((v >> (8 * k)) & 0xff);
}
void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const std::string body = std::string(type, 4) + data;
  out += body;
  put_u32(out, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}
}  // namespace

void write_png_grey(const std::string& path, const std::vector<int32_t>& pixels, int64_t width, int64_t height) {
  // Rows each prefixed by filter type 0, deflated by zlib.
  std::string raw;
  for (int64_t y = 0; y < height; ++y) {
    raw += '\0';
    for (int64_t x = 0; x < width; ++x) raw += static_cast<char>(std::clamp(pixels[static_cast<size_t>(y * width + x)], 0, 255));
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &zlen, reinterpret_cast<const Bytef*>(raw.data()),
                static_cast<uLong>(raw.size()), 6) != Z_OK)
    throw std::runtime_error("png: zlib compression failed");
  z.resize(zlen);
  std::string ihdr;
  put_u32(ihdr, static_cast<uint32_t>(width));
  put_u32(ihdr, static_cast<uint32_t>(height));
  ihdr += std::string("\x08\x00\x00\x00\x00", 5);  // 8-bit, greyscale, deflate, no filter, no interlace
  std::string out = "\x89PNG\r\n\x1a\n";
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", "");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw InvalidInput("cannot write " + path);
  std::fwrite(out.data(), 1, out.size(), f);
  std::fclose(f);
}

}  // namespace ab
