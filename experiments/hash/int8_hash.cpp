// An exact int8 filter for reformer's hash: an experiment, not part of attnbench (CMake does not
// build it; experiments/hash/README.md). It needs AVX-512 VNNI.
//
// reformer's bucket is argmax over [x·R ; -x·R] (mechanisms.md), one fp32 product of D x n_buckets/2
// per row and round. This computes it exactly with a cheaper product:
//   1. quantise each row to int8 with its own scale (R once per head, untimed), and bound the
//      distance between the integer estimate and any fp32 evaluation of x·r_j by Cauchy-Schwarz
//      on the measured rounding errors plus the fp32 dot's own rounding (gamma_D);
//   2. the estimates by vpdpbusd, 16 columns per vector, 6 rows by 4 vectors per register block;
//   3. per row and round, the signed columns whose estimate is within twice the bound of the
//      best; a row with one is settled;
//   4. the others get fp32 dots for their candidates (16 at a time, one transposed reduction),
//      and the first largest wins, as in the fp32 argmax.
// It checks every bucket against a double-precision argmax and prints the time per head.
//
// Build and run (16384 rows, 128 rotation columns per round, D = 64, 4 rounds; then N=4096):
//   g++ -O3 -march=native -std=c++17 experiments/hash/int8_hash.cpp -o /tmp/int8_hash
//   /tmp/int8_hash 16384 128 64 && /tmp/int8_hash 4096 32 64
// Phases: add `skip-select` (quantise and product only) or `skip-refine` (no fp32 dots).
#include <immintrin.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>
#include <algorithm>
using namespace std;
static int N = 16384, D = 64, NH = 4, HALF = 128;

struct Hash8 {
  int D, D4, G, nh, half, vpr, cpad;  // cpad: padded columns per round = vpr*16
  vector<uint8_t> rq;   // [(r*vpr+cv)*G + g][16 lanes][4 bytes], u8 = rq+128
  vector<float> RT;     // [r*half + j][D]
  float s_r; double Rmax, DRmax, gamma;
  Hash8(const float* R /* (D, nh*half) row-major, round r cols r*half.. */, int D_, int nh_, int half_)
      : D(D_), nh(nh_), half(half_) {
    D4 = (D + 3) / 4 * 4; G = D4 / 4; vpr = (half + 15) / 16; cpad = vpr * 16;
    int C = nh * half;
    float amax = 0; for (int i = 0; i < D * C; ++i) amax = max(amax, fabsf(R[i]));
    s_r = amax / 127.0f;
    rq.assign((size_t)nh * vpr * G * 64, 128);
    RT.assign((size_t)C * D, 0);
    Rmax = DRmax = 0;
    for (int r = 0; r < nh; ++r)
      for (int j = 0; j < half; ++j) {
        double n2 = 0, d2 = 0;
        for (int d = 0; d < D; ++d) {
          float v = R[d * C + r * half + j];
          int q = (int)lrintf(v / s_r); q = max(-127, min(127, q));
          double dr = (double)v - (double)s_r * q;
          n2 += (double)v * v; d2 += dr * dr;
          int cv = j / 16, l = j % 16, g = d / 4, b = d % 4;
          rq[(((size_t)(r * vpr + cv) * G + g) * 16 + l) * 4 + b] = (uint8_t)(q + 128);
          RT[(size_t)(r * half + j) * D + d] = v;
        }
        Rmax = max(Rmax, sqrt(n2)); DRmax = max(DRmax, sqrt(d2));
      }
    double u = ldexp(1.0, -24); gamma = D * u / (1 - D * u);
  }
};

constexpr int RB = 6;
template <int VB>
static void kernel(const Hash8& H, const int8_t* xq /* RB rows x D4 */, const int32_t* sumq, int r, int cv0, int32_t* S /* RB x ld */, int ld) {
  __m512i acc[RB][VB];
  for (int i = 0; i < RB; ++i) { __m512i c = _mm512_set1_epi32(-128 * sumq[i]); for (int v = 0; v < VB; ++v) acc[i][v] = c; }
  const uint8_t* base = H.rq.data() + (size_t)(r * H.vpr + cv0) * H.G * 64;
  for (int g = 0; g < H.G; ++g) {
    __m512i rv[VB];
    for (int v = 0; v < VB; ++v) rv[v] = _mm512_loadu_si512(base + ((size_t)v * H.G + g) * 64);
    for (int i = 0; i < RB; ++i) {
      int32_t w; memcpy(&w, xq + i * H.D4 + 4 * g, 4);
      __m512i xb = _mm512_set1_epi32(w);
      for (int v = 0; v < VB; ++v) acc[i][v] = _mm512_dpbusd_epi32(acc[i][v], rv[v], xb);
    }
  }
  for (int i = 0; i < RB; ++i) for (int v = 0; v < VB; ++v) _mm512_storeu_si512(S + i * ld + (cv0 + v) * 16, acc[i][v]);
}

long long n_refined = 0, n_cand = 0;
// Candidates of one row and round: signed columns (j, or half + j for -x·r_j) whose estimate is
// within thr of the best, written to out in index order; returns their count.
template <int VPR>
static inline int candidates(const int32_t* s, int half, __mmask16 lastmask, int32_t thr, int32_t* out) {
  __m512i a[VPR];
  __m512i mx = _mm512_setzero_si512();
  for (int v = 0; v < VPR; ++v) {
    a[v] = _mm512_loadu_si512(s + 16 * v);
    const __m512i ab = _mm512_abs_epi32(a[v]);
    mx = _mm512_max_epi32(mx, v == VPR - 1 ? _mm512_maskz_mov_epi32(lastmask, ab) : ab);
  }
  const int32_t lo = _mm512_reduce_max_epi32(mx) - thr;
  const __m512i vlo = _mm512_set1_epi32(lo), vnlo = _mm512_set1_epi32(-lo);
  uint64_t P[(VPR + 3) / 4] = {}, M[(VPR + 3) / 4] = {};
  for (int v = 0; v < VPR; ++v) {
    const __mmask16 valid = v == VPR - 1 ? lastmask : (__mmask16)0xFFFF;
    P[v / 4] |= (uint64_t)_mm512_mask_cmpge_epi32_mask(valid, a[v], vlo) << (16 * (v % 4));
    M[v / 4] |= (uint64_t)_mm512_mask_cmple_epi32_mask(valid, a[v], vnlo) << (16 * (v % 4));
  }
  int cnt = 0;
  for (int w = 0; w < (VPR + 3) / 4; ++w) cnt += __builtin_popcountll(P[w]) + __builtin_popcountll(M[w]);
  int k = 0;
  if (cnt == 1) {
    int32_t best = 0;
    for (int w = 0; w < (VPR + 3) / 4; ++w) {
      if (P[w]) best = 64 * w + __builtin_ctzll(P[w]);
      if (M[w]) best = half + 64 * w + __builtin_ctzll(M[w]);
    }
    out[0] = best;
    return 1;
  }
  for (int w = 0; w < (VPR + 3) / 4; ++w)
    for (uint64_t m = P[w]; m; m &= m - 1) out[k++] = 64 * w + __builtin_ctzll(m);
  for (int w = 0; w < (VPR + 3) / 4; ++w)
    for (uint64_t m = M[w]; m; m &= m - 1) out[k++] = half + 64 * w + __builtin_ctzll(m);
  return k;
}
static int candidates_any(const int32_t* s, int vpr, int half, __mmask16 lastmask, int32_t thr, int32_t* out) {
  __m512i mx = _mm512_setzero_si512();
  for (int v = 0; v < vpr; ++v) {
    const __m512i ab = _mm512_abs_epi32(_mm512_loadu_si512(s + 16 * v));
    mx = _mm512_max_epi32(mx, v == vpr - 1 ? _mm512_maskz_mov_epi32(lastmask, ab) : ab);
  }
  const int32_t lo = _mm512_reduce_max_epi32(mx) - thr;
  int k = 0;
  for (int sg = 0; sg < 2; ++sg)
    for (int v = 0; v < vpr; ++v) {
      const __mmask16 valid = v == vpr - 1 ? lastmask : (__mmask16)0xFFFF;
      const __m512i a = _mm512_loadu_si512(s + 16 * v);
      __mmask16 m = sg ? _mm512_mask_cmple_epi32_mask(valid, a, _mm512_set1_epi32(-lo)) : _mm512_mask_cmpge_epi32_mask(valid, a, _mm512_set1_epi32(lo));
      for (; m; m &= m - 1) out[k++] = sg * half + 16 * v + __builtin_ctz(m);
    }
  return k;
}
// lane k of the result = sum of the lanes of p[k]
static inline __m512 hsum16(__m512* p) {
  __m512 s[8], u[4], y[2];
  for (int k = 0; k < 8; ++k) {
    __m512 a = p[2 * k], b = p[2 * k + 1];
    s[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }  // s[k], by 128-bit lane: p[2k] lanes 0+2, p[2k] 1+3, p[2k+1] 0+2, p[2k+1] 1+3
  for (int k = 0; k < 4; ++k) {
    __m512 a = s[2 * k], b = s[2 * k + 1];
    u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  }  // u[k] 128-bit lanes: p[4k], p[4k+1], p[4k+2], p[4k+3] each 4 partial floats
  for (int k = 0; k < 2; ++k) {
    __m512 a = u[2 * k], b = u[2 * k + 1];
    y[k] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // z lane 4L+e holds the sum of p[4e+L]
  const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(perm, z);
}
static bool skip_select = false, skip_refine = false;
void hash8(const Hash8& H, const float* X, int n, int ldx, int32_t* out /* nh x n */) {
  const int D = H.D, D4 = H.D4, half = H.half, vpr = H.vpr, cpad = H.cpad, nh = H.nh;
  alignas(64) int8_t xq[RB * 256];
  int32_t sumq[RB], thr[RB]; bool zero[RB];
  // Workspace: sized on the first call (main's untimed checking call), so the timed calls do not
  // allocate.
  struct Group { int row, r, begin, end; };
  static vector<int32_t> S, candv, crowv, croundv;
  static vector<float> cvalv;
  static vector<Group> groupsv;
  const size_t maxc = (size_t)RB * nh * 2 * cpad + 32;
  if (S.size() < (size_t)RB * nh * cpad) S.resize((size_t)RB * nh * cpad);
  if (candv.size() < maxc) candv.resize(maxc), crowv.resize(maxc), croundv.resize(maxc), cvalv.resize(maxc);
  if (groupsv.size() < (size_t)RB * nh) groupsv.resize((size_t)RB * nh);
  int32_t *cand = candv.data(), *crow = crowv.data(), *cround = croundv.data(); float* cval = cvalv.data();
  Group* groups = groupsv.data();
  const int ld = nh * cpad;
  const __mmask16 lastmask = (half % 16) ? (__mmask16)((1u << (half % 16)) - 1) : 0xFFFF;
  for (int i0 = 0; i0 < n; i0 += RB) {
    // A: quantise
    for (int i = 0; i < RB; ++i) {
      int row = i0 + i;
      int8_t* q = xq + i * D4;
      memset(q, 0, D4);
      zero[i] = true; sumq[i] = 0; thr[i] = 0;
      if (row >= n) continue;
      const float* x = X + (size_t)row * ldx;
      __m512 vmax = _mm512_setzero_ps();
      for (int d = 0; d < D; d += 16) {
        __mmask16 m = D - d >= 16 ? 0xFFFF : (__mmask16)((1u << (D - d)) - 1);
        vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + d)));
      }
      float amax = _mm512_reduce_max_ps(vmax);
      if (amax == 0) continue;
      zero[i] = false;
      if (!std::isfinite(amax)) { thr[i] = 1 << 30; continue; }
      float s_x = amax / 127.0f, inv = 127.0f / amax;
      __m512 vs = _mm512_set1_ps(s_x), vinv = _mm512_set1_ps(inv), lim = _mm512_set1_ps(127.0f);
      __m512 nx2 = _mm512_setzero_ps(), ndx2 = _mm512_setzero_ps(), nxt2 = _mm512_setzero_ps();
      __m512i vsq = _mm512_setzero_si512();
      for (int d = 0; d < D; d += 16) {
        __mmask16 m = D - d >= 16 ? 0xFFFF : (__mmask16)((1u << (D - d)) - 1);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + d);
        __m512 qf = _mm512_roundscale_ps(_mm512_mul_ps(xv, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        qf = _mm512_min_ps(_mm512_max_ps(qf, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
        __m512i qi = _mm512_cvtps_epi32(qf);
        _mm_mask_storeu_epi8(q + d, m, _mm512_cvtepi32_epi8(qi));
        vsq = _mm512_add_epi32(vsq, qi);
        __m512 xt = _mm512_mul_ps(vs, qf), dx = _mm512_sub_ps(xv, xt);
        nx2 = _mm512_fmadd_ps(xv, xv, nx2); ndx2 = _mm512_fmadd_ps(dx, dx, ndx2); nxt2 = _mm512_fmadd_ps(xt, xt, nxt2);
      }
      float nx = _mm512_reduce_add_ps(nx2), ndx = _mm512_reduce_add_ps(ndx2), nxt = _mm512_reduce_add_ps(nxt2);
      int sq = _mm512_reduce_add_epi32(vsq);
      sumq[i] = sq;
      double bound = sqrt((double)ndx) * H.Rmax + sqrt((double)nxt) * H.DRmax + H.gamma * sqrt((double)nx) * H.Rmax;
      double t = 2.0 * bound * 1.001 / ((double)s_x * H.s_r) + 2.0;
      thr[i] = (int32_t)min(t, 1073741824.0);
    }
    // B: products
    for (int r = 0; r < nh; ++r) {
      int cv = 0;
      for (; cv + 4 <= vpr; cv += 4) kernel<4>(H, xq, sumq, r, cv, S.data() + r * cpad - 0, ld);
      for (; cv + 2 <= vpr; cv += 2) kernel<2>(H, xq, sumq, r, cv, S.data() + r * cpad, ld);
      for (; cv < vpr; ++cv) kernel<1>(H, xq, sumq, r, cv, S.data() + r * cpad, ld);
    }
    // C: select
    if (skip_select) continue;
    int ncand = 0, ngroups = 0;
    for (int i = 0; i < RB && i0 + i < n; ++i) {
      int row = i0 + i;
      for (int r = 0; r < nh; ++r) {
        if (zero[i]) { out[r * n + row] = 0; continue; }
        const int32_t* s = S.data() + i * ld + r * cpad;
        const int begin = ncand;
        ncand += vpr == 8 ? candidates<8>(s, half, lastmask, thr[i], cand + ncand)
               : vpr == 2 ? candidates<2>(s, half, lastmask, thr[i], cand + ncand)
                          : candidates_any(s, vpr, half, lastmask, thr[i], cand + ncand);
        if (ncand - begin == 1) { out[r * n + row] = cand[begin]; ncand = begin; continue; }
        if (skip_refine) { out[r * n + row] = cand[begin]; ncand = begin; continue; }
        ++n_refined; n_cand += ncand - begin;
        for (int k = begin; k < ncand; ++k) crow[k] = i, cround[k] = r;
        groups[ngroups++] = {row, r, begin, ncand};
      }
    }
    // refine: dots for all candidates in batches of 16
    for (int k = ncand; k < (ncand + 15) / 16 * 16; ++k) cand[k] = 0, crow[k] = 0, cround[k] = 0;
    for (int k0 = 0; k0 < ncand; k0 += 16) {
      __m512 p[16];
      for (int k = 0; k < 16; ++k) {
        const int c = cand[k0 + k], col = c >= half ? c - half : c;
        const float* x = X + (size_t)(i0 + crow[k0 + k]) * ldx;
        const float* rt = H.RT.data() + (size_t)(cround[k0 + k] * half + col) * D;
        __m512 acc = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) {
          __mmask16 m = D - d >= 16 ? 0xFFFF : (__mmask16)((1u << (D - d)) - 1);
          acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + d), _mm512_maskz_loadu_ps(m, rt + d), acc);
        }
        p[k] = acc;
      }
      _mm512_storeu_ps(cval + k0, hsum16(p));
    }
    for (int gi = 0; gi < ngroups; ++gi) {
      const Group& g = groups[gi];
      int best = -1; float bv = 0;
      for (int k = g.begin; k < g.end; ++k) {
        const float v = cand[k] >= half ? -cval[k] : cval[k];
        if (best < 0 || v > bv) bv = v, best = cand[k];
      }
      out[g.r * n + g.row] = best;
    }
  }
}

int main(int argc, char** argv) {
  int pos = 0;
  for (int k = 1; k < argc; ++k) {
    const string a = argv[k];
    if (a == "skip-select") skip_select = true;
    else if (a == "skip-refine") skip_refine = true;
    else if (pos < 3 && atoi(argv[k]) > 0) (pos == 0 ? N : pos == 1 ? HALF : D) = atoi(argv[k]), ++pos;
    else { fprintf(stderr, "usage: %s [N [half [D]]] [skip-select] [skip-refine]\n", argv[0]); return 2; }
  }
  if (D > 256) { fprintf(stderr, "D=%d: this experiment handles D <= 256\n", D); return 2; }
  mt19937 rng(1); normal_distribution<float> nd;
  vector<float> X((size_t)N * D), R((size_t)D * NH * HALF);
  for (auto& v : X) v = nd(rng);
  for (auto& v : R) v = nd(rng);
  Hash8 H(R.data(), D, NH, HALF);
  vector<int32_t> out((size_t)NH * N);
  hash8(H, X.data(), N, D, out.data());
  int mism = 0; double worst = 0;
  {
  for (int r = 0; r < NH; ++r) for (int i = 0; i < N; ++i) {
    double bv = -1e300; int bi = 0; vector<double> p(2 * HALF);
    for (int j = 0; j < HALF; ++j) { double s = 0; for (int d = 0; d < D; ++d) s += (double)X[(size_t)i * D + d] * R[(size_t)d * NH * HALF + r * HALF + j]; p[j] = s; p[HALF + j] = -s; }
    for (int j = 0; j < 2 * HALF; ++j) if (p[j] > bv) { bv = p[j]; bi = j; }
    int got = out[r * N + i];
    if (got != bi) { ++mism; worst = max(worst, bv - p[got]); }
  }
  }
  printf("mismatches %d worst gap %.3g refined %.1f%% cand/refined %.2f\n", mism, worst, 100.0 * n_refined / (NH * N), (double)n_cand / max(1LL, n_refined));
  double best = 1e9;
  for (int rep = 0; rep < 7; ++rep) {
    auto t = chrono::steady_clock::now();
    hash8(H, X.data(), N, D, out.data());
    best = min(best, chrono::duration<double>(chrono::steady_clock::now() - t).count());
  }
  printf("N=%d half=%d D=%d: %.3f ms per head (best of 7)\n", N, HALF, D, best * 1e3);
}
