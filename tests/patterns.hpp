// The dense masks of the fixed sparse patterns, written from each pattern's definition
// (docs/mechanisms.md) independently of the segment decomposition: what the sparse tests compare
// the mechanisms against.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/reference.hpp"

namespace ab::test {

// The value of `name=` among --param assignments, or def.
inline int64_t param(const std::vector<std::string>& ps, const std::string& name, int64_t def) {
  for (const auto& p : ps)
    if (p.rfind(name + "=", 0) == 0) return std::stoll(p.substr(name.size() + 1));
  return def;
}

// The dense mask of each pattern, from its definition.
inline ref::Mask pattern_mask(const std::string& mech, const std::vector<std::string>& ps, int64_t N, bool causal) {
  ref::Mask m;
  if (mech == "local") {
    const int64_t L = param(ps, "block", 64), back = param(ps, "lookback", 1),
                  ahead = causal ? 0 : param(ps, "lookahead", 1);
    m = [=](int64_t i, int64_t j) { return j / L >= i / L - back && j / L <= i / L + ahead; };
  } else if (mech == "sliding") {
    const int64_t w = param(ps, "window", 64);
    m = [=](int64_t i, int64_t j) { return std::abs(i - j) <= w; };
  } else if (mech == "dilated") {
    const int64_t w = param(ps, "window", 64), d = param(ps, "dilation", 2);
    m = [=](int64_t i, int64_t j) { return std::abs(i - j) % d == 0 && std::abs(i - j) / d <= w; };
  } else if (mech == "strided") {
    int64_t l = param(ps, "stride", 64);
    if (l == 0) l = std::max<int64_t>(1, std::llround(std::sqrt(double(N))));
    const int64_t c = param(ps, "summary", 8);
    const bool fixed = std::find(ps.begin(), ps.end(), "pattern=fixed") != ps.end();
    if (fixed) m = [=](int64_t i, int64_t j) { return j / l == i / l || j % l >= l - c; };
    else m = [=](int64_t i, int64_t j) { return std::abs(i - j) < l || (i - j) % l == 0; };
  } else if (mech == "etc") {  // the first `global` rows are the global tokens
    const int64_t r = param(ps, "radius", 64), g = param(ps, "global", 16);
    m = [=](int64_t i, int64_t j) { return i < g || j < g || std::abs(i - j) <= r; };
  } else if (mech == "longformer") {
    const int64_t w = param(ps, "window", 64), d = param(ps, "dilation", 1), g = param(ps, "global", 16);
    m = [=](int64_t i, int64_t j) {
      return i < g || j < g || (std::abs(i - j) % d == 0 && std::abs(i - j) / d <= w);
    };
  }
  if (!causal) return m;
  return [m](int64_t i, int64_t j) { return j <= i && m(i, j); };
}

// BigBird's dense mask for head h: its global, window and drawn random blocks (the dumped
// random_blocks, (H, nb, r)).
inline ref::Mask bigbird_mask(const int64_t* drawn, int64_t h, int64_t nb, int64_t b, int64_t g, int64_t r) {
  const int64_t g1 = (g + 1) / 2, g2 = g / 2;
  auto global = [=](int64_t k) { return k < g1 || k >= nb - g2; };
  return [=](int64_t i, int64_t j) {
    const int64_t q = i / b, k = j / b;
    if (global(q) || global(k) || std::abs(q - k) <= 1) return true;
    for (int64_t t = 0; t < r; ++t)
      if (drawn[(h * nb + q) * r + t] == k) return true;
    return false;
  };
}

}  // namespace ab::test
