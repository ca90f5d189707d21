// The significance test of `compare`: Mann-Whitney U on the repetitions of two runs.
#pragma once
#include <vector>

namespace ab {

struct MannWhitney {
  double u = 0;         // U of `b`: pairs (a_i, b_j) with b_j > a_i, ties counted one half
  double p_greater = 1; // one-sided p-value of "b tends to be larger than a"
  double p_less = 1;    // one-sided p-value of "b tends to be smaller than a"
  bool exact = false;   // exact permutation distribution (no ties, small samples)
  double min_p = 1;     // the smallest one-sided p-value these sample sizes can give
};

// Exact distribution of U when there are no ties and n_a * n_b <= 2500; otherwise the normal
// approximation with the tie correction and a continuity correction.
MannWhitney mann_whitney(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace ab
