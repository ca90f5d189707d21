#include "bench/engine/task_cli.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "attention_impls/attention.hpp"
#include "bench/text/terminal.hpp"
#include "bench/text/text_table.hpp"
#include "core/sysinfo.hpp"

namespace ab {

int cmd_list_tasks(const TaskOptions& opts, int width) {
  TextTable table;
  table.header = {"task", "N", "vocab", "classes", "layers", "d_model", "heads", "mlp", "batch", "pooling", "alphabet"};
  if (width > 0) table.header.resize(10);  // the alphabet goes below, with the data
  table.keep = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  // Where each task's data comes from, below the table in full: the generator, or the files it
  // reads per split (or, with --data-dir, what that directory provides).
  std::string sources = "\nData (train, val and test splits are disjoint by construction):\n";
  for (const auto& t : tasks()) {
    std::string data = "synthetic (in-process generator)";
    if (!t.real_data.empty()) {
      if (opts.data_dir.empty()) {
        data += "; real with --data-dir: " + t.real_data;
      } else {
        try {
          TaskOptions o = opts;
          o.seq = 0;
          data = make_task(t.name, o)->source();
        } catch (const InvalidInput& e) {
          data = std::string("--data-dir unusable: ") + e.what();
        }
      }
    }
    std::vector<std::string> row = {t.name, std::to_string(t.default_seq), std::to_string(t.vocab),
                                    t.classes ? std::to_string(t.classes) : "next token", std::to_string(t.model.layers),
                                    std::to_string(t.model.dmodel), std::to_string(t.model.heads), std::to_string(t.model.mlp),
                                    std::to_string(t.model.batch), pooling_text(t), t.alphabet};
    if (width > 0) {
      row.resize(10);
      row[9] = std::string(to_string(t.model.pooling)) + (t.two_tower ? ", 2 docs" : "");
    }
    table.rows.push_back(row);
    sources += wrap_words(fmt::format("- {}: tokens {}; {}", t.name, t.alphabet, data), width, "  ");
  }
  std::cout << render_markdown(table, width) << sources;
  return 0;
}

namespace {

// The task options with --split applied (an unknown split is an InvalidInput naming the three).
TaskOptions with_split(const TaskCliOptions& o) {
  TaskOptions t = o.task_opts;
  t.split = parse_split(o.split);
  return t;
}

// --format labels: how many of the examples `train` evaluates on have each class, and the share of
// the commonest, the accuracy of a model that answers that class for every input.
int print_label_counts(const TaskCliOptions& o, const Task& task, const TaskInfo& info) {
  if (info.classes == 0) throw InvalidInput(fmt::format("--format labels: {} predicts next tokens, it has no classes", o.task));
  const LabelCounts l = label_counts(task, info.classes, o.first, o.count);
  std::cout << fmt::format("# {} {} split: examples {} to {}, N = {}, source: {}\n\n| label | examples | share |\n|---:|---:|---:|\n",
                           o.task, o.split, l.first, l.first + l.examples - 1, task.seq(), task.source());
  for (size_t c = 0; c < l.counts.size(); ++c)
    std::cout << fmt::format("| {} | {} | {:.2f}% |\n", c, l.counts[c], 100.0 * static_cast<double>(l.counts[c]) / static_cast<double>(l.examples));
  std::cout << fmt::format("\nanswering label {} for every example scores {:.2f}%\n", l.commonest(), 100 * l.commonest_share());
  return 0;
}

}  // namespace

int cmd_task_sample(const TaskCliOptions& o) {
  if (o.format != "md" && o.format != "jsonl" && o.format != "labels")
    throw unknown_name("format", o.format, {"md", "jsonl", "labels"}, "formats");
  if (o.scale < 1 || o.scale > 64) throw InvalidInput(fmt::format("--scale must be 1 to 64, got {}", o.scale));
  if (o.count < 1 || o.count > 100000) throw InvalidInput(fmt::format("--count must be 1 to 100000, got {}", o.count));
  // An example index is an int64 the generators multiply (by the length, by strides): bounded.
  if (o.first < 0 || o.first > (int64_t{1} << 40))
    throw InvalidInput(fmt::format("--first must be 0 to 2^40, got {}", o.first));
  const auto task = make_task(o.task, with_split(o));
  if (o.format == "labels") return print_label_counts(o, *task, find_task(o.task));
  if (!o.png_dir.empty()) {
    if (task->image_side() == 0) throw InvalidInput(fmt::format("--png: {} is not an image task", o.task));
    std::error_code ec;
    if (std::filesystem::exists(o.png_dir, ec) && !std::filesystem::is_directory(o.png_dir, ec))
      throw InvalidInput(fmt::format("--png {} exists and is not a directory", o.png_dir));
    std::filesystem::create_directories(o.png_dir, ec);
    if (ec) throw InvalidInput(fmt::format("--png {}: cannot create the directory: {}", o.png_dir, ec.message()));
  }
  if (o.format == "md") std::cout << fmt::format("# {} ({} split): N = {}, source: {}\n", o.task, o.split, task->seq(), task->source());
  for (int64_t i = o.first; i < o.first + o.count; ++i) {
    const Example e = task->example(i);
    const std::string readable = task->readable(e);
    std::string png;
    if (!o.png_dir.empty()) {
      png = (std::filesystem::path(o.png_dir) / fmt::format("{}_{}_label{}.png", o.task, i, e.label)).string();
      // Upscaled by repeating each pixel `scale` times in both directions (nearest neighbour).
      const int64_t side = task->image_side(), big = side * o.scale;
      std::vector<int32_t> pixels(static_cast<size_t>(big * big));
      for (int64_t y = 0; y < big; ++y)
        for (int64_t x = 0; x < big; ++x)
          pixels[static_cast<size_t>(y * big + x)] = e.tokens[static_cast<size_t>((y / o.scale) * side + x / o.scale)];
      write_png_grey(png, pixels, big, big);
    }
    if (o.format == "jsonl") {
      nlohmann::json j = {{"task", o.task}, {"index", i}, {"seed", o.task_opts.seed}, {"split", o.split}, {"label", e.label},
                          {"tokens", e.tokens}, {"readable", readable}, {"source", task->source()}};
      if (!e.tokens2.empty()) j["tokens2"] = e.tokens2;
      if (!e.loss_mask.empty()) j["loss_mask"] = e.loss_mask;
      if (!e.targets.empty()) j["targets"] = e.targets;
      if (!png.empty()) j["png"] = png;
      std::cout << j.dump() << "\n";
      continue;
    }
    std::cout << fmt::format("\n## example {}  label {}{}\n", i, e.label == -1 ? std::string(e.targets.empty() ? "(next token)" : "(targets per position)") : std::to_string(e.label),
                             png.empty() ? "" : "  " + png);
    std::cout << readable << (readable.empty() || readable.back() != '\n' ? "\n" : "");
  }
  return 0;
}

int cmd_task_rate(const TaskCliOptions& o) {
  if (o.reps < 1) throw InvalidInput("--reps must be at least 1");
  if (o.threads < 1 || o.threads > 1024) throw InvalidInput(fmt::format("--threads must be 1 to 1024, got {}", o.threads));
  const auto& info = find_task(o.task);
  const auto task = make_task(o.task, with_split(o));
  if (o.batch < 0) throw InvalidInput(fmt::format("--batch must be positive (0: the task's LRA batch), got {}", o.batch));
  const int64_t batch = o.batch > 0 ? o.batch : info.model.batch;
  // A batch's token ids (two documents for a pair task), as `run` bounds its shapes up front.
  const double bytes = static_cast<double>(batch) * static_cast<double>(task->seq()) * sizeof(int32_t) * (info.two_tower ? 2 : 1);
  if (bytes > static_cast<double>(default_memory_limit()))
    throw InvalidInput(fmt::format("--batch {} x --seq {}: {:.1f} GiB of token ids, above 80% of this machine's memory", batch,
                                   task->seq(), bytes / (1u << 30)));
  omp_set_num_threads(o.threads);
  std::vector<double> ms;
  task->batch(0, batch);  // warm-up
  for (int r = 0; r < o.reps; ++r) {
    const double t0 = omp_get_wtime();
    const Batch b = task->batch(static_cast<int64_t>(r + 1) * batch, batch);
    ms.push_back((omp_get_wtime() - t0) * 1e3);
    if (b.tokens.empty()) throw std::logic_error("empty batch");
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  std::cout << fmt::format("{}: batch {} x {} ({}), {} thread(s): median {:.2f} ms per batch (min {:.2f}, max {:.2f}), {:.0f} samples/s\n",
                           o.task, batch, task->seq(), task->source(), o.threads, median, sorted.front(), sorted.back(),
                           batch / (median / 1e3));
  return 0;
}

}  // namespace ab
