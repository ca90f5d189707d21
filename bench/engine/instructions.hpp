// `--instructions`: a gate that machine noise cannot move. Each point is run once more
// under valgrind's callgrind, with collection switched on only around one measured call.
#pragma once
#include <istream>
#include <string>
#include <vector>

#include "bench/results/result.hpp"

namespace ab {

// Throws InvalidInput when counting cannot work here: valgrind is not installed, or this
// binary uses AVX-512, which valgrind 3.19 cannot decode (build with -DATTNBENCH_ARCH=x86-64-v3).
void check_instruction_counting();

// The instructions (Ir) of a callgrind profile, and the part of them spent inside the C library's
// allocator (glibc's malloc/free/posix_memalign and their helpers). The allocator's share depends
// on the heap's layout, which the process's arguments, environment and path move: the same
// binary's strided point at N = 256 counted 5,381,264 or 5,485,014 instructions depending only on
// how it was started, all of the difference in malloc.c. `total` is checked against the profile's
// own totals line; a profile this reader cannot account for throws std::runtime_error.
struct CallgrindCount {
  double total = 0;
  double allocator = 0;
};
CallgrindCount read_callgrind_profile(std::istream& in);

// Runs `attnbench <run_args> --callgrind-child` under callgrind and stores the instructions of
// one call outside the C allocator (total - allocator above) in r.instructions; on failure r
// becomes FAILED with the reason.
void count_point_instructions(const std::vector<std::string>& run_args, PointResult& r);

}  // namespace ab
