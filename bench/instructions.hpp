// `--instructions`: a gate that machine noise cannot move. Each point is run once more
// under valgrind's callgrind, with collection switched on only around one measured call.
#pragma once
#include <string>
#include <vector>

#include "bench/result.hpp"

namespace ab {

// Throws InvalidInput when counting cannot work here: valgrind is not installed, or this
// binary uses AVX-512, which valgrind 3.19 cannot decode (build with -DATTNBENCH_ARCH=x86-64-v3).
void check_instruction_counting();

// Runs `attnbench <run_args> --callgrind-child` under callgrind and stores the instructions of
// one call in r.instructions; on failure r becomes FAILED with the reason.
void count_point_instructions(const std::vector<std::string>& run_args, PointResult& r);

}  // namespace ab
