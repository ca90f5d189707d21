#include "bench/engine/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "bench/text/terminal.hpp"
#include "bench/text/text_table.hpp"
#include "core/matmul.hpp"
#include "core/memory.hpp"

namespace ab {

namespace {
std::string seconds_text(double s) { return s < 60 ? fmt::format("{:.2g} s", s) : format_duration(s); }
std::string bytes_text(double b) {
  return b < (1 << 30) ? fmt::format("{:.3g} MiB", b / (1 << 20)) : format_gib(b);
}
}  // namespace

int cmd_dry_run(const std::vector<PointId>& grid, const RunOptions& opts, bool isolated, int width,
                const std::string& totals_note, int jobs) {
  // A process start (with oneDNN's first primitive) per isolated point, measured on the
  // reference machine; small beside any point worth a sweep.
  constexpr double kProcessStartSeconds = 0.15;
  const double gemm = (opts.gemm_gflops > 0 ? opts.gemm_gflops : measure_gemm_gflops(1)) * 1e9;
  RunOptions no_limit = opts;
  no_limit.mem_limit = 0;

  TextTable t;
  bool header_done = false;
  double total_s = 0, total_flops = 0;
  size_t peak = 0, runnable = 0;
  for (const auto& id : grid) {
    const PreparedPoint pp = prepare_point(id, no_limit);  // throws InvalidInput as the run would
    std::vector<std::string> row;
    for (const auto& [title, text] : point_columns(id)) {
      if (!header_done) t.header.push_back(title);
      row.push_back(text);
    }
    if (!header_done) {
      for (const char* h : {"GFLOP/call", "memory", "time ≥", "status"}) t.header.push_back(h);
      for (size_t c = t.header.size() - 4; c < t.header.size() - 1; ++c) t.right_aligned.insert(c);
      header_done = true;
    }
    std::string status = to_string(pp.status);
    if (pp.status == Status::OK && opts.mem_limit && pp.predicted_bytes > opts.mem_limit)
      status = fmt::format("OOM (above --mem-limit {})", format_gib(static_cast<double>(opts.mem_limit)));
    double seconds = 0;
    if (status == "OK") {
      const double call = pp.flops / (gemm * std::max(1, id.threads));
      if (id.training())
        seconds = call * static_cast<double>(id.train.steps);
      else
        seconds = (opts.warmup + static_cast<double>(opts.reps) * opts.rounds) * std::max(call, opts.min_time);
      if (isolated) seconds += kProcessStartSeconds;
      total_s += seconds;
      total_flops += pp.flops;
      peak = std::max(peak, pp.predicted_bytes);
      ++runnable;
    } else if (!pp.message.empty() && pp.status != Status::OK) {
      status += ": " + pp.message;
    }
    row.push_back(fmt::format("{:.3g}", pp.flops / 1e9));
    row.push_back(bytes_text(static_cast<double>(pp.predicted_bytes)));
    row.push_back(status == "OK" ? seconds_text(seconds) : "");
    row.push_back(status);
    t.rows.push_back(std::move(row));
  }
  // Identity columns no point has (training, real data, dtype in a plain f32 grid) are left out.
  const size_t identity = header_done ? t.header.size() - 4 : 0;  // no points (all kept by --resume): no table
  for (size_t c = identity; c-- > 0;) {
    const bool empty = std::all_of(t.rows.begin(), t.rows.end(), [c](const auto& r) { return r[c].empty(); });
    if (!empty) continue;
    t.header.erase(t.header.begin() + static_cast<std::ptrdiff_t>(c));
    for (auto& r : t.rows) r.erase(r.begin() + static_cast<std::ptrdiff_t>(c));
    std::set<size_t> shifted;
    for (size_t a : t.right_aligned) shifted.insert(a > c ? a - 1 : a);
    t.right_aligned = shifted;
  }
  if (header_done) std::cout << render_markdown(t, width);
  std::cout << fmt::format(
      "\ndry run: {} points ({} would run{}), nothing run. Time at least {} (each call's FLOPs at this machine's "
      "GEMM rate, {:.0f} GFLOP/s per thread{}){}; memory at most {} per point.\n",
      grid.size(), runnable, totals_note, seconds_text(total_s), gemm / 1e9, isolated ? ", plus a process start per point" : "",
      jobs > 1 ? fmt::format(", {} with --jobs {}", seconds_text(total_s / jobs), jobs) : "",
      bytes_text(static_cast<double>(peak)));
  return 0;
}

}  // namespace ab
