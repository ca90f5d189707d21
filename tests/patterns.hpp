// The dense masks the sparse tests compare the mechanisms against: each pattern's own formula
// (its file's reference_mask, independent of the segment decomposition that computes it); BigBird's,
// which depends on its dumped random draw, is ref::bigbird_mask beside its kernel.
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

}  // namespace ab::test
