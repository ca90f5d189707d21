// The `attnbench` command line: verbs list, run, sweep, table, compare, merge, dump.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/results.hpp"
#include "bench/runner.hpp"

namespace ab {

// Returns the process exit code: 0 success, 2 bad input (one-line message on stderr), 1 other
// failures (and, for `compare`, a regression).
int cli_main(int argc, char** argv);

// "256,512,1024", "256:16384:x2" (geometric) or "1024:4096:+1024" (arithmetic), mixed freely
// with commas. Throws InvalidInput on malformed or non-positive items.
std::vector<int64_t> parse_int_list(const std::string& text);

// "17179869184", "16G", "512M", "64K" (binary units). Throws InvalidInput.
size_t parse_bytes(const std::string& text);

// The arguments of the `attnbench run` command that reproduces one point (without the program
// name), and that command as one line: the label of every result entry.
std::vector<std::string> point_args(const PointId& id, const RunOptions& o);
std::string point_label(const PointId& id, const RunOptions& o);

}  // namespace ab
