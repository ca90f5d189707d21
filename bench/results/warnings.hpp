// When a measurement should not be trusted, the result file says so: the reasons go into the
// context's "warnings" (so they travel with the numbers) and to stderr (so the person running it
// sees them). They warn, never fail: a loaded machine still measures, less reliably.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/results/result.hpp"

namespace ab {

// Thresholds, documented in docs/results-format.md.
constexpr double kWarnCv = 0.10;          // spread of a point's repetitions (stddev / mean)
constexpr double kWarnWallOverCpu = 1.5;  // wall time per call over process CPU time per call

// The number of other tasks runnable on the machine now (procs_running of /proc/stat, less this
// one); -1 when unknown. Sampled before the GEMM reference is measured.
int other_runnable_tasks();

// The reasons, in words: the load average when the run started left fewer idle CPUs than its
// threads; the GEMM reference was measured while other tasks were runnable
// (context "gemm_other_runnable"); a point's wall time far above its CPU time (the process
// waited: preempted, or paging); a point's repetitions spread above kWarnCv. Training runs'
// times are not judged (their accuracy does not depend on the machine).
std::vector<std::string> measurement_warnings(const nlohmann::json& context, const std::vector<PointResult>& results);

// Sets context["warnings"] (removes it when there is none) and prints each warning not already
// there to stderr as "attnbench: warning: ...".
void attach_warnings(nlohmann::json& context, const std::vector<PointResult>& results);

}  // namespace ab
