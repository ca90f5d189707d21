// `attnbench dump`: inputs, parameters and outputs of one call as .npy files plus config.json.
#pragma once
#include <string>

#include "bench/results/result.hpp"

namespace ab {

// Writes into `dir` (created; replaced whole if it exists, never left partial).
void dump_point(const PointId& id, uint64_t seed, const std::string& dir);

}  // namespace ab
