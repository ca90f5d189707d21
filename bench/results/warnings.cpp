#include "bench/results/warnings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "bench/text/terminal.hpp"
#include "core/params.hpp"

namespace ab {

namespace {
int procs_running() {
  std::ifstream in("/proc/stat");
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string key;
    int n = 0;
    if (words >> key >> n && key == "procs_running") return n;
  }
  return -1;
}
}  // namespace

int other_runnable_tasks() {
  // The fewest of a few samples 10 ms apart: one sample catches short-lived tasks (a shell, the
  // parent starting us) that are gone before the measurement begins.
  int fewest = -1;
  for (int i = 0; i < 5; ++i) {
    const int n = procs_running();
    if (n >= 0) fewest = fewest < 0 ? n : std::min(fewest, n);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return fewest < 0 ? -1 : std::max(0, fewest - 1);
}

std::vector<std::string> measurement_warnings(const nlohmann::json& context, const std::vector<PointResult>& results) {
  std::vector<std::string> out;
  const int cpus = context.value("num_cpus", 0), threads = context.value("threads", 1);
  if (context.contains("load_avg") && context["load_avg"].is_array() && !context["load_avg"].empty() && cpus > 0) {
    const double load = context["load_avg"][0].get<double>();
    // The load average trails by a minute (a build just before the run raises it); when the
    // GEMM reference sampled the run queue and found nothing else runnable, the load is history.
    const bool sampled_idle = context.contains("gemm_other_runnable") && context["gemm_other_runnable"].get<int>() == 0;
    if (load + threads > cpus + 0.5 && !sampled_idle)
      out.push_back(fmt::format("load average {:.2f} when the run started, on {} CPUs: fewer idle CPUs than the run's "
                                "{} thread(s); times may be inflated",
                                load, cpus, threads));
  }
  if (context.contains("gemm_other_runnable") && cpus > 0) {
    const int others = context["gemm_other_runnable"].get<int>();
    if (others > cpus - 1)
      out.push_back(fmt::format("the GEMM reference was measured while {} other task(s) were runnable on {} CPUs: "
                                "'of GEMM' fractions may be too high",
                                others, cpus));
  }
  size_t waited = 0, spread = 0;
  std::string waited_example, spread_example;
  for (const auto& r : results) {
    if (r.status != Status::OK || r.reps.empty() || r.train) continue;
    const TimeStats wall = real_stats(r), cpu = cpu_stats(r);
    // Calls under a millisecond are left out: one preemption is a large fraction of them.
    if (cpu.median > 0 && wall.median >= 1e-3 && wall.median > kWarnWallOverCpu * cpu.median) {
      if (!waited++) waited_example = fmt::format("{} ({:.1f}x)", r.id.name(), wall.median / cpu.median);
    }
    if (r.reps.size() >= 3 && wall.cv() > kWarnCv) {
      if (!spread++) spread_example = fmt::format("{} ({:.0f}%)", r.id.name(), 100 * wall.cv());
    }
  }
  if (waited)
    out.push_back(fmt::format("{} point(s) took over {:.1f}x their CPU time in wall time (the process waited: another "
                              "load, or paging), e.g. {}",
                              waited, kWarnWallOverCpu, waited_example));
  if (spread)
    out.push_back(fmt::format("{} point(s) have repetitions spread above {:.0f}% (cv), e.g. {}; more --reps or a quieter "
                              "machine", spread, 100 * kWarnCv, spread_example));
  return out;
}

void attach_warnings(nlohmann::json& context, const std::vector<PointResult>& results) {
  std::set<std::string> before;
  if (context.contains("warnings"))
    for (const auto& w : context["warnings"]) before.insert(w.get<std::string>());
  const auto now = measurement_warnings(context, results);
  for (const auto& w : now)
    if (!before.count(w)) ProgressLine().message("attnbench: warning: " + w);
  if (now.empty()) context.erase("warnings");
  else context["warnings"] = now;
}

}  // namespace ab
