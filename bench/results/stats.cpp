#include "bench/results/stats.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace ab {

namespace {
// Number of arrangements of m a's and n b's with U_b = u, for every u (0 .. m*n), by the
// recursion on the largest element: it is a b (adds m to U) or an a (adds 0).
std::vector<double> u_counts(int m, int n) {
  // f[j][u] for the current i = number of a's; rolled over i.
  std::vector<std::vector<double>> f(static_cast<size_t>(n + 1));
  for (int j = 0; j <= n; ++j) f[static_cast<size_t>(j)] = std::vector<double>(1, 1.0);  // i = 0: U = 0
  for (int i = 1; i <= m; ++i) {
    std::vector<std::vector<double>> g(static_cast<size_t>(n + 1));
    g[0] = std::vector<double>(1, 1.0);
    for (int j = 1; j <= n; ++j) {
      std::vector<double> cur(static_cast<size_t>(i * j + 1), 0.0);
      const auto& last_a = f[static_cast<size_t>(j)];      // largest is an a: (i-1, j), U unchanged
      const auto& last_b = g[static_cast<size_t>(j - 1)];  // largest is a b: (i, j-1), U + i
      for (size_t u = 0; u < last_a.size(); ++u) cur[u] += last_a[u];
      for (size_t u = 0; u < last_b.size(); ++u) cur[u + static_cast<size_t>(i)] += last_b[u];
      g[static_cast<size_t>(j)] = std::move(cur);
    }
    f = std::move(g);
  }
  return f[static_cast<size_t>(n)];
}

double normal_sf(double z) { return 0.5 * std::erfc(z / std::sqrt(2.0)); }
}  // namespace

MannWhitney mann_whitney(const std::vector<double>& a, const std::vector<double>& b) {
  MannWhitney r;
  const size_t m = a.size(), n = b.size();
  if (m == 0 || n == 0) return r;
  // One arrangement in C(m + n, m) is the most extreme.
  double c = 1;
  for (size_t k = 1; k <= std::min(m, n); ++k) c = c * static_cast<double>(m + n - std::min(m, n) + k) / static_cast<double>(k);
  r.min_p = 1 / c;
  bool ties = false;
  for (double x : a)
    for (double y : b) {
      if (y > x) r.u += 1;
      else if (y == x) {
        r.u += 0.5;
        ties = true;
      }
    }
  std::vector<double> all(a);
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  ties = ties || std::adjacent_find(all.begin(), all.end()) != all.end();
  const double mn = static_cast<double>(m * n);
  if (!ties && m * n <= 2500) {
    const auto counts = u_counts(static_cast<int>(m), static_cast<int>(n));
    double total = 0, ge = 0, le = 0;
    const auto u = static_cast<size_t>(r.u);
    for (size_t k = 0; k < counts.size(); ++k) {
      total += counts[k];
      if (k >= u) ge += counts[k];
      if (k <= u) le += counts[k];
    }
    r.p_greater = ge / total;
    r.p_less = le / total;
    r.exact = true;
    return r;
  }
  // Normal approximation; the variance shrinks by the tie groups' t^3 - t.
  double tie_term = 0;
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j] == all[i]) ++j;
    const double t = static_cast<double>(j - i);
    tie_term += t * t * t - t;
    i = j;
  }
  const double N = static_cast<double>(m + n);
  const double var = mn / 12.0 * ((N + 1) - tie_term / (N * (N - 1)));
  if (var <= 0) return r;  // every value equal: no evidence either way
  const double sd = std::sqrt(var), mean = mn / 2;
  r.p_greater = normal_sf((r.u - mean - 0.5) / sd);
  r.p_less = normal_sf((mean - r.u - 0.5) / sd);
  return r;
}

}  // namespace ab
