// RoPE (Su et al., RoFormer, eq. 34): the rotation of each pair (2i, 2i+1) of a row's dimensions
// at position n by the angle n·θ_i, θ_i = 10000^(-2i/width). Rotated rows keep their norms, and
// the product of a row rotated to position m with one rotated to position n depends on m - n only.
// The model rotates each head's queries and keys with it; the kernel family (linear, performer)
// rotates its feature maps in the numerator, RoFormer's section 3.3.
#pragma once
#include <cstdint>

namespace ab {

// The table for positions [0, N) of rows of `width` (even) dimensions: cos (N, width/2), then
// sin (N, width/2).
void rope_table(int64_t N, int64_t width, float* cos_sin);

// `rows` rows of x (row stride ld, `width` dimensions) at positions pos0, pos0 + 1, ... rotated in
// place by their angles from a table of `table_rows` positions; inverse: by minus the angles,
// which is also the backward pass (a rotation's transpose is its inverse): dx = R^T dy.
void rope_rotate_rows(float* x, int64_t rows, int64_t ld, int64_t width, const float* cos_sin, int64_t table_rows,
                      int64_t pos0, bool inverse);

// x (B, H, N, width), every (b, h) rotated as above from position 0 (threads over b, h, n).
void rope_rotate(float* x, int64_t B, int64_t H, int64_t N, int64_t width, const float* cos_sin, bool inverse);

}  // namespace ab
