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
inline void band_tiles(Segment& s, int64_t width) {
  s.tight = true;
  s.tile_rows = kBandRows;
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
  return s;
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
  // A block of kBandRows queries spans at most kBandRows / block + 2 blocks of queries.
  band_tiles(s, (before + after + 1) * block + (kBandRows + block - 1) / block * block);
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

}  // namespace ab
