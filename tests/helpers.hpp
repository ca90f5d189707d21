// Shared test plumbing: run a mechanism on seeded inputs through the same runner code the CLI
// uses, and run the attnbench binary as a user would.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <tuple>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "attention_impls/registry.hpp"
#include "bench/process/process.hpp"
#include "bench/engine/runner.hpp"
#include "model/transformer.hpp"
#include "tasks/task.hpp"

namespace ab::test {

struct Run {
  std::unique_ptr<AttnData> data;
  std::unique_ptr<Attention> impl;
  size_t tracked_peak = 0;  // tracked bytes above the inputs, over setup and the calls
  size_t declared = 0;
};

// The problem as the caller sets it up (an encoding, RoPE inside the mechanism).
inline Run run_problem(const std::string& name, const AttnProblem& p, Mode mode,
                       const std::vector<std::string>& params = {}, uint64_t seed = 7) {
  Run r;
  omp_set_num_threads(p.threads);
  const auto& info = find_mechanism(name);
  const Shape4& s = p.shape;
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

inline Run run_mechanism(const std::string& name, const Shape4& s, bool causal, Mode mode,
                         const std::vector<std::string>& params = {}, uint64_t seed = 7,
                         int threads = 1, Dtype dtype = Dtype::f32) {
  AttnProblem p{s, causal, Strides3::contiguous(s), threads};
  p.dtype = dtype;
  return run_problem(name, p, mode, params, seed);
}

// Checks a finished fwdbwd run's dQ, dK, dV against central differences of the mechanism's own
// float32 forward (loss sum(dO * O)), every `step`-th element; `skip(tensor, i)` leaves out
// elements where a difference is not meaningful. Returns how many elements were compared.
inline int check_gradients_by_differences(
    Run& r, int64_t step, double tol_abs, double tol_rel, float eps = 1e-2f,
    const std::function<bool(const TensorView&, int64_t)>& skip = nullptr) {
  AttnArgs a = r.data->args();
  const int64_t n = a.q.shape.numel();
  const std::vector<float> dq(a.dq.data, a.dq.data + n), dk(a.dk.data, a.dk.data + n),
      dv(a.dv.data, a.dv.data + n);
  auto loss = [&]() {
    r.impl->forward(a);
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l += double(a.o.data[i]) * a.dout.data[i];
    return l;
  };
  int checked = 0;
  for (auto [t, grad, label] : {std::tuple{a.q, &dq, "dq"}, std::tuple{a.k, &dk, "dk"}, std::tuple{a.v, &dv, "dv"}}) {
    for (int64_t i = 0; i < n; i += step) {
      if (skip && skip(t, i)) continue;
      ++checked;
      const float saved = t.data[i];
      t.data[i] = saved + eps;
      const double lp = loss();
      t.data[i] = saved - eps;
      const double lm = loss();
      t.data[i] = saved;
      const double fd = (lp - lm) / (double(saved + eps) - double(saved - eps));
      const double an = (*grad)[static_cast<size_t>(i)];
      EXPECT_NEAR(fd, an, tol_abs + tol_rel * std::abs(an)) << label << " element " << i;
    }
  }
  return checked;
}

// A `skip` for check_gradients_by_differences: the elements of Q whose perturbation by +-eps
// changes a discrete state of the mechanism (`state()`: its buckets, its routing), where the
// output jumps and a difference means nothing; each one skipped is counted in *skipped.
inline std::function<bool(const TensorView&, int64_t)> skip_where_state_moves(Run& r, float eps,
                                                                             std::function<std::vector<int64_t>()> state,
                                                                             int* skipped) {
  const AttnArgs a = r.data->args();
  const std::vector<int64_t> before = state();
  return [&r, a, eps, state, before, skipped](const TensorView& t, int64_t i) {
    if (t.data != a.q.data) return false;
    const float saved = t.data[i];
    bool moved = false;
    for (float e : {eps, -eps}) {
      t.data[i] = saved + e;
      r.impl->forward(a);
      moved |= state() != before;
    }
    t.data[i] = saved;
    *skipped += moved;
    return moved;
  };
}

// A mechanism's dumped parameter by name (a test failure when it has none).
inline DumpTensor tensor(const Attention& impl, const std::string& name) {
  for (const auto& t : impl.dump_tensors())
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

// The mechanism's formula beside its kernel (MechanismInfo::reference) at these --param values,
// from the call's inputs and the mechanism's dumped state (the problem without a position bias).
inline std::vector<double> formula(const std::string& mech, const std::vector<std::string>& params,
                                   const Attention& impl, const AttnArgs& a, bool causal = false) {
  const MechanismInfo& info = find_mechanism(mech);
  if (!info.reference) throw std::logic_error(mech + " states no reference formula");
  return info.reference(impl, a, AttnProblem{a.q.shape, causal, a.q.strides, 1}, resolve_params(info, params));
}

// Central differences of the loss against the backward pass, on up to `per_slice` elements of
// every parameter slice (spread over the slice). Returns the number of elements checked.
// A task's model shrunk to test size: 2 layers, d_model 16, 2 heads, an MLP of 24.
inline ModelConfig tiny_model_config(const std::string& task, const std::string& mech, std::vector<std::string> params,
                                     int64_t seq, int64_t batch) {
  ModelConfig c = model_config_for_task(find_task(task), seq);
  c.layers = 2;
  c.dmodel = 16;
  c.heads = 2;
  c.mlp = 24;
  c.batch = batch;
  c.mechanism = mech;
  c.params = resolve_params(find_mechanism(mech), params);
  return c;
}

// Zoology's recall layout shrunk to test size: 2 layers of attention alone (no MLP), 2 heads of
// 8, batch 3, learned positions, causal; mqar at a vocabulary of 40.
inline ModelConfig recall_model_config(const std::string& task, int64_t N, const std::string& mech,
                                       std::vector<std::string> params = {}) {
  TaskOptions o;
  o.seq = N;
  o.vocab = task == "mqar" ? 40 : 0;
  ModelConfig c = model_config_for_task(find_task(task), o);
  c.layers = 2;
  c.dmodel = 16;
  c.heads = 2;
  c.mlp = 0;
  c.batch = 3;
  c.causal = true;
  c.mechanism = mech;
  c.params = resolve_params(find_mechanism(mech), params);
  c.positions = Positions::learned;
  return c;
}

inline int check_model_gradients(TransformerModel& m, const Batch& b, int per_slice, double tol_abs, double tol_rel) {
  m.step(b);  // fwdbwd: gradients of this batch's loss
  const int64_t n = m.parameter_count();
  std::vector<float> grad(m.gradients(), m.gradients() + n);
  const float eps = 1e-2f;
  int checked = 0;
  for (const auto& s : m.parameters()) {
    const int64_t stride = std::max<int64_t>(1, s.count / per_slice);
    for (int64_t i = s.offset + stride / 2; i < s.offset + s.count; i += stride) {
      float& w = m.weights()[i];
      const float saved = w;
      w = saved + eps;
      const double lp = m.loss(b);
      w = saved - eps;
      const double lm = m.loss(b);
      w = saved;
      const double fd = (lp - lm) / (2.0 * eps);
      const double an = grad[static_cast<size_t>(i)];
      EXPECT_NEAR(fd, an, tol_abs + tol_rel * std::abs(an)) << s.name << " element " << i - s.offset;
      ++checked;
    }
  }
  return checked;
}

struct Exec {
  int code = -1;
  std::string out;  // stdout, and stderr unless dropped
};

// `env` is prefixed to the command line, e.g. "ATTNBENCH_FAULT=crash:N:128".
inline Exec exec(const std::string& args, bool with_stderr = true, const std::string& env = "") {
  Exec e;
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(ATTNBENCH_EXE) + " " + args +
                          (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return e;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) e.out.append(buf.data(), n);
  const int st = pclose(p);
  e.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return e;
}

// This test process's own scratch folder, <$TMPDIR or /tmp>/attnbench-test-PID-XXXXXX, made at
// first use and removed with everything in it when the tests of the process end (ctest runs every
// test in a process of its own and points TMPDIR at the build's tests/tmp, which a last test
// checks is left empty).
inline const std::filesystem::path& test_dir() {
  struct RemoveAtEnd : ::testing::Environment {
    std::filesystem::path dir;
    void TearDown() override {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  };
  static const std::filesystem::path dir = [] {
    std::string pattern =
        (std::filesystem::path(scratch_root()) / ("attnbench-test-" + std::to_string(getpid()) + "-XXXXXX")).string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("cannot create the test's scratch folder " + pattern);
    auto* env = new RemoveAtEnd;
    env->dir = pattern;
    ::testing::AddGlobalTestEnvironment(env);
    return std::filesystem::path(pattern);
  }();
  return dir;
}

inline std::string temp_path(const std::string& name) { return (test_dir() / ("attnbench_" + name)).string(); }

// The lines of a command's output.
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The Frobenius norm of x (n floats), and of a - b: a low-precision result's error against its
// float32 twin is frobenius_diff(got, want) / frobenius(want) (relative, not max-abs).
inline double frobenius(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return std::sqrt(s);
}
inline double frobenius_diff(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

}  // namespace ab::test
