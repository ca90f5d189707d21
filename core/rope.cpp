#include "core/rope.hpp"

#include <cmath>

namespace ab {

void rope_table(int64_t N, int64_t width, float* cos_sin) {
  const int64_t half = width / 2;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(n) * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(width));
      cos_sin[n * half + i] = static_cast<float>(std::cos(angle));
      cos_sin[N * half + n * half + i] = static_cast<float>(std::sin(angle));
    }
}

namespace {
// One row at position n: (a, b) -> (a cos - b sin, a sin + b cos), sin negated for the inverse.
inline void rotate_row(float* r, int64_t half, const float* c, const float* s, float sign) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = r[2 * i], b = r[2 * i + 1], si = sign * s[i];
    r[2 * i] = a * c[i] - b * si;
    r[2 * i + 1] = a * si + b * c[i];
  }
}
}  // namespace

void rope_rotate_rows(float* x, int64_t rows, int64_t ld, int64_t width, const float* cos_sin, int64_t table_rows,
                      int64_t pos0, bool inverse) {
  const int64_t half = width / 2;
  const float* cs = cos_sin;
  const float* sn = cos_sin + table_rows * half;
  const float sign = inverse ? -1.0f : 1.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = pos0 + r;
    rotate_row(x + r * ld, half, cs + n * half, sn + n * half, sign);
  }
}

void rope_rotate(float* x, int64_t B, int64_t H, int64_t N, int64_t width, const float* cos_sin, bool inverse) {
  const int64_t half = width / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t n = 0; n < N; ++n)
      rotate_row(x + (bh * N + n) * width, half, cos_sin + n * half, cos_sin + N * half + n * half, sign);
}

}  // namespace ab
