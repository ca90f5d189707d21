// The random-rotation hash of LSH attention (reformer), computed exactly:
//   bucket(x) = argmax([x·R ; -x·R]), the first index on ties, for each round's R (D, half).
//
// Why not a float product: the hash is the only part of reformer whose cost grows faster than
// N (half = n_buckets/2 grows with N by default), so its rate decides how reformer scales. An
// f32 product rounds, so its argmax is itself an approximation at near-ties; and on AVX2 the
// 16-bit multiply-add (vpmaddwd: 16 products per instruction, two per cycle) outruns f32 FMA.
//
// How it stays exact: each row x is scaled to the norm 32000 and rounded to int16 (x^), each
// round's R by one factor and rounded to int16 (R^); the integer products s^ = x^·R^ are exact in
// int32 (the scales keep ||x^||·||r^_c|| < 2^31, so no partial sum overflows). With every
// rounding error below 0.502, |s_c - s^_c| <= E = 0.502 (||x^||_1 + ||r^_c||_1) + 0.252 D for the
// true scaled product s_c. Where the largest |s^_c| beats the second by more than 2E (and 2E
// itself), its column and sign are the exact argmax; otherwise (about 1% of rows and rounds at
// D = 64, half = 128; every zero or non-finite row) the columns within 2E of the top are
// recomputed in double from the f32 inputs, which is exact up to ties closer than double
// rounding, and the first index wins among equals.
//
// Work per row and round: D·half multiply-adds in 16-bit integers (counted as 2·D·half
// operations, like the product it replaces), then one pass over the half values.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/memory.hpp"

namespace ab {

// inv[i] = 1/||x_i|| for rows x (rows x D, row stride ldx); 0 for a zero row, and for a row whose
// squared norm overflows or is NaN. reformer's keys are x_i·inv[i], and the hash's scale is
// 32000·inv[i].
void inverse_norms(const float* x, int64_t ldx, int64_t rows, int64_t D, float* inv);

class RotationHash {
 public:
  // One head's rotations for `rounds` rounds: round r's R (D, half) is row-major at
  // rotations + r * round_stride. Untimed setup: quantises and packs them (tracked memory).
  // The rotations must outlive the hash (the exact path reads them).
  RotationHash(const float* rotations, int64_t round_stride, int64_t rounds, int64_t D, int64_t half);

  // Quantises and packs the rotations again, after they were redrawn in place. No allocation.
  void repack();

  // Tracked bytes the constructor allocates, and the per-thread scratch assign() needs.
  static size_t packed_bytes(int64_t rounds, int64_t D, int64_t half);
  static size_t scratch_bytes(int64_t D, int64_t half);

  // buckets[r * bucket_stride + i] = the bucket of row i of x (rows x D, row stride ldx) in
  // round r, given inv = inverse_norms of those rows. scratch: scratch_bytes(D, half) bytes,
  // 32-byte aligned. Returns the number of (row, round) pairs that took the exact path. No
  // allocation.
  int64_t assign(const float* x, int64_t ldx, int64_t rows, const float* inv, void* scratch, int64_t* buckets,
                 int64_t bucket_stride) const;

  // The same with the portable kernels, whatever the build: tests compare the two paths.
  int64_t assign_portable(const float* x, int64_t ldx, int64_t rows, const float* inv, void* scratch,
                          int64_t* buckets, int64_t bucket_stride) const;

 private:
  template <bool Portable>
  int64_t assign_impl(const float* x, int64_t ldx, int64_t rows, const float* inv, void* scratch, int64_t* buckets,
                      int64_t bucket_stride) const;

  const float* rotations_ = nullptr;
  int64_t round_stride_ = 0, rounds_ = 0, D_ = 0, half_ = 0, pairs_ = 0;
  // Per round: R^ as (pairs, half) int32, each holding the int16 pair (R^[2k][c], R^[2k+1][c]);
  // then per round the largest ||r^_c||_1.
  Buffer<int32_t> packed_;
};

}  // namespace ab
