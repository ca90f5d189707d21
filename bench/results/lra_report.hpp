// The LRA efficiency report of `run --preset lra-efficiency` (published.md, Table 2).
#pragma once
#include <string>
#include <vector>

#include "bench/results/result.hpp"

namespace ab {

// The LRA efficiency table (published.md) from model-level train points: steps/s with the
// ratio to `baseline`, peak memory, and at the longest N each mechanism's measured speed-up
// against the speed-up its analytic FLOPs predict, with the time per layer type.
std::string lra_efficiency_report(const std::vector<PointResult>& rs, const std::string& baseline);

}  // namespace ab
