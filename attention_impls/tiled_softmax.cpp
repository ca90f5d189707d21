#include "attention_impls/tiled_softmax.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "core/vecmath.hpp"

namespace ab {
namespace {

constexpr int kDiagRows = TiledSoftmax::kDiagonalRows;  // one query row per lane

std::vector<int64_t> block_sizes(int64_t n, int64_t block) {
  std::vector<int64_t> v;
  if (n >= block) v.push_back(block);
  if (n % block) v.push_back(n % block);
  return v;
}

// The dense kernel's row stride of a transposed key tile of tile_cols keys.
inline int64_t dense_ldkt(int64_t tile_cols) { return (tile_cols + 15) / 16 * 16; }

#if defined(__AVX512F__)
// The diagonal kernel: softmax attention of 16 query rows (one per lane) over the union of their
// key ranges [lo, hi), each row masked to its own range. A band's rows use 2w + 1 keys each and
// the 16 rows together 2w + 16, so at w = 64 it scores 144 keys to use 129 (a 48-row tile scores
// 176). The passes:
//   1. Qt (D x 16) = Q rows transposed: each logit vector is 16 rows' scores of one key.
//   2. St (keys x 16) = K Qt: 24 keys at a time in registers, each key's D entries broadcast.
//   3. per lane: masked max, P = exp(s St - m'), l = l e^(m - m') + sum P.
//   4. O (rows x D) = O e^(m - m') + P^T V: 6 rows at a time (24 accumulators), each over the
//      keys of its own rows only.
constexpr int kDiagKeys = 24, kDiagGroup = 6;
// BF16 (TiledSoftmaxShape::bf16_tiles, a build for AVX512-BF16): Q, K, V are bf16 rows (strides
// in bf16 numbers); Qt holds pairs along D (D/2 x 16, one 32-bit pair per lane), pass 2 adds two
// products per lane with vdpbf16ps, pass 3 is unchanged (float), and pass 4 rounds P to bf16 in
// pairs of consecutive keys (the prefix keys' and the band's apart) and multiplies it by V's
// rows interleaved in the same pairs.
template <bool BF16>
using DiagIn = std::conditional_t<BF16, uint16_t, float>;

#if defined(__AVX512BF16__)
// The word indices that interleave 16 bf16 numbers a0..a15 (at 0) with b0..b15 (at `b`) to
// (a0, b0, a1, b1, ...): b = 16 for the two halves of one vector (permutexvar), 32 for the low
// halves of two (permutex2var).
inline __m512i bf16_interleave(int b) {
  alignas(64) int16_t order[32];
  for (int i = 0; i < 16; ++i) {
    order[2 * i] = static_cast<int16_t>(i);
    order[2 * i + 1] = static_cast<int16_t>(b + i);
  }
  return _mm512_load_si512(order);
}
inline __m512bh bf16_pair_at(const uint16_t* x) {
  int32_t pair;
  std::memcpy(&pair, x, sizeof pair);
  return (__m512bh)_mm512_set1_epi32(pair);
}
#endif

template <int D, int C, bool BF16>
inline void diag_logits(const float* Qt, const DiagIn<BF16>* K, int64_t ldk, float* St) {
  __m512 acc[C];
  for (int j = 0; j < C; ++j) acc[j] = _mm512_setzero_ps();
#if defined(__AVX512BF16__)
  if constexpr (BF16) {
    for (int d = 0; d < D / 2; ++d) {
      const __m512bh q = (__m512bh)_mm512_castps_si512(_mm512_loadu_ps(Qt + d * kDiagRows));
#pragma GCC unroll 24
      for (int j = 0; j < C; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], bf16_pair_at(K + j * ldk + 2 * d), q);
    }
  } else
#endif
  {
    for (int d = 0; d < D; ++d) {
      const __m512 q = _mm512_loadu_ps(Qt + d * kDiagRows);
#pragma GCC unroll 24
      for (int j = 0; j < C; ++j) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(K[j * ldk + d])), q, acc[j]);
    }
  }
  for (int j = 0; j < C; ++j) _mm512_storeu_ps(St + j * kDiagRows, acc[j]);
}

// St (n x 16) = the logits of n keys (rows of K, stride ldk) against Qt, 24, 8 or 1 at a time.
template <int D, bool BF16 = false>
inline void diag_logits_keys(const float* Qt, const DiagIn<BF16>* K, int64_t ldk, int64_t n, float* St) {
  int64_t c = 0;
  for (; c + kDiagKeys <= n; c += kDiagKeys) diag_logits<D, kDiagKeys, BF16>(Qt, K + c * ldk, ldk, St + c * kDiagRows);
  for (; c + 8 <= n; c += 8) diag_logits<D, 8, BF16>(Qt, K + c * ldk, ldk, St + c * kDiagRows);
  for (; c < n; ++c) diag_logits<D, 1, BF16>(Qt, K + c * ldk, ldk, St + c * kDiagRows);
}

// acc[g] += sum over keys [c0, c1) of P[c][g0 + g] V[c].
template <int D, int G>
inline void diag_accumulate(__m512 (&acc)[G][D / 16], const float* Pt, int g0, int64_t c0, int64_t c1,
                            const float* V, int64_t ldv) {
  constexpr int NV = D / 16;
  for (int64_t c = c0; c < c1; ++c) {
    __m512 v[NV];
    for (int j = 0; j < NV; ++j) v[j] = _mm512_loadu_ps(V + c * ldv + 16 * j);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512 p = _mm512_set1_ps(Pt[c * kDiagRows + g0 + g]);
      for (int j = 0; j < NV; ++j) acc[g][j] = _mm512_fmadd_ps(p, v[j], acc[g][j]);
    }
  }
}

#if defined(__AVX512BF16__)
// The same in bf16 over the n keys' pairs [q0, q1): Pp holds each pair's probabilities (16 lanes
// of (P[2q], P[2q + 1]) in bf16), V is bf16 (n rows, stride ldv); an odd last key pairs with 0.
template <int D, int G>
inline void diag_accumulate_bf16(__m512 (&acc)[G][D / 16], const float* Pp, int g0, int64_t q0, int64_t q1,
                                 const uint16_t* V, int64_t ldv, int64_t n, __m512i interleave) {
  constexpr int NV = D / 16;
  for (int64_t q = q0; q < q1; ++q) {
    const uint16_t* a = V + 2 * q * ldv;
    const __mmask32 second = 2 * q + 1 < n ? 0xFFFF : 0;  // an odd last key: its partner is 0
    __m512bh v[NV];
    for (int j = 0; j < NV; ++j) {
      const __m512i x = _mm512_maskz_loadu_epi16(0xFFFF, a + 16 * j), y = _mm512_maskz_loadu_epi16(second, a + ldv + 16 * j);
      v[j] = (__m512bh)_mm512_permutex2var_epi16(x, interleave, y);
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      const __m512bh p = (__m512bh)_mm512_set1_epi32(reinterpret_cast<const int32_t*>(Pp)[q * kDiagRows + g0 + g]);
      for (int j = 0; j < NV; ++j) acc[g][j] = _mm512_dpbf16_ps(acc[g][j], p, v[j]);
    }
  }
}
#endif

// O rows g0 .. g0 + G of the block: O = O * corr (when `accumulate`) + sum over the prefix keys
// [0, np) (probabilities Pp, values VP) and the band's keys [c0, c1) (Pt, V) of P[c][row] V[c].
// BF16: P in pairs (Pp, Pt: see diag_accumulate_bf16), VP and V bf16; n the band's rows.
template <int D, int G, bool BF16 = false>
inline void diag_values(const float* Pp, const DiagIn<BF16>* VP, int64_t ldvp, int64_t np, const float* Pt, int g0,
                        int64_t c0, int64_t c1, const DiagIn<BF16>* V, int64_t ldv, int64_t n, float* O, int64_t ldo,
                        const float* corr, bool accumulate) {
  constexpr int NV = D / 16;
  __m512 acc[G][NV];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < NV; ++j) acc[g][j] = _mm512_setzero_ps();
#if defined(__AVX512BF16__)
  if constexpr (BF16) {
    const __m512i interleave = bf16_interleave(32);
    if (np > 0) diag_accumulate_bf16<D, G>(acc, Pp, g0, 0, (np + 1) / 2, VP, ldvp, np, interleave);
    // Pairs from an even key: a pair's other key is outside every row of the group (0 there).
    diag_accumulate_bf16<D, G>(acc, Pt, g0, c0 / 2, (c1 + 1) / 2, V, ldv, n, interleave);
  } else
#endif
  {
    (void)n;
    if (np > 0) diag_accumulate<D, G>(acc, Pp, g0, 0, np, VP, ldvp);
    diag_accumulate<D, G>(acc, Pt, g0, c0, c1, V, ldv);
  }
  for (int g = 0; g < G; ++g) {
    float* o = O + (g0 + g) * ldo;
    if (accumulate) {
      const __m512 s = _mm512_set1_ps(corr[g0 + g]);
      for (int j = 0; j < NV; ++j) acc[g][j] = _mm512_fmadd_ps(_mm512_loadu_ps(o + 16 * j), s, acc[g][j]);
    }
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + 16 * j, acc[g][j]);
  }
}

// Up to 16 query rows (Q, O: row strides ldq, ldo) of one (b, h). ranges: each row's admissible
// keys [lo_r, hi_r) (absolute, non-decreasing in both ends); K and V point at key 0. Every row
// also uses the np prefix keys KP, VP (Longformer's global keys; np = 0: none). self0: the key
// index of row 0 when a row may not use its own key (exclude_self), else -1. m, l: the online
// softmax's running max and sum per row, O its output so far when `accumulate`. work: 16 (D +
// np + keys of the block) floats. BF16 (see above): Q, K, V, KP, VP bf16, and pairs: 16 ((np + 1)
// / 2 + (keys + 1) / 2) floats for P's pairs.
template <int D, bool BF16 = false>
void diagonal_rows(int rows, const DiagIn<BF16>* Q, int64_t ldq, const DiagIn<BF16>* K, int64_t ldk,
                   const DiagIn<BF16>* V, int64_t ldv, const DiagIn<BF16>* KP, int64_t ldkp, const DiagIn<BF16>* VP, int64_t ldvp,
                   int64_t np, const int64_t* ranges, int64_t self0, float scale, float* O, int64_t ldo, float* m,
                   float* l, bool accumulate, float* work, float* pairs = nullptr) {
  const int64_t lo = ranges[0], hi = ranges[2 * (rows - 1) + 1];
  float* Qt = work;
  float* Sp = work + D * kDiagRows;  // the prefix keys' logits, then the band's
  float* St = Sp + np * kDiagRows;
  // Pass 1: Qt (rows past `rows` are zero); BF16: pairs along D.
  if constexpr (BF16) {
    for (int r = 0; r < kDiagRows; ++r)
      for (int d = 0; d < D / 2; ++d) {
        uint32_t pair = 0;
        if (r < rows) std::memcpy(&pair, Q + r * ldq + 2 * d, sizeof pair);
        std::memcpy(Qt + d * kDiagRows + r, &pair, sizeof pair);
      }
  } else {
    for (int r = 0; r < kDiagRows; ++r)
      for (int d = 0; d < D; ++d) Qt[d * kDiagRows + r] = r < rows ? Q[r * ldq + d] : 0.0f;
  }
  // Pass 2: Sp over the prefix keys, St over the keys [lo, hi).
  const int64_t n = hi - lo;
  diag_logits_keys<D, BF16>(Qt, KP, ldkp, np, Sp);
  diag_logits_keys<D, BF16>(Qt, K + lo * ldk, ldk, n, St);
  // Pass 3: the lanes of key c are the rows whose range holds it.
  alignas(64) int32_t first[kDiagRows], last[kDiagRows];
  for (int r = 0; r < kDiagRows; ++r) {
    first[r] = r < rows ? static_cast<int32_t>(ranges[2 * r] - lo) : 1;
    last[r] = r < rows ? static_cast<int32_t>(ranges[2 * r + 1] - lo) : 0;
  }
  const __m512i vfirst = _mm512_load_si512(first), vlast = _mm512_load_si512(last);
  auto lanes = [&](int64_t cc) {
    const __m512i key = _mm512_set1_epi32(static_cast<int32_t>(cc));
    __mmask16 k = _mm512_cmple_epi32_mask(vfirst, key) & _mm512_cmplt_epi32_mask(key, vlast);
    if (self0 >= 0) {
      const int64_t r = lo + cc - self0;  // the row whose own key this is
      if (r >= 0 && r < kDiagRows) k &= static_cast<__mmask16>(~(1u << r));
    }
    return k;
  };
  const __mmask16 all_rows = static_cast<__mmask16>((1u << rows) - 1);  // the prefix keys' lanes
  __m512 raw_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t cc = 0; cc < np; ++cc) raw_max = _mm512_mask_max_ps(raw_max, all_rows, raw_max, _mm512_loadu_ps(Sp + cc * kDiagRows));
  for (int64_t cc = 0; cc < n; ++cc) raw_max = _mm512_mask_max_ps(raw_max, lanes(cc), raw_max, _mm512_loadu_ps(St + cc * kDiagRows));
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 m_old = _mm512_loadu_ps(m);
  const __m512 m_new = _mm512_maskz_max_ps(0xFFFF, m_old, _mm512_mul_ps(raw_max, vscale));
  // e^(m - m'): 0 where there was no key before (m = -inf), so -inf - -inf is never taken.
  const __mmask16 had = _mm512_cmp_ps_mask(m_old, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_NEQ_OQ);
  const __m512 corr = _mm512_maskz_mov_ps(had, exp_f32x16(_mm512_maskz_sub_ps(had, m_old, m_new)));
  // P = exp(s S - m') on the given lanes (0 elsewhere), in place; their sum added to `sum`.
  __m512 sum = _mm512_setzero_ps();
  auto exp_key = [&](float* S, __mmask16 k) {
    const __m512 p = _mm512_maskz_mov_ps(k, exp_f32x16(_mm512_maskz_fmsub_ps(k, _mm512_loadu_ps(S), vscale, m_new)));
    _mm512_storeu_ps(S, p);
    sum = _mm512_add_ps(sum, p);
  };
  for (int64_t cc = 0; cc < np; ++cc) exp_key(Sp + cc * kDiagRows, all_rows);
  for (int64_t cc = 0; cc < n; ++cc) exp_key(St + cc * kDiagRows, lanes(cc));
  _mm512_storeu_ps(l, _mm512_fmadd_ps(_mm512_loadu_ps(l), corr, sum));
  _mm512_storeu_ps(m, m_new);
  alignas(64) float corr_rows[kDiagRows];
  _mm512_store_ps(corr_rows, corr);
  // Pass 4: each group of rows over the keys its rows use (BF16: P to bf16 pairs of keys first).
  const DiagIn<BF16>* Vlo = V + lo * ldv;
  const float* Pv = St;
  const float* Ppv = Sp;
#if defined(__AVX512BF16__)
  if constexpr (BF16) {
    // P's pairs of keys: rows (16 lanes) 2q and 2q + 1 of X (x keys) to pair q of out.
    const __m512i interleave = bf16_interleave(16);
    auto to_pairs = [&](const float* X, int64_t x, float* out) {
      for (int64_t q = 0; q < (x + 1) / 2; ++q) {
        const __m512 second = 2 * q + 1 < x ? _mm512_loadu_ps(X + (2 * q + 1) * kDiagRows) : _mm512_setzero_ps();
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(second, _mm512_loadu_ps(X + 2 * q * kDiagRows));
        _mm512_storeu_si512(out + q * kDiagRows, _mm512_permutexvar_epi16(interleave, both));
      }
    };
    float* band_pairs = pairs + (np + 1) / 2 * kDiagRows;
    to_pairs(Sp, np, pairs);
    to_pairs(St, n, band_pairs);
    Ppv = pairs;
    Pv = band_pairs;
  }
#endif
  for (int g0 = 0; g0 < rows; g0 += kDiagGroup) {
    const int G = std::min(kDiagGroup, rows - g0);
    const int64_t c0 = ranges[2 * g0] - lo, c1 = ranges[2 * (g0 + G - 1) + 1] - lo;
    switch (G) {
#define AB_DIAG_GROUP(g) \
  case g: diag_values<D, g, BF16>(Ppv, VP, ldvp, np, Pv, g0, c0, c1, Vlo, ldv, n, O, ldo, corr_rows, accumulate); break;
      AB_DIAG_GROUP(1) AB_DIAG_GROUP(2) AB_DIAG_GROUP(3) AB_DIAG_GROUP(4) AB_DIAG_GROUP(5) AB_DIAG_GROUP(6)
#undef AB_DIAG_GROUP
    }
  }
}

// The dense kernel: s Q K^T attention, dense or causal, without a oneDNN call per tile.
//   0. Kt = every key tile of every (b, h) transposed (D x cols, columns padded to 16), once per
//      call, before the query blocks (each block would otherwise transpose every key tile
//      again: 8% of the time at N = 2048 with 128-row blocks).
//   then per block of query rows, per key tile, per strip of R query rows (R = 6 at D <= 64,
//   3 at D = 128):
//   1. S (R x cols) = Q_strip Kt: R rows x 64 columns in registers, each query entry broadcast
//      against 64 columns of Kt; each row's maximum taken on the way out of the registers when
//      every column of the strip is admissible. S stays in L1 (6 KiB at 256 columns).
//   2. per row: m' = max(m, s max S), P = exp(s S - m'), l = l e^(m - m') + sum P; zero past
//      the row's last key (causal).
//   3. O_strip = O_strip e^(m - m') + P V_tile: R x D accumulators in registers, each
//      probability broadcast against a row of V; O is read and written once per tile.
// Against the oneDNN path (a matmul call per 128 x 256 tile for S and for P V, the softmax a
// separate sweep over the 128 KiB S tile in L2) the scores never leave L1 and no call packs K.
template <int D>
constexpr int dense_strip_rows() {
  return D <= 64 ? 6 : 3;
}

// Pass 0 for one (b, h): Kt, tile after tile (each D x ldkt floats), from K (Nk x D, row stride ldk).
template <int D>
void dense_pack_keys(const float* K, int64_t ldk, int64_t Nk, int64_t tile_cols, float* Kt) {
  const int64_t ldkt = dense_ldkt(tile_cols);
  for (int64_t c0 = 0; c0 < Nk; c0 += tile_cols, Kt += D * ldkt) {
    const int64_t cols = std::min(tile_cols, Nk - c0), cols16 = (cols + 15) / 16 * 16;
    const float* Kc = K + c0 * ldk;
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8)
      for (int d = 0; d < D; d += 8) transpose8x8(Kc + c * ldk + d, ldk, Kt + d * ldkt + c, ldkt);
    for (; c < cols; ++c)
      for (int d = 0; d < D; ++d) Kt[d * ldkt + c] = Kc[c * ldk + d];
    if (cols16 > cols)
      for (int d = 0; d < D; ++d) fill(Kt + d * ldkt + cols, cols16 - cols, 0.0f);
  }
}

#if defined(__AVX512BF16__)
// Pass 0 of the bf16 kernel for one (b, h): the inputs rounded to bf16 (to nearest even) in the
// layouts vdpbf16ps multiplies, each float holding two bf16 numbers:
//   Qb (Nq x D/2): Q's rows, pairs along D (bf16 row-major);
//   Kb: per key tile (D/2 x ldkt): pairs along D, one column per key (Kt's layout, in pairs);
//   Vb (ceil(Nk/2) x D): pairs of consecutive keys, one column per entry of D (an odd last
//   key paired with 0).
template <int D>
void dense_pack_bf16(const float* Q, int64_t ldq, int64_t Nq, const float* K, int64_t ldk, const float* V,
                     int64_t ldv, int64_t Nk, int64_t tile_cols, float* Qb, float* Kb, float* Vb, float* row) {
  // A row of D floats to D bf16: D / 2 floats of pairs (D is a multiple of 16: to_bf16's
  // vector stores only).
  auto pairs_of_row = [](const float* x, float* out) { to_bf16(x, reinterpret_cast<uint16_t*>(out), D); };
  for (int64_t i = 0; i < Nq; ++i) pairs_of_row(Q + i * ldq, Qb + i * (D / 2));
  const int64_t ldkt = dense_ldkt(tile_cols);
  for (int64_t c0 = 0; c0 < Nk; c0 += tile_cols, Kb += D / 2 * ldkt) {
    const int64_t cols = std::min(tile_cols, Nk - c0), cols16 = (cols + 15) / 16 * 16;
    for (int64_t c = 0; c < cols; ++c) {
      pairs_of_row(K + (c0 + c) * ldk, row);
      for (int d2 = 0; d2 < D / 2; ++d2) Kb[d2 * ldkt + c] = row[d2];
    }
    if (cols16 > cols)
      for (int d2 = 0; d2 < D / 2; ++d2) fill(Kb + d2 * ldkt + cols, cols16 - cols, 0.0f);
  }
  const __m512i interleave = bf16_interleave(16);
  for (int64_t c = 0; c < Nk; c += 2) {
    const float* a = V + c * ldv;
    for (int d = 0; d < D; d += 16) {
      const __m512 next = c + 1 < Nk ? _mm512_loadu_ps(a + ldv + d) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(next, _mm512_loadu_ps(a + d));  // a's 16, then next's
      _mm512_storeu_si512(Vb + c / 2 * D + d, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}
#endif

// acc(R x 16 NV) += A(R x K, row stride lda) B(K x 16 NV, row stride ldb): each entry of A
// broadcast against a row of B (both products of the dense kernel).
// BF16: each float of A and B holds two bf16 numbers (consecutive along the summed index k,
// which then counts pairs) and vdpbf16ps adds both products into the float accumulator.
template <int R, int NV, bool BF16 = false>
inline void dense_accumulate(__m512 (&acc)[R][NV], const float* A, int64_t lda, const float* B, int64_t ldb,
                             int64_t K) {
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NV];
    for (int j = 0; j < NV; ++j) b[j] = _mm512_loadu_ps(B + k * ldb + 16 * j);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * lda + k]);
      for (int j = 0; j < NV; ++j) {
#if defined(__AVX512BF16__)
        if constexpr (BF16) {
          acc[r][j] = _mm512_dpbf16_ps(acc[r][j], (__m512bh)_mm512_castps_si512(a), (__m512bh)_mm512_castps_si512(b[j]));
          continue;
        }
#endif
        acc[r][j] = _mm512_fmadd_ps(a, b[j], acc[r][j]);
      }
    }
  }
}

// S(R x 16 NV) = Q(R x D) Kt(D x 16 NV); with rowmax (R x 16 floats), each row's lanes keep
// their running maximum.
// BF16: Q and Kt hold bf16 pairs along D (D / 2 floats a row of Q, D / 2 rows of Kt).
template <int D, int R, int NV, bool BF16 = false>
inline void dense_logits(const float* Q, int64_t ldq, const float* Kt, int64_t ldkt, float* S, int64_t ldS,
                         float* rowmax) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  dense_accumulate<R, NV, BF16>(acc, Q, ldq, Kt, ldkt, BF16 ? D / 2 : D);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(S + r * ldS + 16 * j, acc[r][j]);
    if (rowmax) {
      __m512 mx = _mm512_load_ps(rowmax + 16 * r);
      for (int j = 0; j < NV; ++j) mx = _mm512_maskz_max_ps(0xFFFF, mx, acc[r][j]);
      _mm512_store_ps(rowmax + 16 * r, mx);
    }
  }
}

// O(R x D) = O corr (or 0 when `first`) + P(R x n) V(n x D); BF16: P and V hold bf16 pairs
// along the keys, n counts the pairs.
template <int D, int R, bool BF16 = false>
inline void dense_values(const float* P, int64_t ldP, const float* V, int64_t ldv, int64_t n, float* O, int64_t ldo,
                         const float* corr, bool first) {
  constexpr int NV = D / 16;
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    const __m512 c = _mm512_set1_ps(corr[r]);
    for (int j = 0; j < NV; ++j)
      acc[r][j] = first ? _mm512_setzero_ps() : _mm512_mul_ps(_mm512_loadu_ps(O + r * ldo + 16 * j), c);
  }
  dense_accumulate<R, NV, BF16>(acc, P, ldP, V, ldv, n);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(O + r * ldo + 16 * j, acc[r][j]);
}

// Passes 1-3 for R query rows, the first at query index i0, against the key tile [c0, c0 +
// cols) held as Kt (row stride ldkt, zero past cols up to a multiple of 16). S: R x ldkt floats.
// m, l: the rows' running max and sum. first: O holds nothing yet (the block's first tile).
// BF16: Q, Kt and V hold bf16 pairs (see dense_pack_bf16; V at the tile's first pair of keys,
// ldv = D), and S has room for the probabilities' bf16 pairs after its R x ldkt floats.
template <int D, int R, bool BF16 = false>
void dense_strip(const float* Q, int64_t ldq, const float* Kt, int64_t ldkt, int64_t c0, int64_t cols,
                 const float* V, int64_t ldv, float* O, int64_t ldo, float* S, int64_t i0, bool causal, float scale,
                 float* m, float* l, bool first) {
  const int64_t cols16 = (cols + 15) / 16 * 16;
  // Every column of the strip admissible for every row: the maxima come from pass 1.
  const bool whole = cols16 == cols && (!causal || i0 >= c0 + cols - 1);
  alignas(64) float rowmax[R * 16];
  if (whole) fill(rowmax, R * 16, kNegInf);
  float* track = whole ? rowmax : nullptr;
  // Pass 1.
  int64_t c = 0;
  for (; c + 64 <= cols16; c += 64) dense_logits<D, R, 4, BF16>(Q, ldq, Kt + c, ldkt, S + c, ldkt, track);
  for (; c < cols16; c += 16) dense_logits<D, R, 1, BF16>(Q, ldq, Kt + c, ldkt, S + c, ldkt, track);
  // Pass 2.
  alignas(64) float corr[R];
  int64_t used = 0;  // columns any row of the strip uses
  const __m512 vscale = _mm512_set1_ps(scale * exp_consts::kLog2e);
  for (int r = 0; r < R; ++r) {
    float* Sr = S + r * ldkt;
    const int64_t e = causal ? std::min(cols, i0 + r + 1 - c0) : cols;  // the row's keys: [0, e)
    corr[r] = 1.0f;
    if (e <= 0) {
      fill(Sr, cols16, 0.0f);
      continue;
    }
    used = std::max(used, e);
    const float raw_max = whole ? max_of(rowmax + 16 * r, 16) : max_of(Sr, e);
    const float m_new = std::max(m[r], raw_max * scale);  // s > 0: max(s S) = s max(S)
    if (m_new == kNegInf) {  // every logit so far is -inf: nothing to add
      fill(Sr, cols16, 0.0f);
      continue;
    }
    // P = 2^((s log2 e) S - m' log2 e): exp(s S - m') with the reduction by ln 2 in the FMA.
    const __m512 vm = _mm512_set1_ps(m_new * exp_consts::kLog2e);
    __m512 sum = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= e; k += 16) {
      const __m512 p = exp2_f32x16(_mm512_fmsub_ps(_mm512_loadu_ps(Sr + k), vscale, vm));
      _mm512_storeu_ps(Sr + k, p);
      sum = _mm512_add_ps(sum, p);
    }
    if (k < e) {
      const __mmask16 tail = static_cast<__mmask16>((1u << (e - k)) - 1u);
      const __m512 p = _mm512_maskz_mov_ps(tail, exp2_f32x16(_mm512_fmsub_ps(_mm512_loadu_ps(Sr + k), vscale, vm)));
      _mm512_storeu_ps(Sr + k, p);
      sum = _mm512_add_ps(sum, p);
      k += 16;
    }
    for (; k < cols16; k += 16) _mm512_storeu_ps(Sr + k, _mm512_setzero_ps());
    corr[r] = exp_f32(m[r] - m_new);  // 0 on the row's first keys (m = -inf)
    l[r] = l[r] * corr[r] + sum_lanes(sum);
    m[r] = m_new;
  }
  // Pass 3.
#if defined(__AVX512BF16__)
  if constexpr (BF16) {
    // P to bf16 pairs along the keys (zero past each row's keys, so an odd `used` pairs with 0).
    float* Pb = S + R * ldkt;
    const int64_t ldp = ldkt / 2;
    for (int r = 0; r < R; ++r) to_bf16(S + r * ldkt, reinterpret_cast<uint16_t*>(Pb + r * ldp), cols16);
    dense_values<D, R, true>(Pb, ldp, V, ldv, (used + 1) / 2, O, ldo, corr, first);
    return;
  }
#endif
  dense_values<D, R>(S, ldkt, V + c0 * ldv, ldv, used, O, ldo, corr, first);
}

// Passes 1-3 over the key tiles [0, key_hi) for `rows` query rows from i0 (Q, O at those rows,
// V at key 0, Kt the (b, h)'s packed keys from pass 0). S: R x ldkt floats.
// BF16: Q, Kt and V from dense_pack_bf16 (ldq = D / 2, V's pairs of keys ldv = D apart).
template <int D, bool BF16 = false>
void dense_block(const float* Q, int64_t ldq, const float* Kt, const float* V, int64_t ldv, float* O, int64_t ldo,
                 int64_t rows, int64_t i0, int64_t key_hi, int64_t tile_cols, bool causal, float scale, float* m,
                 float* l, bool first, float* S) {
  constexpr int R = dense_strip_rows<D>();
  const int64_t ldkt = dense_ldkt(tile_cols);
  for (int64_t c0 = 0; c0 < key_hi; c0 += tile_cols, Kt += (BF16 ? D / 2 : D) * ldkt) {
    const float* Vc = BF16 ? V + c0 / 2 * ldv : V;  // tiles start at an even key
    const int64_t cols = std::min(tile_cols, key_hi - c0);
    for (int64_t s0 = 0; s0 < rows; s0 += R) {
      const int n = static_cast<int>(std::min<int64_t>(R, rows - s0));
      if (causal && !first && i0 + s0 + n - 1 < c0) continue;  // no row of the strip reaches the tile
      const float* Qs = Q + s0 * ldq;
      float* Os = O + s0 * ldo;
      switch (n) {
#define AB_DENSE_STRIP(k)                                                                                    \
  case k:                                                                                                    \
    if constexpr (k <= R)                                                                                    \
      dense_strip<D, k, BF16>(Qs, ldq, Kt, ldkt, c0, cols, Vc, ldv, Os, ldo, S, i0 + s0, causal, scale,  \
                              m + s0, l + s0, first);                                                        \
    break;
        AB_DENSE_STRIP(1) AB_DENSE_STRIP(2) AB_DENSE_STRIP(3) AB_DENSE_STRIP(4) AB_DENSE_STRIP(5) AB_DENSE_STRIP(6)
#undef AB_DENSE_STRIP
      }
    }
    first = false;
  }
}
#endif
}  // namespace

MatmulSpec QKLogits::spec_qk(int64_t rows, int64_t cols, int64_t ldS) const {
  const MatmulSpec s = MatmulSpec::tile(rows, cols, D_, ld_q_, false, ld_k_, true, ldS, scale_);
  return bf16_inputs_ ? s.with_bf16_inputs() : s;
}
// S^T(cols, rows) = s K(cols, D) Q(rows, D)^T, rows packed.
MatmulSpec QKLogits::spec_kq(int64_t rows, int64_t cols) const {
  const MatmulSpec s = MatmulSpec::tile(cols, rows, D_, ld_k_, false, ld_q_, true, rows, scale_);
  return bf16_inputs_ ? s.with_bf16_inputs() : s;
}
// bf16: dS and K (Q) in bf16, dQ (dK) in float at its own row stride.
MatmulSpec QKLogits::spec_dq(int64_t rows, int64_t cols, int64_t ldS) const {
  const MatmulSpec s = MatmulSpec::tile(rows, D_, cols, ldS, false, ld_k_, false, ld_dq_ ? ld_dq_ : ld_q_, scale_, true);
  return bf16_inputs_ ? s.with_bf16_inputs() : s;
}
MatmulSpec QKLogits::spec_dq_partial(int64_t rows, int64_t cols, int64_t ldS) const {
  return MatmulSpec::tile(rows, D_, cols, ldS, false, ld_k_, false, D_, scale_, true);
}
MatmulSpec QKLogits::spec_dk(int64_t rows, int64_t cols, int64_t ldS) const {
  const MatmulSpec s = MatmulSpec::tile(cols, D_, rows, ldS, true, ld_q_, false, ld_dk_ ? ld_dk_ : ld_k_, scale_, true);
  return bf16_inputs_ ? s.with_bf16_inputs() : s;
}

void QKLogits::plan_tile(MatmulCache& mm, int64_t rows, int64_t cols, int64_t ldS, bool backward) const {
  if (keys_major_) {
    mm.add(spec_kq(rows, cols));
    scratch_floats_ = std::max(scratch_floats_, static_cast<size_t>(rows * cols));
  } else {
    mm.add(spec_qk(rows, cols, ldS));
  }
  if (backward) {
    mm.add(spec_dq(rows, cols, ldS));
    mm.add(spec_dk(rows, cols, ldS));
    if (key_split()) mm.add(spec_dq_partial(rows, cols, ldS));
  }
}

void QKLogits::logits(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0, int64_t rows,
                      int64_t c0, int64_t cols, float* S, int64_t ldS) const {
  if (!keys_major_) {
    mm.run(tid, spec_qk(rows, cols, ldS), q_.row(b, h, r0), k_.row(b, h, c0), S);
    return;
  }
  float* St = scratch_.data() + static_cast<size_t>(tid) * scratch_floats_;
  mm.run(tid, spec_kq(rows, cols), k_.row(b, h, c0), q_.row(b, h, r0), St);
  transpose(St, cols, rows, rows, S, ldS);
}

void QKLogits::logits_backward(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0,
                               int64_t rows, int64_t c0, int64_t cols, const float* dS, int64_t ldS) const {
  mm.run(tid, spec_dq(rows, cols, ldS), dS, k_.row(b, h, c0), dq_.row(b, h, r0));
  mm.run(tid, spec_dk(rows, cols, ldS), dS, q_.row(b, h, r0), dk_.row(b, h, c0));
}

void QKLogits::logits_backward_partial(const MatmulCache& mm, int tid, int64_t b, int64_t h, int64_t r0,
                                       int64_t rows, int64_t c0, int64_t cols, const float* dS, int64_t ldS,
                                       float* dq_rows) const {
  mm.run(tid, spec_dq_partial(rows, cols, ldS), dS, k_.row(b, h, c0), dq_rows);
  mm.run(tid, spec_dk(rows, cols, ldS), dS, q_.row(b, h, r0), dk_.row(b, h, c0));
}

void QKLogits::reduce_partial(int64_t b, int64_t h, const float* dq_part) const {
  for (int64_t i = 0; i < dq_.shape.N; ++i) {
    float* dq = dq_.row(b, h, i);
    const float* part = dq_part + i * D_;
#pragma omp simd
    for (int64_t d = 0; d < D_; ++d) dq[d] += part[d];
  }
}

void QKLogits::backward_begin(const MatmulCache&, int, int64_t b, int64_t h) const {
  if (accumulate_) return;
  for (int64_t i = 0; i < dq_.shape.N; ++i) fill(dq_.row(b, h, i), D_, 0.0f);
  for (int64_t j = 0; j < dk_.shape.N; ++j) fill(dk_.row(b, h, j), D_, 0.0f);
}

std::pair<int64_t, int64_t> TiledSoftmax::keys_of(int64_t i) const {
  if (ranges_.size()) return {ranges_[static_cast<size_t>(2 * i)], ranges_[static_cast<size_t>(2 * i + 1)]};
  std::pair<int64_t, int64_t> r = shape_.keys ? shape_.keys(i) : std::pair<int64_t, int64_t>{0, shape_.Nk};
  r.first = std::max<int64_t>(r.first, 0);
  r.second = std::min(r.second, shape_.Nk);
  if (shape_.causal) r.second = std::min(r.second, i + 1);
  return r;
}

void TiledSoftmax::drop_self(float* row, int64_t i, int64_t c0, int64_t a, int64_t e) const {
  if (shape_.exclude_self && a <= i - c0 && i - c0 < e) row[i - c0] = kNegInf;
}

std::pair<int64_t, int64_t> TiledSoftmax::admissible(int64_t i, int64_t c0, int64_t cols) const {
  const auto [lo, hi] = keys_of(i);
  return {std::max<int64_t>(lo - c0, 0), std::min(hi - c0, cols)};
}

double TiledSoftmax::pairs() const {
  if (!shape_.keys && !shape_.exclude_self)
    return shape_.causal ? dense_pairs(shape_.Nq, true) : static_cast<double>(shape_.Nq) * static_cast<double>(shape_.Nk);
  double p = 0;
  for (int64_t i = 0; i < shape_.Nq; ++i) {
    const auto [lo, hi] = keys_of(i);
    p += static_cast<double>(std::max<int64_t>(hi - lo, 0));
    if (shape_.exclude_self && lo <= i && i < hi) p -= 1;
  }
  return p;
}

bool TiledSoftmax::diagonal_kernel(int64_t D) {
#if defined(__AVX512F__)
  return D == 16 || D == 32 || D == 64;
#else
  (void)D;
  return false;
#endif
}

bool TiledSoftmax::diagonal_fits(int64_t D, int64_t keys, int64_t prefix, int64_t area) {
  return kDiagRows * (D + prefix + std::max<int64_t>(keys, 0)) <= area;
}

// Whether this build has the AVX512-BF16 instructions (vdpbf16ps) of the kernels' bf16 variants.
constexpr bool kBf16Build =
#if defined(__AVX512BF16__)
    true;
#else
    false;
#endif

bool TiledSoftmax::diagonal_bf16_kernel(int64_t D) { return kBf16Build && diagonal_kernel(D); }

bool TiledSoftmax::diagonal_block(int64_t r0, int64_t rows) const {
  if (shape_.bf16_tiles && !diagonal_bf16_kernel(shape_.D)) return false;
  if (!shape_.diagonal || !shape_.tight || !shape_.keys || !diagonal_kernel(shape_.D)) return false;
  for (int64_t s0 = 0; s0 < rows; s0 += kDiagRows) {
    const int64_t last = std::min<int64_t>(s0 + kDiagRows, rows) - 1;
    const int64_t keys = keys_of(r0 + last).second - keys_of(r0 + s0).first;
    if (!diagonal_fits(shape_.D, keys, shape_.prefix_keys, shape_.fwd_rows * shape_.fwd_cols)) return false;
  }
  return true;
}

double TiledSoftmax::scored_pairs() const {
  // The tiles forward() visits (its loop bounds, without the products); the diagonal kernel
  // scores each 16 rows over the union of their keys.
  const bool ranged = shape_.causal || shape_.keys, tight = shape_.tight && ranged;
  double p = 0;
  for (int64_t r0 = 0; r0 < shape_.Nq; r0 += shape_.fwd_rows) {
    const int64_t rows = std::min(shape_.fwd_rows, shape_.Nq - r0);
    if (diagonal_block(r0, rows)) {
      for (int64_t s0 = 0; s0 < rows; s0 += kDiagRows) {
        const int64_t n = std::min<int64_t>(kDiagRows, rows - s0);
        const int64_t keys = keys_of(r0 + s0 + n - 1).second - keys_of(r0 + s0).first;
        p += static_cast<double>(n * (shape_.prefix_keys + std::max<int64_t>(keys, 0)));
      }
      continue;
    }
    const int64_t key_lo = ranged ? keys_of(r0).first : 0, key_hi = ranged ? keys_of(r0 + rows - 1).second : shape_.Nk;
    for (int64_t c0 = tight ? key_lo : key_lo / shape_.fwd_cols * shape_.fwd_cols; c0 < key_hi; c0 += shape_.fwd_cols)
      p += static_cast<double>(rows * std::min(shape_.fwd_cols, (tight ? key_hi : shape_.Nk) - c0));
  }
  return p;
}

// O_i(rows, D) += P V_j (the first tile of a block: O_i = P V_j); bf16_tiles: P and V in bf16.
MatmulSpec TiledSoftmax::spec_pv(int64_t rows, int64_t cols, bool accumulate) const {
  const MatmulSpec s = MatmulSpec::tile(rows, shape_.D, cols, shape_.fwd_cols, false, shape_.ld_v, false, shape_.ld_o, 1.0f, accumulate);
  return shape_.bf16_tiles ? s.with_bf16_inputs() : s;
}
// dV_j(cols, D) += P^T dO_i
// (bf16: P and dO in bf16, dV in float.)
MatmulSpec TiledSoftmax::spec_dv(int64_t rows, int64_t cols) const {
  const MatmulSpec s = MatmulSpec::tile(cols, shape_.D, rows, shape_.bwd_cols, true, ld_dout(), false, shape_.ld_dv ? shape_.ld_dv : shape_.ld_v, 1.0f, true);
  return bf16_backward() ? s.with_bf16_inputs() : s;
}
// dP(rows, cols) = dO_i V_j^T (bf16: dO and V in bf16)
MatmulSpec TiledSoftmax::spec_dp(int64_t rows, int64_t cols) const {
  const MatmulSpec s = MatmulSpec::tile(rows, cols, shape_.D, ld_dout(), false, shape_.ld_v, true, shape_.bwd_cols);
  return bf16_backward() ? s.with_bf16_inputs() : s;
}

std::pair<int64_t, int64_t> TiledSoftmax::queries_using(int64_t c0, int64_t c1) const {
  const int64_t Nq = shape_.Nq;
  if (!shape_.causal && !shape_.keys) return {0, Nq};
  // Both ends of the key ranges never decrease, so the rows form one run: from the first row
  // whose range ends after c0 to the first row whose range starts at or after c1.
  int64_t lo = 0, hi = Nq;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys_of(mid).second > c0) hi = mid;
    else lo = mid + 1;
  }
  const int64_t first = lo;
  hi = Nq;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys_of(mid).first >= c1) hi = mid;
    else lo = mid + 1;
  }
  return {first, lo};
}

void TiledSoftmax::plan(Mode mode, const LogitsSource& src) {
  mode_ = mode;
  dense_planned_ = dense_source(src);  // dropout may be off at a later call (evaluation)
  key_parts_ = 1;
  const int64_t BH = shape_.B * shape_.H;
  if (mode == Mode::fwdbwd && !shape_.static_schedule && src.key_split())
    key_parts_ = std::min<int64_t>(shape_.threads / std::gcd<int64_t>(BH, shape_.threads), std::max<int64_t>(bwd_key_tiles(), 1));
  mm_.clear();
  src.plan_begin();
  if (shape_.tight && (shape_.causal || shape_.keys)) {
    // Tiles start where each block's keys (forward) or queries (backward) start: enumerate the
    // shapes that occur.
    std::set<std::pair<int64_t, int64_t>> fwd, bwd;
    for (int64_t r0 = 0; r0 < shape_.Nq; r0 += shape_.fwd_rows) {
      const int64_t rows = std::min(shape_.fwd_rows, shape_.Nq - r0);
      const int64_t lo = keys_of(r0).first, hi = keys_of(r0 + rows - 1).second;
      for (int64_t c0 = lo; c0 < hi; c0 += shape_.fwd_cols) fwd.insert({rows, std::min(shape_.fwd_cols, hi - c0)});
    }
    if (mode == Mode::fwdbwd)
      for (int64_t c0 = 0; c0 < shape_.Nk; c0 += shape_.bwd_cols) {
        const int64_t cols = std::min(shape_.bwd_cols, shape_.Nk - c0);
        const auto [qf, qe] = queries_using(c0, c0 + cols);
        for (int64_t r0 = qf; r0 < qe; r0 += shape_.bwd_rows) bwd.insert({std::min(shape_.bwd_rows, qe - r0), cols});
      }
    for (auto [rows, cols] : fwd) {
      src.plan_tile(mm_, rows, cols, shape_.fwd_cols, false);
      mm_.add(spec_pv(rows, cols, false));
      mm_.add(spec_pv(rows, cols, true));
    }
    for (auto [rows, cols] : bwd) {
      src.plan_tile(mm_, rows, cols, shape_.bwd_cols, true);
      mm_.add(spec_dv(rows, cols));
      mm_.add(spec_dp(rows, cols));
    }
    return;
  }
  for (int64_t rows : block_sizes(shape_.Nq, shape_.fwd_rows))
    for (int64_t cols : block_sizes(shape_.Nk, shape_.fwd_cols)) {
      src.plan_tile(mm_, rows, cols, shape_.fwd_cols, false);
      mm_.add(spec_pv(rows, cols, false));
      mm_.add(spec_pv(rows, cols, true));
    }
  if (mode == Mode::fwdbwd)
    for (int64_t rows : block_sizes(shape_.Nq, shape_.bwd_rows))
      for (int64_t cols : block_sizes(shape_.Nk, shape_.bwd_cols)) {
        src.plan_tile(mm_, rows, cols, shape_.bwd_cols, true);
        mm_.add(spec_dv(rows, cols));
        mm_.add(spec_dp(rows, cols));
      }
}

bool TiledSoftmax::dense_kernel(int64_t D) {
#if defined(__AVX512F__)
  return D == 16 || D == 32 || D == 64 || D == 128;
#else
  (void)D;
  return false;
#endif
}

bool TiledSoftmax::dense_bf16_kernel(int64_t D) { return kBf16Build && dense_kernel(D); }

bool TiledSoftmax::dense_source(const LogitsSource& src) const {
  const auto* qk = dynamic_cast<const QKLogits*>(&src);
  return qk && !qk->keys_major() && !shape_.keys && !shape_.exclude_self && shape_.prefix_keys == 0 && !shape_.bf16_tiles &&
         (shape_.bf16 ? dense_bf16_kernel(shape_.D) : dense_kernel(shape_.D));
}

bool TiledSoftmax::dense_block_kernel(const LogitsSource& src) const {
  return dense_source(src) && !dropout_.active();
}

// Per thread: forward score tile (or the dense kernel's transposed key tile and score strip),
// running max and sum; backward P and dS tiles.
int64_t TiledSoftmax::score_area() const {
  const int64_t dense_strip = (shape_.bf16 ? 9 : 6) * dense_ldkt(shape_.dense_cols);  // bf16: and P's pairs
  return std::max(shape_.fwd_rows * shape_.fwd_cols, dense_kernel(shape_.D) ? dense_strip : 0);
}

int64_t TiledSoftmax::dense_keys_floats() const {
  const int64_t tiles = (shape_.Nk + shape_.dense_cols - 1) / shape_.dense_cols;
  return tiles * (shape_.bf16 ? shape_.D / 2 : shape_.D) * dense_ldkt(shape_.dense_cols);
}

size_t TiledSoftmax::tile_floats(Mode mode) const {
  size_t f = static_cast<size_t>(score_area() + 2 * shape_.fwd_rows);
  if (shape_.bf16_tiles) f += static_cast<size_t>((shape_.fwd_rows * shape_.fwd_cols + 1) / 2);  // P in bf16
  // Backward: the P and dS tiles (bf16: and their bf16 copies, one tile's floats for both).
  if (mode == Mode::fwdbwd) f = std::max(f, static_cast<size_t>((bf16_backward() ? 3 : 2) * shape_.bwd_rows * shape_.bwd_cols));
  return f;
}

size_t TiledSoftmax::working_bytes(Mode mode) const {
  const size_t T = static_cast<size_t>(shape_.threads);
  size_t b = T * mm_.scratch_per_slot() + T * tile_floats(mode) * sizeof(float);
  const size_t rows = static_cast<size_t>(shape_.B * shape_.H * shape_.Nq) * sizeof(float);
  if (mode == Mode::fwdbwd) {
    b += 2 * rows + dq_parts_floats() * sizeof(float);
    if (key_parts_ > 1) b += static_cast<size_t>(bwd_key_tiles()) * sizeof(int64_t);  // key_part_of_tile_
  } else if (shape_.keep_lse) {
    b += rows;
  }
  if (shape_.keys) b += 2 * static_cast<size_t>(shape_.Nq) * sizeof(int64_t);
  if (dense_planned_) b += static_cast<size_t>(shape_.B * shape_.H * dense_keys_floats()) * sizeof(float);
  if (dense_planned_ && shape_.bf16)
    b += static_cast<size_t>(shape_.B * shape_.H * (shape_.Nq * shape_.D / 2 + (shape_.Nk + 1) / 2 * shape_.D)) * sizeof(float);
  return b;
}

void TiledSoftmax::setup(Mode mode) {
  const int T = shape_.threads;
  scratch_ = Buffer<std::byte>(static_cast<size_t>(T) * mm_.scratch_per_slot());
  mm_.bind(T, scratch_.data());
  tiles_ = Buffer<float>(static_cast<size_t>(T) * tile_floats(mode));
  if (shape_.keys) {
    // The ranges as a table: the timed loops look a row up instead of calling the pattern.
    Buffer<int64_t> table(static_cast<size_t>(2 * shape_.Nq));
    for (int64_t i = 0; i < shape_.Nq; ++i) {
      const auto [lo, hi] = keys_of(i);
      table[static_cast<size_t>(2 * i)] = lo;
      table[static_cast<size_t>(2 * i + 1)] = hi;
    }
    ranges_ = std::move(table);
  }
  if (dense_planned_) keys_t_ = Buffer<float>(static_cast<size_t>(shape_.B * shape_.H * dense_keys_floats()));
  if (dense_planned_ && shape_.bf16) {
    q_b_ = Buffer<float>(static_cast<size_t>(shape_.B * shape_.H * shape_.Nq * shape_.D / 2));
    v_b_ = Buffer<float>(static_cast<size_t>(shape_.B * shape_.H * ((shape_.Nk + 1) / 2) * shape_.D));
  }
  if (mode == Mode::fwdbwd || shape_.keep_lse) lse_ = Buffer<float>(static_cast<size_t>(shape_.B * shape_.H * shape_.Nq));
  if (mode == Mode::fwdbwd) delta_ = Buffer<float>(static_cast<size_t>(shape_.B * shape_.H * shape_.Nq));
  if (mode == Mode::fwdbwd && key_parts_ > 1) {
    dq_parts_ = Buffer<float>(dq_parts_floats());
    // Each key tile to a part: the largest work (query rows times keys) first, each to the
    // part with the least so far (a causal pair's first tiles have the most rows: contiguous
    // halves would give one thread three quarters of the work).
    const int64_t tiles = bwd_key_tiles();
    std::vector<std::pair<int64_t, int64_t>> by_work;  // (-work, tile)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t c0 = t * shape_.bwd_cols, c1 = std::min(shape_.Nk, c0 + shape_.bwd_cols);
      const auto [qf, qe] = queries_using(c0, c1);
      by_work.push_back({-(qe - qf) * (c1 - c0), t});
    }
    std::sort(by_work.begin(), by_work.end());
    std::vector<int64_t> load(static_cast<size_t>(key_parts_), 0);
    key_part_of_tile_ = Buffer<int64_t>(static_cast<size_t>(tiles));
    for (const auto& [neg_work, t] : by_work) {
      const auto least = std::min_element(load.begin(), load.end()) - load.begin();
      key_part_of_tile_[static_cast<size_t>(t)] = least;
      load[static_cast<size_t>(least)] -= neg_work;
    }
  }
}

// Forward, per (batch, head, query block) work item:
//   pass 1  S = logits(Q_i, keys j)                   (the source: a matmul, usually)
//   pass 2  per row: causal mask, new max m', P = exp(S - m'), l = l e^(m - m') + sum(P),
//           O_i row *= e^(m - m')                     (one vectorised sweep)
//   pass 3  O_i += P V_j                              (matmul with accumulation; the first
//                                                      tile writes O_i = P V_j, so O_i is
//                                                      neither zeroed nor rescaled before it)
//   finally O_i /= l, and lse = m + log l is kept for the backward pass.
// bf16_tiles: passes 1 and 3 are bf16 products (Q, K, V rounded by the caller) and each row of P
// is rounded to bf16 at the end of pass 2; m, l and the rescaling of O stay float.
// Resuming, every block starts from the earlier key set's m = lse, l = 1 (0 where lse is -inf)
// and its O_i, and every tile accumulates. A band (shape.diagonal) in an AVX-512 build runs
// passes 1-3 as the diagonal kernel instead, 16 rows at a time (diagonal_rows), with the same
// running m, l and final pass.
void TiledSoftmax::forward(const LogitsSource& src, const TensorView& v, const TensorView& o,
                           const LseView* lse_out, bool resume, const TensorView* prefix_v) {
  const int64_t kFwdRows = shape_.fwd_rows, kFwdCols = shape_.fwd_cols;
  const int64_t Nq = shape_.Nq, Nk = shape_.Nk, D = shape_.D, nq = (Nq + kFwdRows - 1) / kFwdRows;
  const int64_t items = shape_.B * shape_.H * nq;
  const bool ranged = shape_.causal || shape_.keys;
  const bool tight = shape_.tight && ranged;
  float* lse_all = lse_.data();
  const size_t per_thread = tile_floats(mode_);
  if (resume && !lse_out) throw std::logic_error("TiledSoftmax::forward: resuming needs the earlier log-sum-exp");
  // The diagonal kernel computes the logits itself: plain s Q K^T only.
  const auto* qk = dynamic_cast<const QKLogits*>(&src);
  const bool diagonal = qk && !qk->keys_major() && ranges_.size() > 0;
  if (diagonal && dropout_.active() && shape_.diagonal)
    throw std::logic_error("TiledSoftmax::forward: the diagonal kernel applies no dropout (plan the shape without it)");
  // Dense or causal s Q K^T without dropout: the dense kernel (AVX-512) instead of passes 1-3.
  const bool dense = dense_block_kernel(src) && keys_t_.size() > 0;
  if (shape_.bf16 && !dense)
    throw std::logic_error("TiledSoftmax::forward: bf16 needs the dense kernel (plain s Q K^T, no dropout, a bf16 build)");
#if defined(__AVX512F__)
  const int64_t q_pairs = shape_.Nq * D / 2, v_pairs = (Nk + 1) / 2 * D;  // bf16: floats of q_b_, v_b_ per (b, h)
  if (dense) {  // the dense kernel's pass 0: the keys transposed (bf16: Q, K and V in pairs)
    const TensorView& q = qk->q();
    const TensorView& k = qk->k();
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < shape_.B * shape_.H; ++bh) {
      const int64_t b = bh / shape_.H, h = bh % shape_.H;
      float* Kt = keys_t_.data() + bh * dense_keys_floats();
      switch (D) {
#if defined(__AVX512BF16__)
#define AB_DENSE_PACK_BF16(d)                                                                                     \
  if (shape_.bf16) {                                                                                                 \
    alignas(64) float row[d / 2];                                                                                 \
    dense_pack_bf16<d>(q.head(b, h), q.strides.sn, Nq, k.head(b, h), k.strides.sn, v.head(b, h), shape_.ld_v, Nk,    \
                       shape_.dense_cols, q_b_.data() + bh * q_pairs, Kt, v_b_.data() + bh * v_pairs, row);          \
    break;                                                                                                        \
  }
#else
#define AB_DENSE_PACK_BF16(d)
#endif
#define AB_DENSE_PACK(d)                                                     \
  case d:                                                                    \
    AB_DENSE_PACK_BF16(d)                                                    \
    dense_pack_keys<d>(k.head(b, h), k.strides.sn, Nk, shape_.dense_cols, Kt);  \
    break;
        AB_DENSE_PACK(16) AB_DENSE_PACK(32) AB_DENSE_PACK(64) AB_DENSE_PACK(128)
#undef AB_DENSE_PACK
#undef AB_DENSE_PACK_BF16
      }
    }
  }
#endif
  if (shape_.prefix_keys > 0) {  // only the diagonal kernel has prefix keys
    bool ok = diagonal && prefix_v;
    for (int64_t r0 = 0; ok && r0 < Nq; r0 += kFwdRows) ok = diagonal_block(r0, std::min(kFwdRows, Nq - r0));
    if (!ok) throw std::logic_error("TiledSoftmax::forward: prefix keys need the diagonal kernel and their values");
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t it = 0; it < items; ++it) {
    const int tid = omp_get_thread_num();
    // Work items in (b, h, block) order, or (b, block, h) when the heads are interleaved rows.
    const int64_t b = it / (shape_.H * nq);
    const int64_t qb = shape_.heads_inner ? it / shape_.H % nq : it % nq;
    const int64_t h = shape_.heads_inner ? it % shape_.H : it / nq % shape_.H;
    const int64_t bh = b * shape_.H + h;
    const int64_t r0 = qb * kFwdRows, rows = std::min(kFwdRows, Nq - r0);
    float* S = tiles_.data() + static_cast<size_t>(tid) * per_thread;
    float* m = S + score_area();
    float* l = m + kFwdRows;
    const float* V = v.head(b, h);
    float* O = o.row(b, h, r0);
    const int64_t ldo = shape_.ld_o;
    for (int64_t r = 0; r < rows; ++r) {
      m[r] = resume ? *lse_out->row(b, h, r0 + r) : kNegInf;
      l[r] = m[r] == kNegInf ? 0.0f : 1.0f;
    }
    bool first_tile = !resume, diagonal_done = false;
#if defined(__AVX512F__)
    // A band: the diagonal kernel, 16 rows at a time.
    if (diagonal && diagonal_block(r0, rows)) {
      const TensorView& q = qk->q();
      const TensorView& k = qk->k();
      const float* K0 = k.head(b, h);
      const int64_t np = shape_.prefix_keys;
      const float* KP = np ? qk->prefix_k().head(b, h) : nullptr;
      const float* VP = np ? prefix_v->head(b, h) : nullptr;
      const int64_t ldkp = np ? qk->prefix_k().strides.sn : 0, ldvp = np ? prefix_v->strides.sn : 0;
      alignas(64) float m16[kDiagRows], l16[kDiagRows];
      for (int64_t s0 = 0; s0 < rows; s0 += kDiagRows) {
        const int n = static_cast<int>(std::min<int64_t>(kDiagRows, rows - s0));
        for (int r = 0; r < kDiagRows; ++r) {
          m16[r] = r < n ? m[s0 + r] : kNegInf;
          l16[r] = r < n ? l[s0 + r] : 0.0f;
        }
        const int64_t self0 = shape_.exclude_self ? r0 + s0 : -1;
        const int64_t* rr = ranges_.data() + 2 * (r0 + s0);
        float* Os = O + s0 * ldo;
        const float* Qs = q.row(b, h, r0 + s0);
        switch (D) {
#if defined(__AVX512BF16__)
#define AB_DIAG_BF16(d)                                                                                          \
  if (shape_.bf16_tiles) {  /* the views hold bf16 pairs: strides in bf16 numbers */                               \
    diagonal_rows<d, true>(n, reinterpret_cast<const uint16_t*>(Qs), 2 * q.strides.sn,                          \
                           reinterpret_cast<const uint16_t*>(K0), 2 * k.strides.sn,                             \
                           reinterpret_cast<const uint16_t*>(V), shape_.ld_v, reinterpret_cast<const uint16_t*>(KP),  \
                           2 * ldkp, reinterpret_cast<const uint16_t*>(VP), 2 * ldvp, np, rr, self0,             \
                           qk->scale(), Os, ldo, m16, l16, resume, S, l + kFwdRows);                            \
    break;                                                                                                       \
  }
#else
#define AB_DIAG_BF16(d)
#endif
#define AB_DIAG_D(d)                                                                                           \
  case d:                                                                                                      \
    AB_DIAG_BF16(d)                                                                                            \
    diagonal_rows<d>(n, Qs, q.strides.sn, K0, k.strides.sn, V, shape_.ld_v, KP, ldkp, VP, ldvp, np, rr, self0,   \
                     qk->scale(), Os, ldo, m16, l16, resume, S);                                               \
    break;
          AB_DIAG_D(16) AB_DIAG_D(32) AB_DIAG_D(64)
#undef AB_DIAG_D
#undef AB_DIAG_BF16
        }
        for (int r = 0; r < n; ++r) {
          m[s0 + r] = m16[r];
          l[s0 + r] = l16[r];
        }
      }
      first_tile = false;
      diagonal_done = true;
    }
#endif
#if defined(__AVX512F__)
    if (dense) {
      const TensorView& q = qk->q();
      const int64_t key_hi = shape_.causal ? r0 + rows : Nk;
      const float* Kt = keys_t_.data() + bh * dense_keys_floats();
      switch (D) {
#define AB_DENSE_D(d)                                                                                             \
  case d:                                                                                                         \
    if (shape_.bf16)                                                                                                  \
      dense_block<d, true>(q_b_.data() + bh * q_pairs + r0 * d / 2, d / 2, Kt, v_b_.data() + bh * v_pairs, d, O, \
                           ldo, rows, r0, key_hi, shape_.dense_cols, shape_.causal, qk->scale(), m, l, first_tile, S);   \
    else                                                                                                          \
      dense_block<d>(q.row(b, h, r0), q.strides.sn, Kt, V, shape_.ld_v, O, ldo, rows, r0, key_hi, shape_.dense_cols,     \
                     shape_.causal, qk->scale(), m, l, first_tile, S);                                               \
    break;
        AB_DENSE_D(16) AB_DENSE_D(32) AB_DENSE_D(64) AB_DENSE_D(128)
#undef AB_DENSE_D
      }
      first_tile = false;
      diagonal_done = true;
    }
#endif
    // Keys any row of this block may use; tiles start on the grid of kFwdCols.
    const int64_t key_lo = ranged ? keys_of(r0).first : 0;
    const int64_t key_hi = ranged ? keys_of(r0 + rows - 1).second : Nk;
    for (int64_t c0 = tight ? key_lo : key_lo / kFwdCols * kFwdCols; c0 < key_hi && !diagonal_done; c0 += kFwdCols) {
      const int64_t cols = std::min(kFwdCols, (tight ? key_hi : Nk) - c0);
      src.logits(mm_, tid, b, h, r0, rows, c0, cols, S, kFwdCols);
      for (int64_t r = 0; r < rows; ++r) {
        float* Sr = S + r * kFwdCols;
        const auto [a, e] = ranged ? admissible(r0 + r, c0, cols) : std::pair<int64_t, int64_t>{0, cols};
        if (e <= a) {
          fill(Sr, cols, 0.0f);
          continue;
        }
        drop_self(Sr, r0 + r, c0, a, e);
        const float m_new = std::max(m[r], max_of(Sr + a, e - a));
        if (m_new == kNegInf) {  // every admissible logit is -inf so far: nothing to add
          fill(Sr, cols, 0.0f);
          continue;
        }
        const float correction = exp_f32(m[r] - m_new);  // 0 on the first tile (m = -inf)
        const float sum = exp_shift_sum(Sr + a, Sr + a, e - a, m_new);
        if (a > 0) fill(Sr, a, 0.0f);
        if (e < cols) fill(Sr + e, cols - e, 0.0f);
        l[r] = l[r] * correction + sum;
        if (correction != 1.0f && !first_tile) scale_inplace(O + r * ldo, D, correction);
        m[r] = m_new;
        // Dropout acts on the probabilities after their sum is taken: the normaliser is the
        // whole row's, as softmax-then-dropout defines it.
        if (dropout_.active()) dropout_.apply(Sr, cols, static_cast<uint64_t>(bh * Nq + r0 + r), c0);
      }
      if (shape_.bf16_tiles) {  // P rounded to bf16 (the softmax stays float), V's rows already are
        uint16_t* Pb = reinterpret_cast<uint16_t*>(l + kFwdRows);
        for (int64_t r = 0; r < rows; ++r) to_bf16(S + r * kFwdCols, Pb + r * kFwdCols, cols);
        mm_.run(tid, spec_pv(rows, cols, !first_tile), Pb, reinterpret_cast<const uint16_t*>(V) + c0 * shape_.ld_v, O);
      } else {
        mm_.run(tid, spec_pv(rows, cols, !first_tile), S, V + c0 * shape_.ld_v, O);
      }
      first_tile = false;
    }
    if (first_tile)  // no key at all: O_i = 0
      for (int64_t r = 0; r < rows; ++r) fill(O + r * ldo, D, 0.0f);
    float* lse = lse_all ? lse_all + bh * Nq + r0 : nullptr;
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      scale_inplace(O + r * ldo, D, inv);
      const float row_lse = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
      if (lse) lse[r] = row_lse;
      if (lse_out) *lse_out->row(b, h, r0 + r) = row_lse;
    }
  }
}

// Backward, per (batch, head) (FlashAttention-2 order: key tiles outer, query tiles inner):
//   pass 0  delta_i = rowsum(dO_i * O_i)
//   for each key tile j, query tile i:
//   pass 1  S = logits;  P = exp(S - lse_i) (masked)              (recomputed, not stored)
//   pass 2  dV_j += P^T dO_i;  dP = dO_i V_j^T                    (matmuls)
//   pass 3  dS = P * (dP - delta_i)                               (elementwise)
//   pass 4  the source takes dS to its inputs (flash: dQ_i += s dS K_j, dK_j += s dS^T Q_i)
// With key_parts() > 1 (B H does not divide over the threads), each (b, h)'s key tiles are dealt
// into parts of about equal work (query rows times keys: causal tiles near the end have fewer
// rows), run as separate items: their dK, dV rows are disjoint, and each part past the first
// adds its dQ into a partial buffer, summed into dQ afterwards in part order.
void TiledSoftmax::backward(const LogitsSource& src, const TensorView& v, const TensorView& o,
                            const TensorView& dout, const TensorView& dv, bool accumulate,
                            const LseView* external_lse) {
  const int64_t kBwdRows = shape_.bwd_rows, kBwdCols = shape_.bwd_cols;
  const int64_t Nq = shape_.Nq, Nk = shape_.Nk, D = shape_.D, BH = shape_.B * shape_.H;
  const bool ranged = shape_.causal || shape_.keys;
  const bool tight = shape_.tight && ranged;
  const size_t per_thread = tile_floats(Mode::fwdbwd);
  const int64_t parts = key_parts_;
  if (parts > 1 && !src.key_split()) throw std::logic_error("TiledSoftmax::backward: planned with a source that splits keys");
  // Pass 0 of (b, h): delta, and dV (unless accumulating) and the source's gradients zeroed.
  auto begin_pair = [&](int tid, int64_t bh) {
    const int64_t b = bh / shape_.H, h = bh % shape_.H;
    float* delta = delta_.data() + bh * Nq;
    // bf16: from the rounded dO the products read, so that dP - delta vanishes where it does
    // in exact arithmetic (a row of one key) instead of leaving dO's rounding behind.
    if (bf16_backward())
      for (int64_t i = 0; i < Nq; ++i) delta[i] = dot_bf16(reinterpret_cast<const uint16_t*>(bf16_dout_.row(b, h, i)), o.row(b, h, i), D);
    else
      for (int64_t i = 0; i < Nq; ++i) delta[i] = dot(dout.row(b, h, i), o.row(b, h, i), D);
    if (!accumulate)
      for (int64_t j = 0; j < Nk; ++j) fill(dv.row(b, h, j), D, 0.0f);
    src.backward_begin(mm_, tid, b, h);
  };
  // Passes 1-4 of (b, h) over its key tiles (all, or those of one part); dQ into dq_part when
  // given (a later part of a split pair), else through the source.
  if (bf16_backward() && (!bf16_v_.data || !bf16_dout_.data || parts > 1))
    throw std::logic_error("TiledSoftmax::backward: bf16 needs bind_bf16's copies and whole pairs");
  auto backward_keys = [&](int tid, int64_t bh, int64_t part, float* dq_part) {
    const int64_t b = bh / shape_.H, h = bh % shape_.H;
    float* P = tiles_.data() + static_cast<size_t>(tid) * per_thread;
    float* dS = P + kBwdRows * kBwdCols;
    // bf16: P and dS rounded for their products, rows of kBwdCols bf16 numbers.
    uint16_t* Pb = reinterpret_cast<uint16_t*>(dS + kBwdRows * kBwdCols);
    uint16_t* dSb = Pb + kBwdRows * kBwdCols;
    const float* lse_own = lse_.data() + bh * Nq;
    auto lse_at = [&](int64_t i) {
      return external_lse ? external_lse->base[b * external_lse->b_stride + h * external_lse->h_stride +
                                               i * external_lse->row_stride]
                          : lse_own[i];
    };
    const float* delta = delta_.data() + bh * Nq;
    for (int64_t c0 = 0; c0 < Nk; c0 += kBwdCols) {
      if (part >= 0 && key_part_of_tile_[static_cast<size_t>(c0 / kBwdCols)] != part) continue;
      const int64_t cols = std::min(kBwdCols, Nk - c0);
      const float* Vj = v.row(b, h, c0);
      float* dVj = dv.row(b, h, c0);
      const auto [q_first, q_end] = queries_using(c0, c0 + cols);
      for (int64_t r0 = tight ? q_first : q_first / kBwdRows * kBwdRows; r0 < q_end; r0 += kBwdRows) {
        const int64_t rows = std::min(kBwdRows, (tight ? q_end : Nq) - r0);
        const float* dOi = dout.row(b, h, r0);
        src.logits(mm_, tid, b, h, r0, rows, c0, cols, P, kBwdCols);
        for (int64_t r = 0; r < rows; ++r) {
          float* Pr = P + r * kBwdCols;
          const auto [a, e] = ranged ? admissible(r0 + r, c0, cols) : std::pair<int64_t, int64_t>{0, cols};
          const float shift = lse_at(r0 + r);
          if (e <= a || shift == kNegInf) {
            fill(Pr, cols, 0.0f);
            continue;
          }
          drop_self(Pr, r0 + r, c0, a, e);
          exp_shift_sum(Pr + a, Pr + a, e - a, shift);
          if (a > 0) fill(Pr, a, 0.0f);
          if (e < cols) fill(Pr + e, cols - e, 0.0f);
        }
        const bool b16 = bf16_backward();
        const float* dO_p = b16 ? bf16_dout_.row(b, h, r0) : dOi;  // bf16: dO's copy
        if (!dropout_.active()) {
          // bf16: the products read P, dO, V and then dS rounded; dV, dP and dS stay float.
          if (b16)
            for (int64_t r = 0; r < rows; ++r) to_bf16(P + r * kBwdCols, Pb + r * kBwdCols, cols);
          mm_.run(tid, spec_dv(rows, cols), b16 ? static_cast<const void*>(Pb) : P, dO_p, dVj);
          mm_.run(tid, spec_dp(rows, cols), dO_p, b16 ? bf16_v_.row(b, h, c0) : Vj, dS);
          for (int64_t r = 0; r < rows; ++r) {
            const float* Pr = P + r * kBwdCols;
            float* dSr = dS + r * kBwdCols;
            const float dr = delta[r0 + r];
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) dSr[c] = Pr[c] * (dSr[c] - dr);
            if (b16) to_bf16(dSr, dSb + r * kBwdCols, cols);
          }
        } else {
          // With dropout M: O = (P * M) V. dP~ = dO V^T; dP = dP~ * M; dS = P * (dP - delta)
          // (delta = rowsum(dO * O) is rowsum(P * dP) still); then P becomes P * M for dV.
          // bf16: dO and V as their copies, P * M and dS rounded for their products.
          mm_.run(tid, spec_dp(rows, cols), dO_p, b16 ? bf16_v_.row(b, h, c0) : Vj, dS);
          for (int64_t r = 0; r < rows; ++r) {
            float* Pr = P + r * kBwdCols;
            float* dSr = dS + r * kBwdCols;
            const float dr = delta[r0 + r];
            const uint64_t row = static_cast<uint64_t>(bh * Nq + r0 + r);
            dropout_.apply(dSr, cols, row, c0);
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) dSr[c] = Pr[c] * (dSr[c] - dr);
            dropout_.apply(Pr, cols, row, c0);
            if (b16) {
              to_bf16(dSr, dSb + r * kBwdCols, cols);
              to_bf16(Pr, Pb + r * kBwdCols, cols);
            }
          }
          mm_.run(tid, spec_dv(rows, cols), b16 ? static_cast<const void*>(Pb) : P, dO_p, dVj);
        }
        const float* dS_p = b16 ? reinterpret_cast<const float*>(dSb) : dS;  // bf16: two to a float
        if (dq_part) src.logits_backward_partial(mm_, tid, b, h, r0, rows, c0, cols, dS_p, kBwdCols, dq_part + r0 * D);
        else src.logits_backward(mm_, tid, b, h, r0, rows, c0, cols, dS_p, kBwdCols);
      }
    }
  };
  if (parts == 1) {  // whole (b, h) pairs
    auto backward_pair = [&](int64_t bh) {
      const int tid = omp_get_thread_num();
      begin_pair(tid, bh);
      backward_keys(tid, bh, -1, nullptr);
      src.backward_end(mm_, tid, bh / shape_.H, bh % shape_.H);
    };
    if (shape_.static_schedule) {
#pragma omp parallel for schedule(static, 1)
      for (int64_t bh = 0; bh < BH; ++bh) backward_pair(bh);
    } else {
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t bh = 0; bh < BH; ++bh) backward_pair(bh);
    }
    return;
  }
  // Split pairs: pass 0 per pair, then (pair, part) items, part p taking the key tiles t with
  // key_part_of_tile_[t] = p; part 0 writes dQ through the source, each later part into
  // its own partial dQ, added in part order at the end (the same sums at every run).
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh) begin_pair(omp_get_thread_num(), bh);
  auto partial_dq = [&](int64_t bh, int64_t part) { return dq_parts_.data() + (bh * (parts - 1) + part - 1) * Nq * D; };
#pragma omp parallel for schedule(static)
  for (int64_t it = 0; it < BH * parts; ++it) {
    const int64_t bh = it / parts, part = it % parts;
    float* dq_part = part == 0 ? nullptr : partial_dq(bh, part);
    if (dq_part) fill(dq_part, Nq * D, 0.0f);
    backward_keys(omp_get_thread_num(), bh, part, dq_part);
  }
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh) {
    for (int64_t part = 1; part < parts; ++part)
      src.reduce_partial(bh / shape_.H, bh % shape_.H, partial_dq(bh, part));
    src.backward_end(mm_, omp_get_thread_num(), bh / shape_.H, bh % shape_.H);
  }
}

}  // namespace ab
