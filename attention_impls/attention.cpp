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

}  // namespace ab
