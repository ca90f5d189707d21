// Vectorisable elementwise math for the attention kernels.
//
// exp_f32 is a branch-free Cephes-style exp (range reduction by ln 2, degree-6 polynomial,
// exponent assembled from bits), accurate to about 2 ulp on [-87, 88]. It is written as plain
// scalar code so that GCC vectorises it inside `#pragma omp simd` loops for whatever
// instruction set the build targets; the global build does not use -ffast-math, so libm's
// expf would not vectorise. Inputs below -87.3 (including -inf, the mask value) give exactly 0.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace ab {

inline float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMin = -87.3365447505f;  // below this expf underflows to a denormal or 0
  const bool underflow = !(x >= kMin);     // also catches -inf (and NaN maps to 0 too)
  float xc = x > 88.3762626647949f ? 88.3762626647949f : x;
  xc = xc < kMin ? kMin : xc;
  // n = round(x / ln2) by the float magic-number trick (exact for |n| < 2^22).
  const float n = (xc * kLog2e + 12582912.0f) - 12582912.0f;
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n; n in [-126, 127] after clamping, so the biased exponent is a normal one.
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  const float scaled = p * std::bit_cast<float>(bits);
  return underflow ? 0.0f : scaled;
}

// y[i] = exp(x[i] - shift), returns the sum of y.
inline float exp_shift_sum(const float* x, float* y, int64_t n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float e = exp_f32(x[i] - shift);
    y[i] = e;
    sum += e;
  }
  return sum;
}

inline float max_of(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = m > x[i] ? m : x[i];
  return m;
}

inline void scale_inplace(float* x, int64_t n, float a) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

inline float dot(const float* x, const float* y, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

inline void fill(float* x, int64_t n, float v) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

}  // namespace ab
