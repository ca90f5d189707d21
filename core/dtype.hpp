// The number format of an attention call's inputs and matrix products: f32 throughout, or bf16
// inputs and products with float accumulation and a float softmax (`attnbench run --dtype`).
#pragma once
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "core/params.hpp"

namespace ab {

enum class Dtype { f32, bf16 };

inline const char* to_string(Dtype d) { return d == Dtype::bf16 ? "bf16" : "f32"; }

inline Dtype parse_dtype(const std::string& s) {
  if (s == "f32") return Dtype::f32;
  if (s == "bf16") return Dtype::bf16;
  throw InvalidInput(fmt::format("unknown --dtype '{}'; dtypes: f32, bf16", s));
}

// Whether this CPU multiplies bf16 (AVX512-BF16). ATTNBENCH_SIMULATE_NO_BF16=1 answers no, so
// that the refusal on other CPUs can be tested here.
inline bool cpu_has_bf16() {
  const char* simulate = std::getenv("ATTNBENCH_SIMULATE_NO_BF16");
  if (simulate && std::string(simulate) == "1") return false;
  return __builtin_cpu_supports("avx512bf16");
}

}  // namespace ab
