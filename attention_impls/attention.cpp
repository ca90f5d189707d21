#include "attention_impls/attention.hpp"

#include <fmt/format.h>

namespace ab {

const char* to_string(Mode m) {
  switch (m) {
    case Mode::fwd: return "fwd";
    case Mode::fwdbwd: return "fwdbwd";
    case Mode::decode: return "decode";
  }
  return "?";
}

DumpTensor dump_tensor(const Attention& impl, const std::string& name) {
  for (const DumpTensor& t : impl.dump_tensors())
    if (t.name == name) return t;
  throw std::logic_error("the mechanism dumps no tensor " + name);
}

}  // namespace ab
