#include "attention_impls/registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ab {

// Each defined in its own attention_impls/NAME.cpp.
MechanismInfo vanilla_info();
MechanismInfo flash_info();
MechanismInfo linear_info();
MechanismInfo performer_info();
MechanismInfo local_info();
MechanismInfo sliding_info();
MechanismInfo dilated_info();
MechanismInfo strided_info();
MechanismInfo longformer_info();
MechanismInfo etc_info();
MechanismInfo bigbird_info();
MechanismInfo linformer_info();
MechanismInfo memory_compressed_info();
MechanismInfo synthesizer_info();
MechanismInfo reformer_info();
MechanismInfo routing_info();
MechanismInfo sinkhorn_info();
MechanismInfo lightconv_info();
MechanismInfo dynamicconv_info();

const std::vector<MechanismInfo>& mechanisms() {
  static const std::vector<MechanismInfo> all = {
      vanilla_info(),
      flash_info(),
      local_info(),
      sliding_info(),
      dilated_info(),
      strided_info(),
      longformer_info(),
      etc_info(),
      bigbird_info(),
      linformer_info(),
      memory_compressed_info(),
      synthesizer_info(),
      reformer_info(),
      routing_info(),
      sinkhorn_info(),
      linear_info(),
      performer_info(),
      lightconv_info(),
      dynamicconv_info(),
  };
  return all;
}

std::vector<std::string> mechanism_names() {
  std::vector<std::string> names;
  for (const auto& m : mechanisms()) names.push_back(m.name);
  return names;
}

const MechanismInfo& find_mechanism(const std::string& name) {
  for (const auto& m : mechanisms())
    if (m.name == name) return m;
  throw unknown_name("mechanism", name, mechanism_names());
}

}  // namespace ab
