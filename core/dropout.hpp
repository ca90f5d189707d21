// Dropout masks that are a function of where they apply, not of a generator's state: element
// (row, j) of a site is kept when a hash of (key, row, j) clears the threshold, and the kept ones
// are scaled by 1 / (1 - rate). The forward pass, the backward pass and a rerun from a checkpoint
// recompute the same mask without storing it, whatever the thread count or the order of tiles.
// The key names the site and the step (the model mixes its seed, step, layer and site into it).
#pragma once
#include <bit>
#include <cstdint>

namespace ab {

// splitmix64's finaliser: a well-mixed 64-bit function of a 64-bit input.
constexpr uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// lowbias32 (Wellons): a cheap 32-bit mixer that vectorises (integer multiplies and shifts).
constexpr uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

struct Dropout {
  float rate = 0;    // in [0, 1): the probability an element is dropped
  uint64_t key = 0;  // the site and step

  bool active() const { return rate > 0; }
  // Derived keys for the parts of one site (a layer's sub-sites, a pattern's segments).
  Dropout with_salt(uint64_t salt) const { return Dropout{rate, mix64(key ^ mix64(salt))}; }
  Dropout with_rate(float r) const { return Dropout{r, key}; }
  uint32_t threshold() const { return static_cast<uint32_t>(static_cast<double>(rate) * 4294967296.0); }
  float scale() const { return 1.0f / (1.0f - rate); }
  uint32_t row_seed(uint64_t row) const { return static_cast<uint32_t>(mix64(key + mix64(row)) >> 32); }
  // Whether element (row, j) is kept.
  bool keep(uint64_t row, int64_t j) const {
    return mix32(row_seed(row) ^ static_cast<uint32_t>(j) * 0x9E3779B9u) >= threshold();
  }
  // x[c] *= keep(row, j0 + c) / (1 - rate), c < n.
  void apply(float* x, int64_t n, uint64_t row, int64_t j0) const {
    const uint32_t seed = row_seed(row), t = threshold();
    const float s = scale();
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) {
      const uint32_t h = mix32(seed ^ static_cast<uint32_t>(j0 + c) * 0x9E3779B9u);
      // A bit mask, not `h >= t ? x[c] * s : 0`: GCC keeps that a branch and runs the loop a
      // lane at a time, ten times slower (dropout was a third of a training step). The mask
      // gives the same bits: kept x * s, dropped +0.
      const uint32_t keep = h >= t ? ~0u : 0u;
      x[c] = std::bit_cast<float>(std::bit_cast<uint32_t>(x[c] * s) & keep);
    }
  }
};

}  // namespace ab
