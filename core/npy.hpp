// NumPy .npy writer (format 1.0, little-endian, C order) for `attnbench dump`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ab {

// Throws std::runtime_error naming the file when it cannot be written completely.
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
void write_npy(const std::string& path, const int64_t* data, const std::vector<int64_t>& shape);

}  // namespace ab
