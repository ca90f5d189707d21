// Shared test plumbing: run a mechanism on seeded inputs through the same runner code the CLI
// uses, and run the attnbench binary as a user would.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>

#include "attention_impls/registry.hpp"
#include "bench/runner.hpp"

namespace ab::test {

struct Run {
  std::unique_ptr<AttnData> data;
  std::unique_ptr<Attention> impl;
  size_t tracked_peak = 0;  // tracked bytes above the inputs, over setup and the calls
  size_t declared = 0;
};

inline Run run_mechanism(const std::string& name, const Shape4& s, bool causal, Mode mode,
                         const std::vector<std::string>& params = {}, uint64_t seed = 7,
                         int threads = 1) {
  Run r;
  omp_set_num_threads(threads);
  const auto& info = find_mechanism(name);
  AttnProblem p{s, causal, Strides3::contiguous(s), threads};
  r.impl = info.make(p, resolve_params(info, params));
  r.impl->validate();
  r.declared = r.impl->working_bytes(mode);
  r.data = std::make_unique<AttnData>(s, seed, mode == Mode::fwdbwd);
  const size_t base = MemoryMeter::current();
  MemoryMeter::reset_peak();
  Rng rng(seed, kStreamParams);
  r.impl->setup(mode, rng);
  r.impl->forward(r.data->args());
  if (mode == Mode::fwdbwd) r.impl->backward(r.data->args());
  r.tracked_peak = MemoryMeter::peak() - base;
  return r;
}

struct Exec {
  int code = -1;
  std::string out;  // stdout, and stderr unless dropped
};

inline Exec exec(const std::string& args, bool with_stderr = true) {
  Exec e;
  const std::string cmd =
      std::string(ATTNBENCH_EXE) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return e;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) e.out.append(buf.data(), n);
  const int st = pclose(p);
  e.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return e;
}

inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "attnbench_" + std::to_string(getpid()) + "_" + name;
}

}  // namespace ab::test
