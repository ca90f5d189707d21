// The exact random-rotation hash (see lsh_hash.hpp for the argument). Per block of 64 rows:
//   1. quantise the rows to int16 pairs, transposed so that 8 rows fill a vector;
//   2. per round and 16-row group, s^T(half, 16) = R^T x^T by 16-bit multiply-adds (AVX2:
//      16 rows x 6 columns of int32 accumulators in registers);
//   3. one pass over the half columns keeps each row's largest |s^|, its column and the second
//      largest;
//   4. per row: the top column and its sign where the gap proves them, else the exact path.
#include "attention_impls/lsh_hash.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "core/vecmath.hpp"  // dot, and <immintrin.h> on AVX2 builds

namespace ab {
namespace {

constexpr double kXNorm = 32000.0;  // the norm of every quantised row (int16 holds 32767)
constexpr int64_t kBlockRows = 64;  // rows quantised together; every round's R^ is swept per block
constexpr int64_t kGroup = 16;      // rows per product and argmax step (two AVX2 vectors)
constexpr int64_t kCols = 6;        // columns per product step (12 accumulators)

int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

// Scratch (int32 units): xg (the block's x^ pairs, per 16-row group (pairs, 16)), l1x (per row),
// sT (half, 16) (a group's s^ for one round), t1, t2, arg (per row of the group).
struct Scratch {
  int32_t *xg, *l1x, *sT, *t1, *t2, *arg;
  static int64_t ints(int64_t pairs, int64_t half) {
    return round8(kBlockRows * pairs) + round8(kBlockRows) + round8(kGroup * half) + 3 * kGroup;
  }
  Scratch(void* p, int64_t pairs, int64_t half) {
    int32_t* at = static_cast<int32_t*>(p);
    xg = at, at += round8(kBlockRows * pairs);
    l1x = at, at += round8(kBlockRows);
    sT = at, at += round8(kGroup * half);
    t1 = at, at += kGroup;
    t2 = at, at += kGroup;
    arg = at;
  }
};

int32_t pair_of(int32_t lo, int32_t hi) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
}

// Elements k and k + 1 of v (the second 0 past n), scaled, rounded to nearest even and packed
// as one int16 pair; adds their magnitudes to l1. T is float for rows (as the AVX2 path
// multiplies) and double for the rotations.
template <class T>
int32_t rounded_pair(const float* v, int64_t stride, int64_t k, int64_t n, T scale, int32_t& l1) {
  const auto lo = static_cast<int32_t>(std::nearbyint(scale * static_cast<T>(v[k * stride])));
  const auto hi = k + 1 < n ? static_cast<int32_t>(std::nearbyint(scale * static_cast<T>(v[(k + 1) * stride]))) : 0;
  l1 += std::abs(lo) + std::abs(hi);
  return pair_of(lo, hi);
}

// x^ = round(alpha·x) with alpha = 32000·inv (inv = 1/||x||; alpha 0 or not finite for a zero or
// non-finite row: x^ = 0 sends it to the exact path). Writes group row j's pairs at
// xg[kp * 16 + j]; returns ||x^||_1.
template <bool Portable>
int32_t quantise_row(const float* x, int64_t D, float inv, int32_t* xg, int64_t j) {
  const float alpha = static_cast<float>(kXNorm) * inv;
  if (!(alpha > 0.0f && std::isfinite(alpha))) {  // not alpha·x: 0·inf and 0·NaN are NaN
    for (int64_t kp = 0; kp < (D + 1) / 2; ++kp) xg[kp * kGroup + j] = 0;
    return 0;
  }
  int32_t l1 = 0;
  int64_t k = 0;
#if defined(__AVX2__)
  if constexpr (!Portable) {
    const __m256 a = _mm256_set1_ps(alpha);
    __m256i acc = _mm256_setzero_si256();
    for (; k + 8 <= D; k += 8) {
      // cvtps rounds to nearest even, as nearbyint does in the default rounding mode.
      const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_loadu_ps(x + k)));
      acc = _mm256_add_epi32(acc, _mm256_abs_epi32(q));
      // Within each 128-bit lane, int32 elements 0 and 1 of packs(q, q) are the lane's two pairs.
      const __m256i p = _mm256_packs_epi32(q, q);
      const int64_t kp = k / 2;
      xg[(kp + 0) * kGroup + j] = _mm256_extract_epi32(p, 0);
      xg[(kp + 1) * kGroup + j] = _mm256_extract_epi32(p, 1);
      xg[(kp + 2) * kGroup + j] = _mm256_extract_epi32(p, 4);
      xg[(kp + 3) * kGroup + j] = _mm256_extract_epi32(p, 5);
    }
    alignas(32) int32_t parts[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(parts), acc);
    for (int32_t v : parts) l1 += v;
  }
#endif
  for (; k < D; k += 2) xg[(k / 2) * kGroup + j] = rounded_pair(x, 1, k, D, alpha, l1);
  return l1;
}

// sT[c * 16 + j] = s^ of group row j and column c, for columns [c0, c0 + NC).
template <int NC>
void product_portable(const int32_t* xg, const int32_t* Rr, int64_t half, int64_t pairs, int64_t c0, int32_t* sT) {
  for (int j = 0; j < NC; ++j)
    for (int64_t i = 0; i < kGroup; ++i) {
      int64_t acc = 0;
      for (int64_t kp = 0; kp < pairs; ++kp) {
        const int32_t a = xg[kp * kGroup + i], b = Rr[kp * half + c0 + j];
        acc += static_cast<int64_t>(static_cast<int16_t>(a & 0xffff)) * static_cast<int16_t>(b & 0xffff) +
               static_cast<int64_t>(static_cast<int16_t>(a >> 16)) * static_cast<int16_t>(b >> 16);
      }
      sT[(c0 + j) * kGroup + i] = static_cast<int32_t>(acc);  // |acc| < 2^31 by the scales
    }
}

#if defined(__AVX2__)
// acc += madd(x, b). Written as one asm pair because GCC 12 otherwise puts each sum in a fresh
// register and copies it back, and spills an accumulator: 70-90 instead of 110-124 Gop/s for
// this kernel on a Zen 4 without AVX-512. "x" keeps the operands in ymm0-15 (VEX-encodable).
inline void madd_add(__m256i& acc, __m256i x, __m256i b) {
  __m256i t;
  asm("vpmaddwd %[b], %[x], %[t]\n\tvpaddd %[t], %[acc], %[acc]"
      : [acc] "+x"(acc), [t] "=&x"(t)
      : [x] "x"(x), [b] "x"(b));
}

// product_portable for AVX2: the group's 16 rows as two vectors, NC columns broadcast.
template <int NC>
void product_avx2(const int32_t* xg, const int32_t* Rr, int64_t half, int64_t pairs, int64_t c0, int32_t* sT) {
  // Every loop over the columns is unrolled, so that the accumulators live in registers.
  __m256i a0[NC], a1[NC];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) a0[j] = a1[j] = _mm256_setzero_si256();
  const int32_t* r = Rr + c0;
  for (int64_t kp = 0; kp < pairs; ++kp, r += half) {
    const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xg + kp * kGroup));
    const __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(xg + kp * kGroup + 8));
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) {
      // The pair as a float bit pattern: vbroadcastss from memory is a pure load on Zen, where
      // the integer vpbroadcastd also takes a vector ALU slot (about 10% of this loop's rate).
      float pair;
      std::memcpy(&pair, r + j, sizeof(pair));
      const __m256i b = _mm256_castps_si256(_mm256_set1_ps(pair));
      madd_add(a0[j], x0, b);
      madd_add(a1[j], x1, b);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(sT + (c0 + j) * kGroup), a0[j]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(sT + (c0 + j) * kGroup + 8), a1[j]);
  }
}
#endif

template <bool Portable, int NC>
void product(const int32_t* xg, const int32_t* Rr, int64_t half, int64_t pairs, int64_t c0, int32_t* sT) {
#if defined(__AVX2__)
  if constexpr (!Portable) return product_avx2<NC>(xg, Rr, half, pairs, c0, sT);
#endif
  product_portable<NC>(xg, Rr, half, pairs, c0, sT);
}

// All half columns of one group and round, kCols at a time, then the rest.
template <bool Portable>
void product_group(const int32_t* xg, const int32_t* Rr, int64_t half, int64_t pairs, int32_t* sT) {
  int64_t c0 = 0;
  for (; c0 + kCols <= half; c0 += kCols) product<Portable, kCols>(xg, Rr, half, pairs, c0, sT);
  switch (half - c0) {
    case 1: return product<Portable, 1>(xg, Rr, half, pairs, c0, sT);
    case 2: return product<Portable, 2>(xg, Rr, half, pairs, c0, sT);
    case 3: return product<Portable, 3>(xg, Rr, half, pairs, c0, sT);
    case 4: return product<Portable, 4>(xg, Rr, half, pairs, c0, sT);
    case 5: return product<Portable, 5>(xg, Rr, half, pairs, c0, sT);
    default: return;
  }
}

// Per group row j: t1 = max_c |s^_c|, arg = its first column, t2 = the largest |s^_c| of the
// other columns (-1 when half = 1; equal to t1 on a tie).
template <bool Portable>
void top_two(const int32_t* sT, int64_t half, int32_t* t1, int32_t* t2, int32_t* arg) {
#if defined(__AVX2__)
  if constexpr (!Portable) {
    __m256i m1[2], m2[2], ix[2];
    for (int v = 0; v < 2; ++v) m1[v] = m2[v] = _mm256_set1_epi32(-1), ix[v] = _mm256_setzero_si256();
    __m256i col = _mm256_setzero_si256();
    const __m256i one = _mm256_set1_epi32(1);
    for (int64_t c = 0; c < half; ++c) {
      for (int v = 0; v < 2; ++v) {
        const __m256i a = _mm256_abs_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(sT + c * kGroup + 8 * v)));
        m2[v] = _mm256_max_epi32(m2[v], _mm256_min_epi32(a, m1[v]));
        ix[v] = _mm256_blendv_epi8(ix[v], col, _mm256_cmpgt_epi32(a, m1[v]));
        m1[v] = _mm256_max_epi32(m1[v], a);
      }
      col = _mm256_add_epi32(col, one);
    }
    for (int v = 0; v < 2; ++v) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(t1 + 8 * v), m1[v]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(t2 + 8 * v), m2[v]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(arg + 8 * v), ix[v]);
    }
    return;
  }
#endif
  for (int64_t j = 0; j < kGroup; ++j) t1[j] = t2[j] = -1, arg[j] = 0;
  for (int64_t c = 0; c < half; ++c)
    for (int64_t j = 0; j < kGroup; ++j) {
      const int32_t a = std::abs(sT[c * kGroup + j]);
      t2[j] = std::max(t2[j], std::min(a, t1[j]));
      if (a > t1[j]) t1[j] = a, arg[j] = static_cast<int32_t>(c);
    }
}

// The exact path for one row: among the columns whose |s^_c| reaches `floor` (a superset of
// those that can hold the maximum), argmax over [x·r_c ; -x·r_c] in double, first index on
// ties. Products of two floats are exact in double, so only the sums round. A NaN row keeps 0.
int64_t exact_bucket(const float* x, const float* R, int64_t D, int64_t half, const int32_t* sT, int64_t j,
                     int64_t floor) {
  double hi = -std::numeric_limits<double>::infinity(), lo = std::numeric_limits<double>::infinity();
  int64_t arg_hi = 0, arg_lo = 0;
  for (int64_t c = 0; c < half; ++c) {
    if (std::abs(static_cast<int64_t>(sT[c * kGroup + j])) < floor) continue;
    double p = 0.0;
    for (int64_t k = 0; k < D; ++k) p += static_cast<double>(x[k]) * static_cast<double>(R[k * half + c]);
    if (p > hi) hi = p, arg_hi = c;
    if (p < lo) lo = p, arg_lo = c;
  }
  // The +x·R half comes first, so it wins a tie between max(x·R) and max(-x·R) = -min(x·R).
  return hi >= -lo ? arg_hi : half + arg_lo;
}

}  // namespace

void inverse_norms(const float* x, int64_t ldx, int64_t rows, int64_t D, float* inv) {
  for (int64_t i = 0; i < rows; ++i) {
    const float n2 = dot(x + i * ldx, x + i * ldx, D);
    inv[i] = n2 > 0.0f ? 1.0f / std::sqrt(n2) : 0.0f;  // 1/sqrt(inf) = 0; NaN fails the test
  }
}

size_t RotationHash::packed_bytes(int64_t rounds, int64_t D, int64_t half) {
  return static_cast<size_t>(rounds * ((D + 1) / 2) * half + rounds) * sizeof(int32_t);
}

size_t RotationHash::scratch_bytes(int64_t D, int64_t half) {
  return static_cast<size_t>(Scratch::ints((D + 1) / 2, half)) * sizeof(int32_t);
}

RotationHash::RotationHash(const float* rotations, int64_t round_stride, int64_t rounds, int64_t D, int64_t half)
    : rotations_(rotations), round_stride_(round_stride), rounds_(rounds), D_(D), half_(half), pairs_((D + 1) / 2) {
  if (D < 1 || D > 65536 || half < 1 || rounds < 1)
    throw std::invalid_argument("RotationHash: needs 1 <= D <= 65536, half >= 1 and rounds >= 1");
  packed_ = Buffer<int32_t>(packed_bytes(rounds, D, half) / sizeof(int32_t));
  repack();
}

void RotationHash::repack() {
  const int64_t rounds = rounds_, D = D_, half = half_;
  const float* rotations = rotations_;
  const int64_t round_stride = round_stride_;
  int32_t* l1r = packed_.data() + rounds * pairs_ * half;
  // ||x^||_2 is at most 32000 (1 + (D+2)·2^-23) (alpha and ||x|| round in float) plus the
  // rounding errors' norm 0.502·sqrt(D); R^'s scale keeps ||x^||_2·||r^_c||_2 < 2^31, which
  // bounds every partial sum of the int32 accumulators, and its entries within int16.
  const double rounding = 0.51 * std::sqrt(static_cast<double>(D));
  const double xn = kXNorm * (1.0 + static_cast<double>(D + 2) * 0x1p-23) + rounding;
  const double rn = 2147483647.0 / xn - rounding;
  for (int64_t r = 0; r < rounds; ++r) {
    const float* R = rotations + r * round_stride;
    double max_abs = 0.0, max_norm = 0.0;
    for (int64_t c = 0; c < half; ++c) {
      double n2 = 0.0;
      for (int64_t k = 0; k < D; ++k) {
        const double v = R[k * half + c];
        n2 += v * v;
        max_abs = std::max(max_abs, std::abs(v));
      }
      max_norm = std::max(max_norm, std::sqrt(n2));
    }
    const double scale = max_abs > 0.0 ? std::min(kXNorm / max_abs, rn / max_norm) : 1.0;
    int32_t* Rr = packed_.data() + r * pairs_ * half;
    int32_t worst = 0;
    for (int64_t c = 0; c < half; ++c) {
      int32_t l1 = 0;
      for (int64_t kp = 0; kp < pairs_; ++kp) Rr[kp * half + c] = rounded_pair(R + c, half, 2 * kp, D, scale, l1);
      worst = std::max(worst, l1);
    }
    l1r[r] = worst;
  }
}

int64_t RotationHash::assign(const float* x, int64_t ldx, int64_t rows, const float* inv, void* scratch,
                             int64_t* buckets, int64_t bucket_stride) const {
  return assign_impl<false>(x, ldx, rows, inv, scratch, buckets, bucket_stride);
}

int64_t RotationHash::assign_portable(const float* x, int64_t ldx, int64_t rows, const float* inv, void* scratch,
                                      int64_t* buckets, int64_t bucket_stride) const {
  return assign_impl<true>(x, ldx, rows, inv, scratch, buckets, bucket_stride);
}

template <bool Portable>
int64_t RotationHash::assign_impl(const float* x, int64_t ldx, int64_t rows, const float* inv, void* scratch,
                                  int64_t* buckets, int64_t bucket_stride) const {
  const Scratch s(scratch, pairs_, half_);
  const int32_t* l1r = packed_.data() + rounds_ * pairs_ * half_;
  int64_t exact = 0;
  for (int64_t i0 = 0; i0 < rows; i0 += kBlockRows) {
    const int64_t n = std::min(kBlockRows, rows - i0), groups = (n + kGroup - 1) / kGroup;
    // 1. Quantise; the last group's missing rows are zero (their buckets are not written).
    for (int64_t j = 0; j < groups * kGroup; ++j) {
      int32_t* xg = s.xg + (j / kGroup) * pairs_ * kGroup;
      if (j < n) {
        s.l1x[j] = quantise_row<Portable>(x + (i0 + j) * ldx, D_, inv[i0 + j], xg, j % kGroup);
        continue;
      }
      for (int64_t kp = 0; kp < pairs_; ++kp) xg[kp * kGroup + j % kGroup] = 0;
      s.l1x[j] = 0;
    }
    for (int64_t r = 0; r < rounds_; ++r) {
      const int32_t* Rr = packed_.data() + r * pairs_ * half_;
      int64_t* out = buckets + r * bucket_stride + i0;
      for (int64_t g = 0; g < groups; ++g) {
        // 2.-3. The group's s^ for every column, and each row's two largest |s^|.
        product_group<Portable>(s.xg + g * pairs_ * kGroup, Rr, half_, pairs_, s.sT);
        top_two<Portable>(s.sT, half_, s.t1, s.t2, s.arg);
        // 4. The gap test: G > 2E (integer: 1.004 S <= S + S/128 + 1, 0.504 D <= D).
        for (int64_t j = 0; j < std::min(kGroup, n - g * kGroup); ++j) {
          const int64_t row = g * kGroup + j;
          const int64_t S = static_cast<int64_t>(s.l1x[row]) + l1r[r];
          const int64_t G = S + (S >> 7) + D_ + 2;
          const int64_t top = s.t1[j];
          if (top - G > std::max<int64_t>(s.t2[j], 0)) {
            const int64_t c = s.arg[j];
            out[row] = s.sT[c * kGroup + j] < 0 ? half_ + c : c;
            continue;
          }
          out[row] = exact_bucket(x + (i0 + row) * ldx, rotations_ + r * round_stride_, D_, half_, s.sT, j, top - G);
          ++exact;
        }
      }
    }
  }
  return exact;
}

}  // namespace ab
