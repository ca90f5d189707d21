// Building blocks for the fixed sparse patterns' segments (see sparse_attention.hpp).
#pragma once
#include <algorithm>
#include <vector>

#include "attention_impls/sparse_attention.hpp"

namespace ab {

inline RowSet rows(int64_t first, int64_t n, int64_t step = 1) { return RowSet{first, step, n, 0}; }

// Rows per score tile of the banded segments: 48 rows and the band's width (capped) as columns,
// so a block of queries is one product with the keys it may use. 32, 48 and 64 rows measured
// the same at window 64: smaller tiles waste fewer keys, larger ones make faster products.
constexpr int64_t kBandRows = 48, kMaxBandCols = 512;
inline void band_tiles(Segment& s, int64_t width, int64_t rows = kBandRows) {
  s.tight = true;
  s.tile_rows = rows;
  s.tile_cols = std::max<int64_t>(16, std::min(width, kMaxBandCols));
}

// Queries and keys the same rows; key range [t - before, t + after + 1) (after may be -1 to
// stop before the query itself).
inline Segment band(RowSet same, int64_t before, int64_t after, bool causal) {
  Segment s;
  s.queries = s.keys = same;
  s.causal = causal;
  s.range = [before, after](int64_t t) { return std::pair<int64_t, int64_t>{t - before, t + after + 1}; };
  band_tiles(s, kBandRows + before + std::max<int64_t>(after, 0));
  s.diagonal = true;
  return s;
}

// Longformer's global keys (sequence rows 0 .. n - 1) inside a band's forward pass: with the
// diagonal kernel, each 16 queries score them beside their own keys, in the same pass over their
// output rows, instead of a second segment that reads and rescales every output row again.
// Returns false, the band unchanged, where the kernel does not run (then the keys need a segment
// of their own in the forward pass too).
inline bool fuse_prefix_keys(Segment& band, int64_t n, int64_t D) {
  const int64_t R = TiledSoftmax::kDiagonalRows;
  const int64_t widest = band.range(R - 1).second - band.range(0).first;  // the keys of 16 rows
  if (!TiledSoftmax::diagonal_kernel(D) || !TiledSoftmax::diagonal_fits(D, widest, n, band.tile_rows * band.tile_cols))
    return false;
  band.prefix_keys = n;
  return true;
}

// Rows per score tile of a blocked band: a whole block of 32 to 128 rows, or 64-row parts of a
// block that is a multiple of 64. Such a tile starts on a block boundary and all its rows have
// one key range, so it scores no key outside the window (local's default 64 x 64 blocks: 64 x 192
// tiles instead of 48-row tiles, half of which straddle two blocks and need 256 columns).
// Other blocks get kBandRows, whose tiles may straddle blocks.
inline int64_t block_band_rows(int64_t block) {
  if (block >= 32 && block <= 128) return block;
  if (block % 64 == 0) return 64;
  return kBandRows;
}

// Queries and keys the same rows cut into blocks of `block`; query block q uses key blocks
// q - before .. q + after.
inline Segment block_band(RowSet same, int64_t block, int64_t before, int64_t after, bool causal) {
  Segment s;
  s.queries = s.keys = same;
  s.causal = causal;
  s.range = [block, before, after](int64_t t) {
    const int64_t q = t / block;
    return std::pair<int64_t, int64_t>{(q - before) * block, (q + after + 1) * block};
  };
  const int64_t rows = block_band_rows(block);
  // Tiles of rows a multiple or a divisor of the block span whole blocks: rows / block of them,
  // or one; a tile of other rows spans at most ceil(rows / block) + 1.
  const int64_t spanned = rows % block == 0 ? rows / block : block % rows == 0 ? 1 : (rows + block - 1) / block + 1;
  band_tiles(s, (before + after + spanned) * block, rows);
  return s;
}

// The residue classes modulo `step` of N rows, as at most two folded row sets (residues
// r < N mod step have one row more than the others).
inline std::vector<RowSet> residue_classes(int64_t N, int64_t step) {
  std::vector<RowSet> out;
  const int64_t q = N / step, rem = N % step;
  if (rem > 0) out.push_back(RowSet{0, step, q + 1, std::min(rem, step)});
  if (q > 0 && step - rem > 0) out.push_back(RowSet{rem, step, q, step - rem});
  return out;
}

// Every query of `queries` uses every key of `keys`. A strip (a few queries against many keys,
// or many queries against a few keys: Longformer's and BigBird's global rows and columns) gets
// tiles of the default area stretched along its long side, up to 2048: longer products pay
// oneDNN's per-call cost less often. A strip of at most kKeysMajorQueries queries computes its
// logits keys-major (see QKLogits).
constexpr int64_t kMaxStripTile = 2048, kKeysMajorQueries = 32;
inline Segment dense(RowSet queries, RowSet keys) {
  Segment s;
  s.queries = queries;
  s.keys = keys;
  if (keys.n < s.tile_cols || queries.n < s.tile_rows) {  // a strip
    const int64_t area = s.tile_rows * s.tile_cols;
    if (keys.n < s.tile_cols) {
      s.tile_cols = std::max<int64_t>(keys.n, 1);
      s.tile_rows = std::min(kMaxStripTile, area / s.tile_cols);
    } else {
      s.tile_rows = std::max<int64_t>(queries.n, 1);
      s.tile_cols = std::min(kMaxStripTile, area / s.tile_rows);
    }
    s.bwd_tile_rows = s.tile_rows;  // the backward's tiles stretched the same way, not transposed
    s.bwd_tile_cols = s.tile_cols;
  }
  s.keys_major = queries.n <= kKeysMajorQueries;
  return s;
}

// Longformer's pattern (longformer.cpp), also ETC's: a window of `window` steps of `dilation`
// on each side, plus the first `global` rows attending and attended by every row.
std::unique_ptr<Attention> make_global_window(const AttnProblem& p, int64_t window, int64_t dilation, int64_t global);

}  // namespace ab
