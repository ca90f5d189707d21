// The one list of mechanisms is the registry: every registered mechanism must have a NumPy check
// in tests/check_dump.py, a test family here, and a section in docs/mechanisms.md, so a gap is
// found by the build and not by a reader.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "attention_impls/registry.hpp"
#include "tests/helpers.hpp"
#include "tests/reference.hpp"

namespace ab {
namespace {

std::string squeezed(const std::string& s) {  // lower case, no underscores: MemoryCompressed ~ memory_compressed
  std::string o;
  for (char c : s)
    if (c != '_') o += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

TEST(Registry, EveryMechanismHasANumPyCheck) {
  FILE* p = popen("/usr/bin/python3 " ATTNBENCH_SOURCE_DIR "/tests/check_dump.py --covered", "r");
  ASSERT_NE(p, nullptr);
  std::set<std::string> covered;
  char line[256];
  while (fgets(line, sizeof line, p)) {
    std::string s = line;
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    if (!s.empty()) covered.insert(s);
  }
  ASSERT_EQ(pclose(p), 0);
  for (const auto& m : mechanism_names()) EXPECT_TRUE(covered.count(m)) << m << " has no case in tests/check_dump.py";
  for (const auto& c : covered) EXPECT_NO_THROW(find_mechanism(c)) << "check_dump.py checks an unregistered " << c;
}

// A family: a test suite named after the mechanism (Reformer, MemoryCompressed), or a
// parametrised test whose parameter names it ("local N=...", ("vanilla", ...)).
TEST(Registry, EveryMechanismHasATestFamily) {
  const auto& unit = *::testing::UnitTest::GetInstance();
  for (const auto& m : mechanism_names()) {
    bool found = false;
    for (int i = 0; i < unit.total_test_suite_count() && !found; ++i) {
      const auto* suite = unit.GetTestSuite(i);
      std::string name = suite->name();
      name = name.substr(name.find('/') + 1);
      found = squeezed(name) == squeezed(m);
      for (int j = 0; j < suite->total_test_count() && !found; ++j) {
        const char* param = suite->GetTestInfo(j)->value_param();
        const std::string v = param ? param : "";
        found = v.rfind(m + " ", 0) == 0 || v.find("\"" + m + "\"") != std::string::npos;
      }
    }
    EXPECT_TRUE(found) << m << " has no test family (a suite named after it, or a parametrised test naming it)";
  }
}

// An exact mechanism states, beside its kernel, which pairs it computes (reference_mask): the
// formula the tests hold its kernel to. BigBird's pairs are a draw per head (its test reads them
// from the dump); a mechanism that is not exact has no such mask. At the defaults and N 64 every
// query has a key, and causal masks never admit a later key.
TEST(Registry, EveryExactMechanismStatesItsPairsBesideItsKernel) {
  size_t stated = 0;
  for (const auto& m : mechanism_names()) {
    const MechanismInfo& info = find_mechanism(m);
    if (!info.caps.exact || m == "bigbird") {
      EXPECT_FALSE(info.reference_mask) << m;
      continue;
    }
    ASSERT_TRUE(info.reference_mask) << m << " is exact but states no reference_mask";
    ++stated;
    const ParamValues v = resolve_params(info, {});
    for (bool causal : {false, true}) {
      const ref::Mask allowed = info.reference_mask(v, 64, causal);
      for (int64_t i = 0; i < 64; ++i) {
        bool any = false;
        for (int64_t j = 0; j < 64; ++j) {
          any = any || allowed(i, j);
          if (causal && j > i) EXPECT_FALSE(allowed(i, j)) << m << " admits a later key: " << i << ", " << j;
        }
        EXPECT_TRUE(any) << m << ": query " << i << " has no key";
      }
    }
  }
  EXPECT_EQ(stated, 8u);
}

// Every other mechanism states its formula beside its kernel (reference), and every mechanism
// states exactly one of the two. At a small problem where each is defined (bigbird, sinkhorn and
// reformer need N a multiple of their block), causal where it can be, its kernel equals that
// formula from its own dumped state; approximate mechanisms compute in float what the formula
// computes in double, so within float rounding (performer's exponentials: 1e-4).
TEST(Registry, EveryOtherMechanismStatesItsFormulaBesideItsKernel) {
  size_t stated = 0;
  for (const auto& m : mechanism_names()) {
    const MechanismInfo& info = find_mechanism(m);
    EXPECT_NE(bool(info.reference_mask), bool(info.reference)) << m << " must state exactly one formula";
    if (!info.reference) continue;
    ++stated;
    std::vector<std::string> params;
    for (const char* p : {"block=16", "bucket_size=16", "features=32", "k=24", "kernel=7"}) {
      for (const auto& spec : info.params) {
        if (std::string(p).rfind(spec.name + "=", 0) == 0) params.push_back(p);
      }
    }
    for (bool causal : {false, true}) {
      if (causal && !info.caps.causal) continue;
      auto r = test::run_mechanism(m, Shape4{2, 2, 64, 16}, causal, Mode::fwd, params, 5);
      const double err = ref::rel_err(r.data->o.data(), test::formula(m, params, *r.impl, r.data->args(), causal));
      EXPECT_LT(err, m == "performer" ? 1e-4 : 2e-5) << m << (causal ? " causal" : "");
    }
  }
  EXPECT_EQ(stated, 11u);
}

TEST(Registry, EveryMechanismHasASectionInTheDocs) {
  std::ifstream in(ATTNBENCH_SOURCE_DIR "/docs/mechanisms.md");
  ASSERT_TRUE(in) << "docs/mechanisms.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  for (const auto& m : mechanism_names())
    EXPECT_NE(doc.find("\n## `" + m + "`\n"), std::string::npos) << m << " has no section in docs/mechanisms.md";
}

}  // namespace
}  // namespace ab
