#include "core/npy.hpp"

#include <bit>
#include <cstdio>
#include <stdexcept>

namespace ab {
namespace {
static_assert(std::endian::native == std::endian::little, "npy writer assumes little-endian");

void write_raw(const std::string& path, const char* descr, const void* data, size_t elem_size,
               const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dims += ",";
    if (i + 1 < shape.size()) dims += " ";
    count *= shape[i];
  }
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of
  // 64 bytes and ended by a newline.
  const size_t preamble = 10;
  size_t total = preamble + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  bool ok = std::fwrite(magic, 1, 8, f) == 8;
  ok = ok && std::fwrite(&hlen, 2, 1, f) == 1;
  ok = ok && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  ok = ok && (count == 0 ||
              std::fwrite(data, elem_size, static_cast<size_t>(count), f) == static_cast<size_t>(count));
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw std::runtime_error("failed writing " + path);
}
}  // namespace

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_raw(path, "<f4", data, sizeof(float), shape);
}
void write_npy(const std::string& path, const int64_t* data, const std::vector<int64_t>& shape) {
  write_raw(path, "<i8", data, sizeof(int64_t), shape);
}

}  // namespace ab
