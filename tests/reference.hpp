// The tests' side of the double-precision references: the references themselves live beside the
// mechanisms (attention_impls/reference.hpp); here, how a kernel's output is compared with them.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_impls/reference.hpp"

namespace ab::ref {

// max |a - b| / max |b|: a relative error over the whole tensor. The denominator has a floor of
// 1e-2 (inputs are standard normal) so that a tensor that is exactly zero in theory, such as dQ
// when N = 1, is compared absolutely against float rounding. A caller whose zero-in-theory
// tensor is the difference of larger terms passes their scale as the floor (see max_abs).
inline double rel_err(const float* a, const std::vector<double>& b, double floor = 1e-2) {
  double num = 0, den = floor;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

inline double max_abs(const std::vector<double>& b) {
  double m = 0;
  for (double x : b) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace ab::ref
