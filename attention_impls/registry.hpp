// The explicit registry: every mechanism is listed by hand in registry.cpp, in one place (no
// self-registering static objects, which the linker drops from static libraries). It is the one
// list of mechanisms: `--attn all`, `list`, docs/mechanisms.md and the consistency tests
// (tests/test_registry.cpp) all read it. Adding a mechanism: attention_impls/NAME.cpp (found by
// the build) and its two lines in registry.cpp.
#pragma once
#include <string>
#include <vector>

#include "attention_impls/attention.hpp"

namespace ab {

const std::vector<MechanismInfo>& mechanisms();
// Throws InvalidInput naming the known mechanisms when `name` is not one of them.
const MechanismInfo& find_mechanism(const std::string& name);
std::vector<std::string> mechanism_names();

}  // namespace ab
