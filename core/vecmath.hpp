// Vectorisable elementwise math for the attention kernels, and the transpose of a score tile.
//
// exp_f32 is a branch-free Cephes-style exp (range reduction by ln 2, degree-6 polynomial,
// exponent assembled from bits), accurate to about 2 ulp on [-87, 88]. It is written as plain
// scalar code so that GCC vectorises it inside `#pragma omp simd` loops for whatever
// instruction set the build targets; the global build does not use -ffast-math, so libm's
// expf would not vectorise. Inputs below -87.3 (including -inf, the mask value) give exactly 0.
// exp_shift_sum, the softmax's hot loop, has AVX-512 and AVX2 paths of their own (exp_f32x16,
// exp_f32x8): GCC 12 does not vectorise exp_f32 in it (it keeps the clamps as branches), which
// left the softmax scalar on AVX2 machines (flash at 35% of the GEMM rate on a Zen 3).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace ab {

// The mask value: exp_f32 maps it (and anything below -87.3) to exactly 0.
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The constants of exp_f32 and its 16-lane twin: ln 2 in two parts for the reduction, the
// clamping range, and the polynomial's coefficients from the highest degree down.
namespace exp_consts {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kMin = -87.3365447505f;  // below this expf underflows to a denormal or 0
constexpr float kMax = 88.3762626647949f;
constexpr float kPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_consts

inline float exp_f32(float x) {
  using namespace exp_consts;
  const bool underflow = !(x >= kMin);  // also catches -inf (and NaN maps to 0 too)
  // Lanes that underflow compute exp(0) and are zeroed at the end: clamping them to kMin
  // instead would make p·2^-126 a denormal, which costs a microcode assist per vector (the
  // softmax of a masked row ran 2.2x slower on a Zen 3).
  const float xc = underflow ? 0.0f : (x > kMax ? kMax : x);
  // n = round(x / ln2) by the float magic-number trick (exact for |n| < 2^22).
  const float n = (xc * kLog2e + 12582912.0f) - 12582912.0f;
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kPoly[0];
  for (int c = 1; c < 6; ++c) p = p * r + kPoly[c];
  p = p * r * r + r + 1.0f;
  // 2^n; n in [-126, 127] after clamping, so the biased exponent is a normal one.
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  const float scaled = p * std::bit_cast<float>(bits);
  return underflow ? 0.0f : scaled;
}

#if defined(__AVX2__) && defined(__FMA__)
// exp_f32 on 8 lanes (AVX2 + FMA): the same reduction and polynomial, 2^n assembled in the
// exponent bits, the underflow test as a lane mask.
inline __m256 exp_f32x8(__m256 x) {
  using namespace exp_consts;
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(kMin), _CMP_GE_OQ);
  const __m256 xc = _mm256_min_ps(_mm256_and_ps(x, keep), _mm256_set1_ps(kMax));  // 0 where underflowing
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kPoly[0]);
  for (int c = 1; c < 6; ++c) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kPoly[c]));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

// The sum of the 8 lanes.
inline float sum_lanes(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
#endif

#if defined(__AVX512F__)
// exp_f32 on 16 lanes: the same reduction and polynomial, with 2^n applied by vscalefps (which
// GCC does not derive from the scalar bit assembly) and the underflow test as a lane mask.
inline __m512 exp_f32x16(__m512 x) {
  using namespace exp_consts;
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kMin), _CMP_GE_OQ);
  // Zero-masked forms (all lanes, or the kept ones): the plain max, min, roundscale and scalef
  // pass an undefined source that GCC 12 reports as maybe-uninitialized (GCC bug 105593).
  constexpr __mmask16 all = 0xFFFF;
  const __m512 xc = _mm512_maskz_min_ps(keep, x, _mm512_set1_ps(kMax));  // 0 where underflowing
  const __m512 n = _mm512_maskz_roundscale_ps(all, _mm512_mul_ps(xc, _mm512_set1_ps(kLog2e)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kPoly[0]);
  for (int c = 1; c < 6; ++c) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[c]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// 2^t on 16 lanes: t = n + f with n = round(t), 2^f = 1 + f P(f) on [-0.5, 0.5] (Cephes' exp2f
// polynomial, 1.6 ulp at most in float32), 2^n applied by vscalefps; t below -126 gives exactly 0
// (computed as 2^0 and zeroed, never as a denormal). For exp(s x - m) a kernel computes t =
// (s log2 e) x - m log2 e in one FMA, saving exp_f32x16's two-part reduction by ln 2: 11
// instructions instead of 14.
inline __m512 exp2_f32x16(__m512 t) {
  constexpr float kP[6] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                           5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f};
  constexpr __mmask16 all = 0xFFFF;
  const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
  const __m512 tc = _mm512_maskz_min_ps(keep, t, _mm512_set1_ps(127.0f));
  const __m512 n = _mm512_maskz_roundscale_ps(all, tc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(tc, n);
  __m512 p = _mm512_set1_ps(kP[0]);
  for (int c = 1; c < 6; ++c) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kP[c]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// The sum of the 16 lanes: the two halves added, then the 8-lane sum (_mm512_reduce_add_ps and
// the 512-to-256 cast trip the same GCC 12 warning).
inline float sum_lanes(__m512 v) {
  const __m256 lo = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(v), 0));
  const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(v), 1));
  return sum_lanes(_mm256_add_ps(lo, hi));
}
#endif


// y[i] = exp(x[i] - shift), returns the sum of y.
inline float exp_shift_sum(const float* x, float* y, int64_t n, float shift) {
#if defined(__AVX512F__)
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp_f32x16(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh));
    _mm512_storeu_ps(y + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 e = exp_f32x16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + i), sh));
    _mm512_mask_storeu_ps(y + i, tail, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(tail, e));
  }
  return sum_lanes(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_f32x8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (i < n) {  // the tail: lanes t < n - i; masked loads read 0 elsewhere, masked stores skip them
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n - i)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 e = _mm256_and_ps(exp_f32x8(_mm256_sub_ps(_mm256_maskload_ps(x + i, tail), sh)), _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(y + i, tail, e);
    acc = _mm256_add_ps(acc, e);
  }
  return sum_lanes(acc);
#else
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float e = exp_f32(x[i] - shift);
    y[i] = e;
    sum += e;
  }
  return sum;
#endif
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

// Asks for the cache lines of x[0, n) ahead of a random-order access (a gather by a permutation
// defeats the hardware prefetchers). for_write: the lines will be written.
inline void prefetch(const float* x, int64_t n, bool for_write = false) {
  constexpr int64_t kLineFloats = 64 / sizeof(float);
  for (int64_t i = 0; i < n; i += kLineFloats) {
    if (for_write)
      __builtin_prefetch(x + i, 1, 3);
    else
      __builtin_prefetch(x + i, 0, 3);
  }
}
// The same into L2 only (prefetcht1): for rows needed a few microseconds later, which should not
// displace what L1 holds for the work in between.
inline void prefetch_l2(const float* x, int64_t n) {
  constexpr int64_t kLineFloats = 64 / sizeof(float);
  for (int64_t i = 0; i < n; i += kLineFloats) __builtin_prefetch(x + i, 0, 2);
}

#if defined(__AVX2__) && defined(__FMA__)
// b(8 x 8, row stride ldb) = a(8 x 8, row stride lda)^T in registers.
inline void transpose8x8(const float* a, int64_t lda, float* b, int64_t ldb) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(a + i * lda);
  for (int i = 0; i < 8; i += 2) {  // interleave row pairs: t[i] = r[i][0] r[i+1][0] r[i][1] ...
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // gather four rows' columns per 128-bit lane
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {  // rows 0-3 and 4-7 of each column, as the two lanes
    _mm256_storeu_ps(b + i * ldb, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(b + (i + 4) * ldb, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

// b(n x m, row stride ldb) = a(m x n, row stride lda)^T: 8 x 8 blocks in registers on AVX2,
// element by element at the edges.
inline void transpose(const float* a, int64_t m, int64_t n, int64_t lda, float* b, int64_t ldb) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= m; i += 8) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) transpose8x8(a + i * lda + j, lda, b + j * ldb + i, ldb);
    for (; j < n; ++j)
      for (int64_t u = i; u < i + 8; ++u) b[j * ldb + u] = a[u * lda + j];
  }
#endif
  for (; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) b[j * ldb + i] = a[i * lda + j];
}

// y[i] = x[i] rounded to bf16 (to nearest even; the upper 16 bits of a float): vcvtneps2bf16
// where the build has AVX512-BF16, the same rounding in integer arithmetic elsewhere. Finite
// inputs only (a NaN's payload may round to infinity).
inline void to_bf16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(x[i]);
    y[i] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
}

// sum_i bf16(x_i) * y_i in float: x holds bf16 numbers (a bf16 number is a float's upper half).
inline float dot_bf16(const uint16_t* x, const float* y, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += std::bit_cast<float>(static_cast<uint32_t>(x[i]) << 16) * y[i];
  return s;
}

// to_bf16 over n elements in chunks shared out over the OpenMP threads (call it outside any
// parallel region).
inline void to_bf16_parallel(const float* x, uint16_t* y, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += kChunk) to_bf16(x + i, y + i, n - i < kChunk ? n - i : kChunk);
}

inline void fill(float* x, int64_t n, float v) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

}  // namespace ab
