// The dense masks the sparse tests compare the mechanisms against: each pattern's own formula
// (its file's reference_mask, independent of the segment decomposition that computes it), and
// BigBird's, which depends on its dumped random draw.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention_impls/registry.hpp"
#include "tests/reference.hpp"

namespace ab::test {

// The value of `name=` among --param assignments, or def.
inline int64_t param(const std::vector<std::string>& ps, const std::string& name, int64_t def) {
  for (const auto& p : ps)
    if (p.rfind(name + "=", 0) == 0) return std::stoll(p.substr(name.size() + 1));
  return def;
}

// The dense mask of a pattern at these --param assignments: the formula its own file states
// beside its kernel (MechanismInfo::reference_mask), at the mechanism's resolved parameters.
inline ref::Mask pattern_mask(const std::string& mech, const std::vector<std::string>& ps, int64_t N, bool causal) {
  const MechanismInfo& info = find_mechanism(mech);
  if (!info.reference_mask) throw std::logic_error(mech + " states no reference mask");
  return info.reference_mask(resolve_params(info, ps), N, causal);
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
