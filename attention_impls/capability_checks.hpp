// The capability checks of CAB (Comprehensive Attention Benchmark, Zhang et al. 2023), run on
// small seeded inputs by the tests and by `attnbench list`, so a claimed capability is a
// measured one:
//   causal prefix  a mechanism that claims causal masking gives, at every position i, the output
//                  it gives on the prefix [0, i]: the same instance (its random and learned tensors
//                  fixed) is run on inputs whose positions after i are redrawn, and positions 0..i
//                  must not move (to 1e-5 relative);
//   decode         a mechanism with a decode step, fed the sequence one token at a time after a
//                  prefill, gives the causal forward's outputs.
#pragma once
#include <string>

#include "core/params.hpp"

namespace ab {

struct CapabilityCheck {
  bool applies = false;  // the mechanism claims the capability
  bool passed = false;
  double worst = 0;      // the largest relative difference seen
  int64_t seq = 0;       // the length checked (the first of 256, 128, 64 the mechanism accepts: several blocks)
  std::string detail;    // what differed, or why it could not run
};

// `params`: the mechanism's, as `--param` spells them ("window=8"); empty: its defaults.
CapabilityCheck check_causal_prefix(const std::string& mechanism, const std::vector<std::string>& params = {},
                                    uint64_t seed = 17);
// The same measurement on the mechanism run without causal masking (a negative control: a
// bidirectional mechanism must fail it, which shows the check can fail).
CapabilityCheck check_prefix_without_mask(const std::string& mechanism, const std::vector<std::string>& params = {},
                                          uint64_t seed = 17);
CapabilityCheck check_decode(const std::string& mechanism, const std::vector<std::string>& params = {}, uint64_t seed = 17);

// The tolerance both checks hold a mechanism to (relative to the output's largest magnitude).
constexpr double kCapabilityTolerance = 1e-5;

}  // namespace ab
