// The explicit registry: every mechanism is listed by hand in registry.cpp, in one place
// (no self-registering static objects, which the linker drops from static libraries).
#pragma once
#include <string>
#include <vector>

#include "attention_impls/attention.hpp"

namespace ab {

const std::vector<MechanismInfo>& mechanisms();
// Throws InvalidInput naming the known mechanisms when `name` is not one of them.
const MechanismInfo& find_mechanism(const std::string& name);
std::vector<std::string> mechanism_names();

// One entry per file in attention_impls/.
MechanismInfo vanilla_info();
MechanismInfo flash_info();
MechanismInfo linear_info();
MechanismInfo performer_info();
MechanismInfo local_info();
MechanismInfo sliding_info();
MechanismInfo dilated_info();
MechanismInfo strided_info();
MechanismInfo longformer_info();
MechanismInfo bigbird_info();
MechanismInfo linformer_info();
MechanismInfo memory_compressed_info();
MechanismInfo synthesizer_info();
MechanismInfo reformer_info();
MechanismInfo sinkhorn_info();

}  // namespace ab
