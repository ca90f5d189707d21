#include "bench/results/lra_report.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "bench/results/table.hpp"

namespace ab {

std::string lra_efficiency_report(const std::vector<PointResult>& rs, const std::string& baseline) {
  ResultFile rf;
  rf.points = rs;
  std::string out;
  if (rs.empty()) return out;
  const PointId& first = rs.front().id;
  out += fmt::format(
      "# LRA efficiency (Tay et al. 2020, Table 2) on this machine\n\n"
      "Task {}, training steps (forward, backward, AdamW), batch {} (LRA: 32 on a 4x4 TPU v3), {} thread{}, "
      "model L={} d_model={} heads={} mlp={}. Ratios in brackets are against `{}`, the Transformer.\n\n",
      first.task, first.shape.B, first.threads, first.threads == 1 ? "" : "s", first.model.layers, first.model.dmodel,
      first.shape.H, first.model.mlp, baseline);
  TableOptions steps, memory;
  steps.metric = "steps_per_s";
  steps.baseline = baseline;
  memory.metric = "peak_bytes";
  memory.baseline = "none";
  out += make_table({rf}, steps) + "\n";
  out += make_table({rf}, memory) + "\n";
  // Measured speed-up against the speed-up the analytic FLOPs predict, at the longest N, with
  // where the time goes.
  int64_t n_max = 0;
  for (const auto& r : rs) n_max = std::max(n_max, r.id.shape.N);
  const PointResult* base = nullptr;
  for (const auto& r : rs)
    if (r.id.mechanism == baseline && r.id.shape.N == n_max && r.status == Status::OK) base = &r;
  if (!base) return out + fmt::format("(no {} point at N={}: no speed-up check)\n", baseline, n_max);
  const double tb = real_stats(*base).median;
  std::string header = "| mechanism | measured speed-up | FLOP-predicted | measured / predicted |";
  std::string rule = "|---|---:|---:|---:|";
  for (const char* name : layer_type_names()) {
    header += fmt::format(" {} ms |", name);
    rule += "---:|";
  }
  out += fmt::format("**speed-up over {} at N={}: measured against predicted by analytic FLOPs; time per step by layer type**\n\n{}\n{}\n",
                     baseline, n_max, header, rule);
  for (const auto& r : rs) {
    if (r.id.shape.N != n_max) continue;
    if (r.status != Status::OK) {
      std::string row = fmt::format("| {} | {} | | |", r.id.mechanism, to_string(r.status));
      for (int i = 0; i < kLayerTypes; ++i) row += " |";
      out += row + "\n";
      continue;
    }
    const double measured = tb / real_stats(r).median, predicted = base->flops / r.flops;
    std::string row = fmt::format("| {} | {:.2f}x | {:.2f}x | {:.2f} |", r.id.mechanism, measured, predicted, measured / predicted);
    for (double ms : r.layer_ms) row += fmt::format(" {:.1f} |", ms);
    out += row + "\n";
  }
  return out;
}

}  // namespace ab
