// The `attnbench` command line: verbs list, run, dump.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ab {

// Returns the process exit code: 0 success, 2 bad input (one-line message on stderr), 1 other
// failures.
int cli_main(int argc, char** argv);

// "256,512,1024", "256:16384:x2" (geometric) or "1024:4096:+1024" (arithmetic), mixed freely
// with commas. Throws InvalidInput on malformed or non-positive items.
std::vector<int64_t> parse_int_list(const std::string& text);

// "17179869184", "16G", "512M", "64K" (binary units). Throws InvalidInput.
size_t parse_bytes(const std::string& text);

}  // namespace ab
