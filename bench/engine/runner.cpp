#include "bench/engine/runner.hpp"

#include <fmt/format.h>

#include <map>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <iostream>
#include <thread>
#include <fstream>
#include <filesystem>
#include <functional>
#include <limits>
#include <cstdlib>
#include <new>

#include <valgrind/callgrind.h>

#include "attention_impls/position_bias.hpp"
#include "core/matmul.hpp"
#include "core/rope.hpp"
#include "core/stop_signals.hpp"  // ContinueCounter: a repetition across a stop is measured again
#include "bench/points/configs.hpp"
#include "bench/points/grid.hpp"
#include "bench/results/warnings.hpp"
#include "core/sysinfo.hpp"
#include "tasks/task.hpp"

namespace ab {

AttnData::AttnData(const Shape4& s, uint64_t seed, bool with_grad)
    : q(s), k(s), v(s), o(s) {
  Rng(seed, kStreamQ).fill_normal(q.data(), s.numel());
  Rng(seed, kStreamK).fill_normal(k.data(), s.numel());
  Rng(seed, kStreamV).fill_normal(v.data(), s.numel());
  o.zero();
  if (with_grad) {
    dout = Tensor(s);
    dq = Tensor(s);
    dk = Tensor(s);
    dv = Tensor(s);
    Rng(seed, kStreamDout).fill_normal(dout.data(), s.numel());
    dq.zero();
    dk.zero();
    dv.zero();
  }
}

AttnArgs AttnData::args() const {
  return AttnArgs{q.view(), k.view(), v.view(), o.view(), dout.view(), dq.view(), dk.view(), dv.view()};
}

size_t AttnData::bytes() const {
  return (q.size() + k.size() + v.size() + o.size() + dout.size() + dq.size() + dk.size() + dv.size()) *
         sizeof(float);
}

double nmse(const float* out, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? num / den : num;
}

namespace {

// Shape of the input tensors: decode holds the N context tokens and the new one.
Shape4 input_shape(const PointId& id) {
  Shape4 s = id.shape;
  if (id.mode == RunMode::decode) s.N += 1;
  return s;
}

// The same point in float32: what a bf16 point's nmse_f32 compares against.
PointId in_f32(PointId id) {
  id.dtype = Dtype::f32;
  return id;
}

size_t io_bytes(const PointId& id) {
  const size_t t = static_cast<size_t>(input_shape(id).numel()) * sizeof(float);
  return (id.mode == RunMode::fwdbwd ? 8 : 4) * t;
}

}  // namespace

namespace {
void prepare_model_point(PreparedPoint& pp, const RunOptions& opts) {
  const PointId& id = pp.id;
  const ModelConfig c = model_config(id);
  const TaskInfo& info = find_task(id.task);
  if (!info.causal_optional && c.causal != info.next_token)
    throw InvalidInput(info.next_token
                           ? fmt::format("task {} is a causal language model: its model is always causal", id.task)
                           : fmt::format("task {} is a bidirectional classifier: --causal does not apply to its model", id.task));
  // The task must accept the length (image tasks have a fixed one) before anything runs; made
  // here once, so real data is read once.
  TaskOptions to = task_options(id);
  to.seed = opts.seed;
  pp.task = make_task(id.task, to);
  pp.model = std::make_unique<TransformerModel>(c, model_mode(id.mode));
  pp.flops = pp.model->flops();
  pp.working_bytes = pp.model->working_bytes();
  pp.predicted_bytes = pp.working_bytes;
}
// Why a point cannot run with its mechanism (SKIPPED, with the reason), or "": a capability
// it lacks (causal, backward, decode, bf16), or an encoding it does not admit (a grid of points
// skips it; a training run refuses it instead, exit 2, from the model).
std::string why_skipped(const PointId& id, const MechanismInfo& info) {
  const Capabilities& caps = info.caps;
  if (id.causal && !caps.causal) return id.mechanism + " cannot be causal";
  if (id.mode == RunMode::fwdbwd && !caps.backward) return id.mechanism + " has no backward pass";
  if (id.train.positions && !id.training()) {
    const PositionEncoding& pe = *id.train.positions;
    attention_positions(id);  // the attention level takes the additive ones and rope only (InvalidInput)
    const std::string why =
        pe.bias.active() && !caps.additive_bias ? caps.no_additive_bias
        : pe.kind == Positions::rope && !caps.rope ? caps.no_rope
        : pe.kind == Positions::rope && !caps.rope_feature_maps
            ? "RoPE rotates its queries and keys ahead of it (the model's work, --level model); the attention level times "
              "rope inside the mechanisms that rotate their own feature maps"
            : std::string();
    if (!why.empty()) return fmt::format("--positions {} with {}: {}", to_string(pe), id.mechanism, why);
  }
  if (id.mode == RunMode::decode && !caps.decode)
    return id.mechanism + " has no decode step (no key-value cache or recurrent state)";
  if (id.dtype == Dtype::bf16) {
    // The attention level runs a mechanism's own bf16 path, within its constraints; the model
    // level's inference needs that path, and its training steps run the linear layers in bf16
    // and the mechanism in whatever precision its backward has (the result's message says).
    const bool model_training = id.level == Level::model && id.mode != RunMode::fwd;
    if (!info.bf16.available && !model_training) return id.mechanism + " has no bf16 path";
    if (id.mode != RunMode::fwd && !model_training && !info.bf16.backward)
      return fmt::format("{} in bf16: {}", id.mechanism, info.bf16.constraints);
  }
  return "";
}

// What --error adds to an attention point's memory: flash's forward (f32) on the same inputs and
// its output (with RoPE, rotated copies of q and k and the angle table), and for a bf16 point the
// mechanism itself in float32, run after flash is freed.
size_t error_reference_bytes(const PointId& id, const AttnProblem& problem, const MechanismInfo& info) {
  if (id.mechanism == "flash" && id.dtype == Dtype::f32) return 0;
  PointId ref = id;
  ref.mechanism = "flash";
  ref.params = ParamValues();
  ref.shape = input_shape(id);
  auto f = find_mechanism("flash").make(attention_problem(ref), ref.params);
  const size_t copies = problem.rope ? 3 : 1;
  size_t bytes = f->working_bytes(Mode::fwd) + copies * static_cast<size_t>(ref.shape.numel()) * sizeof(float) +
                 (problem.rope ? static_cast<size_t>(ref.shape.N * ref.shape.D) * sizeof(float) : 0);
  if (id.dtype == Dtype::bf16) {
    const size_t own = info.make(attention_problem(in_f32(id)), id.params)->working_bytes(Mode::fwd);
    const size_t flash_bytes = f->working_bytes(Mode::fwd);
    if (own > flash_bytes) bytes += own - flash_bytes;
  }
  return bytes;
}
}  // namespace

PreparedPoint prepare_point(const PointId& id, const RunOptions& opts) {
  PreparedPoint pp;
  pp.id = id;
  pp.info = &find_mechanism(id.mechanism);
  const auto& s = id.shape;
  if (s.B <= 0 || s.H <= 0 || s.N <= 0 || s.D <= 0)
    throw InvalidInput(fmt::format("sizes must be positive: batch={} heads={} seq={} dhead={}", s.B,
                                   s.H, s.N, s.D));
  if (id.threads <= 0) throw InvalidInput(fmt::format("--threads must be positive, got {}", id.threads));
  // A mode the level does not have is bad input (these throw InvalidInput naming it).
  if (id.level == Level::model) model_mode(id.mode);
  else attention_mode(id.mode);
  pp.message = why_skipped(id, *pp.info);
  if (!pp.message.empty()) {
    pp.status = Status::SKIPPED;
    return pp;
  }
  omp_set_num_threads(id.threads);
  if (id.level == Level::model) {
    prepare_model_point(pp, opts);
    if (opts.mem_limit && pp.predicted_bytes > opts.mem_limit) {
      if (!opts.oom_as_status)
        throw InvalidInput(fmt::format("the {} model with {} at N={} needs {} (predicted), above --mem-limit {}", id.task,
                                       id.mechanism, s.N, format_gib(static_cast<double>(pp.predicted_bytes)), format_gib(static_cast<double>(opts.mem_limit))));
      pp.status = Status::OOM;
      pp.message = fmt::format("predicted {}, above --mem-limit {}", format_gib(static_cast<double>(pp.predicted_bytes)), format_gib(static_cast<double>(opts.mem_limit)));
      pp.model.reset();
      pp.task.reset();
    }
    return pp;
  }
  // Over the limit by its inputs and outputs alone: refused before the mechanism builds anything
  // (a sparse pattern's segments at N = 10^7 take minutes to lay out, only to be refused).
  auto over_limit = [&](size_t bytes) -> PreparedPoint {
    const std::string need = format_gib(static_cast<double>(bytes)), limit = format_gib(static_cast<double>(opts.mem_limit));
    if (!opts.oom_as_status)
      throw InvalidInput(fmt::format("{} at N={} needs {} (predicted), above --mem-limit {}", id.mechanism, s.N, need, limit));
    pp.status = Status::OOM;
    pp.message = fmt::format("predicted {}, above --mem-limit {}", need, limit);
    pp.predicted_bytes = bytes;
    pp.impl.reset();
    return std::move(pp);
  };
  if (opts.mem_limit && io_bytes(id) > opts.mem_limit) return over_limit(io_bytes(id));
  AttnProblem problem = attention_problem(id);
  problem.param_grads = opts.param_grads;
  pp.impl = pp.info->make(problem, id.params);
  pp.impl->validate();
  const Mode mode = attention_mode(id.mode);
  pp.flops = pp.impl->flops(mode);
  if (mode != Mode::decode) pp.admissible_fraction = pp.impl->admissible_fraction();
  pp.working_bytes = pp.impl->working_bytes(mode);
  pp.predicted_bytes = pp.working_bytes + io_bytes(id);
  if (opts.error) pp.predicted_bytes += error_reference_bytes(id, problem, *pp.info);
  if (opts.mem_limit && pp.predicted_bytes > opts.mem_limit) return over_limit(pp.predicted_bytes);
  return pp;
}

namespace {
bool all_finite(const Tensor& t) {
  const float* p = t.data();
  for (size_t i = 0; i < t.size(); ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

bool all_finite_view(const TensorView& t) {
  for (int64_t b = 0; b < t.shape.B; ++b)
    for (int64_t h = 0; h < t.shape.H; ++h)
      for (int64_t n = 0; n < t.shape.N; ++n)
        for (int64_t d = 0; d < t.shape.D; ++d)
          if (!std::isfinite(t.at(b, h, n, d))) return false;
  return true;
}

// `n` calls in a row, their losses summed. Not inlined: the calls of calibration and timing then
// leave the inlining of the one call counted under callgrind as it was (inlining them beside it
// changed strided's counted instructions by 1%, with no change to its code).
template <class Call>
[[gnu::noinline]] double run_calls(Call& call, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += call();
  return sum;
}

// The timing protocol of every point (benchdnn: validate, then time). `call()` runs one call and
// returns its loss (NaN for an attention call, which has none); `check(loss)` judges the last
// warm-up call's result and names what is wrong ("" when fine). Under callgrind one more call is
// counted and nothing is timed. Otherwise `opts.reps` repetitions of enough iterations to fill
// --min-time, each kept with its wall and process CPU time and its mean loss, and the RSS
// high-water mark over them. Returns false when the check failed (res says why).
template <class Call, class Check>
bool measure_calls(Call&& call, Check&& check, const RunOptions& opts, size_t rss_before, PointResult& res,
                   const std::function<void()>& before_timed_reps = nullptr) {
  double t_call = 0, loss = 0;
  for (int w = 0; w < std::max(1, opts.warmup); ++w) {
    const double t0 = wall_seconds();
    loss = call();
    t_call = wall_seconds() - t0;
  }
  if (const std::string why = check(loss); !why.empty()) {
    res.status = Status::FAILED;
    res.message = why;
    return false;
  }
  if (opts.callgrind_child) {
    // Run under `valgrind --tool=callgrind --collect-atstart=no` by `--instructions`:
    // the count covers exactly one measured call, after the warm-up.
    CALLGRIND_TOGGLE_COLLECT;
    call();
    CALLGRIND_TOGGLE_COLLECT;
    res.reps.push_back({t_call, t_call, 1, std::nullopt});
    return true;
  }
  int64_t iterations =
      t_call > 0 ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(opts.min_time / t_call))) : 1;
  // The warm-up call is often far slower than the steady state (cold caches, first-touch pages:
  // 38 ms against 0.15 ms for a small local point), so the count it suggests is checked: untimed
  // rounds grow it, at most 10x a round, until one round lasts --min-time, as Google Benchmark
  // does. A repetition is then never shorter than --min-time asked for.
  for (int round = 0; opts.min_time > 0 && round < 8; ++round) {
    const double w0 = wall_seconds();
    run_calls(call, iterations);
    const double took = wall_seconds() - w0;
    if (took >= opts.min_time) break;
    const double grow = std::min(10.0, 1.2 * opts.min_time / std::max(took, 1e-9));
    iterations = static_cast<int64_t>(std::ceil(static_cast<double>(iterations) * std::max(grow, 1.1)));
  }
  const bool rss_reset = reset_peak_rss();
  // A repetition the process was stopped and continued in (SIGSTOP, Ctrl-Z) holds the pause in
  // its wall time: the timed repetitions start over (the model's layer timers with them), at most
  // twice; a pause after that is kept and the message says so.
  constexpr int kMaxRestarts = 2;
  const ContinueCounter counting_stops;
  int restarts = 0;
  bool paused_rep_kept = false;
  if (before_timed_reps) before_timed_reps();
  for (int r = 0; r < opts.reps; ++r) {
    const uint64_t stops = continued_count();
    const double w0 = wall_seconds(), c0 = process_cpu_seconds();
    const double loss_sum = run_calls(call, iterations);
    const double w1 = wall_seconds(), c1 = process_cpu_seconds();
    if (continued_count() != stops) {
      if (restarts < kMaxRestarts) {
        ++restarts;
        res.reps.clear();
        if (before_timed_reps) before_timed_reps();
        r = -1;
        continue;
      }
      paused_rep_kept = true;
    }
    const double n = static_cast<double>(iterations);
    res.reps.push_back({(w1 - w0) / n, (c1 - c0) / n, iterations,
                        std::isnan(loss_sum) ? std::nullopt : std::optional<double>(loss_sum / n)});
  }
  if (restarts > 0)
    res.add_note(fmt::format("the process was stopped and continued (SIGSTOP/SIGCONT) during a timed repetition; "
                             "the repetitions started over {} time{}{}",
                             restarts, restarts == 1 ? "" : "s", paused_rep_kept ? ", and a repetition kept holds a pause" : ""));
  res.peak_rss_bytes = peak_rss_bytes();
  res.rss_delta_bytes = static_cast<int64_t>(res.peak_rss_bytes) - static_cast<int64_t>(rss_before);
  if (!rss_reset) res.add_note("peak RSS covers the process lifetime (clear_refs not permitted)");
  return true;
}

// A model point: batches generated first (untimed, untracked), then setup and the steps, cycling
// through the batches.
PointResult run_model_point(PreparedPoint& pp, const RunOptions& opts, PointResult res) {
  const PointId& id = pp.id;
  TransformerModel& model = *pp.model;
  omp_set_num_threads(id.threads);
  const size_t rss_before = current_rss_bytes();
  std::vector<Batch> batches;
  for (int64_t i = 0; i < kModelBatches; ++i) batches.push_back(pp.task->batch(i * id.shape.B, id.shape.B));

  const size_t baseline = MemoryMeter::current();
  MemoryMeter::reset_peak();
  model.setup(opts.seed);
  size_t next = 0;
  auto call = [&]() { return model.step(batches[next++ % batches.size()]); };
  auto check = [](double loss) { return std::isfinite(loss) ? std::string() : std::string("non-finite loss"); };
  // The model's timers cover the timed repetitions only: they restart after the warm-up and the
  // untimed rounds that size a repetition to --min-time (counting those inflated the per-layer
  // figures by (reps + 1) / reps against the divisor below).
  if (!measure_calls(call, check, opts, rss_before, res, [&] { model.reset_timers(); }) || opts.callgrind_child) return res;
  double calls = 0;
  for (const auto& r : res.reps) calls += static_cast<double>(r.iterations);
  for (double s : model.layer_seconds()) res.layer_ms.push_back(s / calls * 1e3);
  res.peak_bytes = MemoryMeter::peak() - baseline;
  if (const std::string p = model.precision(); !p.empty()) res.add_note(p);
  return res;
}

// flash's forward in float32 on the point's inputs (causal over all N + 1 tokens for decode),
// under the point's --positions: the reference an attention point's nmse is taken against.
// The inputs are a function of the shape and the seed, and so is this output: it is cached
// under --reference-dir (a sweep's points share it).
Tensor flash_reference(const PointId& id, const AttnArgs& args, const RunOptions& opts) {
  const bool decode = id.mode == RunMode::decode;
  const Shape4 s = input_shape(id);
  AttnProblem p{s, id.causal || decode, Strides3::contiguous(s), id.threads};
  const AttentionPositions ap = attention_positions(id);
  p.bias = ap.bias;
  Tensor o_ref(s);
  const std::string cached =
      opts.reference_dir.empty()
          ? ""
          : (std::filesystem::path(opts.reference_dir) /
             fmt::format("flash-B{}-H{}-N{}-D{}-causal{}{}{}-seed{}.f32", s.B, s.H, s.N, s.D, p.causal ? 1 : 0,
                         p.bias.active() ? "-" + to_string(p.bias) : std::string(), ap.rope ? "-rope" : "", opts.seed))
                .string();
  const size_t bytes = static_cast<size_t>(o_ref.size()) * sizeof(float);
  std::ifstream in;
  if (!cached.empty() && !decode) in.open(cached, std::ios::binary);
  if (in && in.read(reinterpret_cast<char*>(o_ref.data()), static_cast<std::streamsize>(bytes)) &&
      in.gcount() == static_cast<std::streamsize>(bytes))
    return o_ref;
  auto ref = find_mechanism("flash").make(p, ParamValues());
  Rng unused(opts.seed, kStreamParams);
  ref->setup(Mode::fwd, unused);
  AttnArgs ra = args;
  ra.o = o_ref.view();
  // RoPE: exact attention under the same encoding, the softmax of q and k rotated by their
  // positions (core/rope.hpp).
  Tensor q_rot, k_rot;
  std::vector<float> table;
  if (ap.rope) {
    table.resize(static_cast<size_t>(s.N * s.D));
    rope_table(s.N, s.D, table.data());
    q_rot = Tensor(s);
    k_rot = Tensor(s);
    std::copy_n(args.q.data, s.numel(), q_rot.data());
    std::copy_n(args.k.data, s.numel(), k_rot.data());
    rope_rotate(q_rot.data(), s.B, s.H, s.N, s.D, table.data(), false);
    rope_rotate(k_rot.data(), s.B, s.H, s.N, s.D, table.data(), false);
    ra.q = q_rot.view();
    ra.k = k_rot.view();
  }
  ref->forward(ra);
  if (!cached.empty() && !decode) {
    // Written whole under a temporary name, then renamed: a reader never sees half a file.
    std::error_code ec;
    std::filesystem::create_directories(opts.reference_dir, ec);
    const std::string tmp = cached + fmt::format(".tmp{}", getpid());
    std::ofstream out(tmp, std::ios::binary);
    out.write(reinterpret_cast<const char*>(o_ref.data()), static_cast<std::streamsize>(bytes));
    out.close();
    if (out) std::filesystem::rename(tmp, cached, ec);
    else std::filesystem::remove(tmp, ec);
  }
  return o_ref;
}

// --error: the output's normalised squared error against flash in float32 (decode: the new
// token's row), and for a bf16 point also against the same mechanism in float32 (what bf16
// costs). After the timed calls, on their inputs; the mechanism's output is still in data.o.
void measure_error(PreparedPoint& pp, const RunOptions& opts, const AttnData& data, const AttnArgs& args,
                   const AttnArgs& token, PointResult& res) {
  const PointId& id = pp.id;
  if (id.mechanism == "flash" && id.dtype == Dtype::f32) {
    res.nmse = 0.0;
    return;
  }
  Tensor o_ref = flash_reference(id, args, opts);
  if (id.mode == RunMode::decode) {
    const Shape4 s = input_shape(id);
    const TensorView got = token.o, want = o_ref.view().token(id.shape.N);
    Tensor a(got.shape), b(got.shape);
    for (int64_t bb = 0; bb < s.B; ++bb)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t d = 0; d < s.D; ++d) {
          a.view().at(bb, h, 0, d) = got.at(bb, h, 0, d);
          b.view().at(bb, h, 0, d) = want.at(bb, h, 0, d);
        }
    res.nmse = nmse(a.data(), b.data(), a.size());
  } else {
    // fwdbwd has run backward since; the forward output in data.o is unchanged by it.
    res.nmse = nmse(data.o.data(), o_ref.data(), o_ref.size());
  }
  if (id.dtype == Dtype::bf16) {
    // The mechanism in float32 with the timed run's seed (so the same random and learned
    // tensors) on the same inputs, into o_ref (flash's output is no longer needed).
    auto same = pp.info->make(attention_problem(in_f32(id)), id.params);
    Rng params(opts.seed, kStreamParams);
    same->setup(Mode::fwd, params);
    AttnArgs fa = args;
    fa.o = o_ref.view();
    same->forward(fa);
    res.nmse_f32 = nmse(data.o.data(), o_ref.data(), o_ref.size());
  }
}

PointResult run_point_impl(PreparedPoint& pp, const RunOptions& opts, PointResult res) {
  const PointId& id = pp.id;
  if (pp.model) return run_model_point(pp, opts, res);
  const bool bwd = id.mode == RunMode::fwdbwd;
  omp_set_num_threads(id.threads);
  const size_t rss_before = current_rss_bytes();

  const bool decode = id.mode == RunMode::decode;
  AttnData data(input_shape(id), opts.seed, bwd);
  const AttnArgs args = data.args();
  const int64_t pos = id.shape.N;  // decode: the new token follows N context tokens
  const AttnArgs token = args.token(pos);
  // Working memory is what the mechanism holds beyond its inputs and outputs.
  const size_t baseline = MemoryMeter::current();
  MemoryMeter::reset_peak();
  Rng rng(opts.seed, kStreamParams);
  pp.impl->setup(attention_mode(id.mode), rng);
  if (decode) pp.impl->decode_prefill(args, pos);
  auto call = [&]() {
    if (decode) pp.impl->decode_step(token, pos);
    else {
      pp.impl->forward(args);
      if (bwd) pp.impl->backward(args);
    }
    return std::numeric_limits<double>::quiet_NaN();  // an attention call has no loss
  };
  auto check = [&](double) {
    const bool finite = decode ? all_finite_view(token.o)
                               : all_finite(data.o) && (!bwd || (all_finite(data.dq) && all_finite(data.dk) && all_finite(data.dv)));
    return finite ? std::string() : std::string("non-finite values in the output");
  };
  if (!measure_calls(call, check, opts, rss_before, res) || opts.callgrind_child) return res;
  res.peak_bytes = MemoryMeter::peak() - baseline;
  if (opts.error) measure_error(pp, opts, data, args, token, res);
  return res;
}
}  // namespace

PointResult run_point(PreparedPoint& pp, const RunOptions& opts, const std::string& label,
                      double gemm_gflops) {
  PointResult res;
  res.id = pp.id;
  res.label = label;
  res.gemm_gflops = gemm_gflops;
  res.flops = pp.flops;
  res.admissible_fraction = pp.admissible_fraction;
  if (pp.status != Status::OK) {
    res.status = pp.status;
    res.message = pp.message;
    return res;
  }
  try {
    res = run_point_impl(pp, opts, res);
  } catch (const std::bad_alloc&) {
    res.status = Status::OOM;
    res.message = "allocation failed";
    res.reps.clear();
  } catch (const std::exception& e) {
    res.status = Status::FAILED;
    res.message = e.what();
    res.reps.clear();
  }
  pp.impl.reset();  // free the working memory before the next point
  pp.model.reset();
  pp.task.reset();
  return res;
}

void merge_round(PointResult& into, PointResult next, int round) {
  if (into.status != Status::OK) return;
  if (next.status != Status::OK) {
    into.status = next.status;
    into.message = fmt::format("round {}: {}", round + 1, next.message);
    into.reps.clear();
    return;
  }
  auto calls = [](const PointResult& r) {
    double c = 0;
    for (const auto& rep : r.reps) c += static_cast<double>(rep.iterations);
    return c;
  };
  const double a = calls(into), b = calls(next);
  if (into.layer_ms.size() == next.layer_ms.size() && a + b > 0)
    for (size_t k = 0; k < into.layer_ms.size(); ++k)
      into.layer_ms[k] = (into.layer_ms[k] * a + next.layer_ms[k] * b) / (a + b);
  into.reps.insert(into.reps.end(), next.reps.begin(), next.reps.end());
  into.peak_bytes = std::max(into.peak_bytes, next.peak_bytes);
  into.peak_rss_bytes = std::max(into.peak_rss_bytes, next.peak_rss_bytes);
  into.rss_delta_bytes = std::max(into.rss_delta_bytes, next.rss_delta_bytes);
  if (into.message.empty()) into.message = next.message;
}

// The compiler that built this binary, from its own macros.
std::string compiler_name() {
#if defined(__clang__)
  return fmt::format("clang++ {}", __clang_version__);
#elif defined(__GNUC__)
  return fmt::format("g++ {}", __VERSION__);
#else
  return "unknown";
#endif
}

namespace {
std::map<std::string, std::string>& user_context() {
  static std::map<std::string, std::string> pairs;
  return pairs;
}
}  // namespace

void set_user_context(const std::vector<std::string>& pairs) {
  std::map<std::string, std::string> given;
  for (const auto& p : pairs) {
    const auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) throw InvalidInput(fmt::format("--context '{}' is not KEY=VALUE", p));
    given[p.substr(0, eq)] = p.substr(eq + 1);
  }
  user_context().clear();
  // Keys attnbench writes: those of a context, and those added later by sweeps and merges.
  nlohmann::json ours = run_context("", 0, 1, 0);
  for (const char* k : {"warnings", "gemm_other_runnable", "resumed_by", "shard", "merged_from", "cpu_scaling_enabled"})
    ours[k] = nullptr;
  for (const auto& [k, v] : given)
    if (ours.contains(k)) throw InvalidInput(fmt::format("--context {}: attnbench writes that key itself; choose another name", k));
  user_context() = std::move(given);
}

double GemmReference::per_thread(int threads) const {
  const auto it = on_threads.find(threads);
  return it == on_threads.end() ? one_thread : it->second / threads;
}

void GemmReference::record(nlohmann::json& context) const {
  context["gemm_gflops_per_s_1thread"] = one_thread;
  if (!on_threads.empty()) {
    nlohmann::json rates = nlohmann::json::object();
    for (const auto& [t, rate] : on_threads) rates[std::to_string(t)] = rate;
    context["gemm_gflops_per_s_on_threads"] = rates;
  }
  if (other_runnable >= 0) context["gemm_other_runnable"] = other_runnable;
}

GemmReference gemm_reference(double given, const std::set<int>& threads) {
  GemmReference g;
  if (given > 0) {
    g.one_thread = given;
    return g;
  }
  g.other_runnable = other_runnable_tasks();
  g.one_thread = measure_gemm_gflops(1);
  for (int t : threads)
    if (t > 1) g.on_threads[t] = measure_gemm_gflops(t);
  return g;
}

nlohmann::json run_context(const std::string& command, uint64_t seed, int threads, double gemm_gflops) {
  MachineInfo m = machine_info();
  nlohmann::json caches = nlohmann::json::array();
  for (const auto& c : m.caches)
    caches.push_back({{"type", c.type}, {"level", c.level}, {"size", c.size}, {"num_sharing", c.num_sharing}});
  auto env = [](const char* k) { const char* v = std::getenv(k); return std::string(v ? v : ""); };
  nlohmann::json omp = {{"max_threads", threads},
                        {"OMP_NUM_THREADS", env("OMP_NUM_THREADS")},
                        {"OMP_PROC_BIND", env("OMP_PROC_BIND")},
                        {"OMP_PLACES", env("OMP_PLACES")},
                        {"dynamic", omp_get_dynamic() != 0}};
  nlohmann::json ctx = {
      {"json_schema_version", kResultSchemaVersion},
      {"date", m.date},
      {"host_name", m.host_name},
      {"executable", "attnbench"},
      {"num_cpus", m.num_cpus},
      {"mhz_per_cpu", static_cast<int>(m.mhz_per_cpu)},
      {"caches", caches},
      {"load_avg", m.load_avg},
      {"library_build_type", std::string(ATTNBENCH_BUILD_TYPE) == "Debug" ? "debug" : "release"},
      {"attnbench_version", ATTNBENCH_VERSION},
      {"git_commit", build_git_commit()},
      {"compiler", compiler_name()},
      {"flags", ATTNBENCH_FLAGS},
      {"build_type", ATTNBENCH_BUILD_TYPE},
      {"onednn_version", onednn_version()},
      {"threads", threads},
      {"openmp", omp},
      {"command", command},
      {"seed", seed},
      {"cpu_model", m.cpu_model},
      {"cpu_isa", m.cpu_isa},
      {"machine_id", m.machine_id},
      {"physical_memory_bytes", m.physical_memory},
      {"gemm_gflops_per_s_1thread", gemm_gflops},
      {"gemm_reference", "oneDNN f32 matmul 1024x1024x1024, best of 5 after a warm-up, on one thread (and on each "
                         "other thread count of the run's points: gemm_gflops_per_s_on_threads)"},
      {"cpu_family", m.cpu_family},
      {"cpu_model_number", m.cpu_model_number},
      {"cpu_stepping", m.cpu_stepping},
      {"kernel", m.kernel},
  };
  // Google Benchmark writes the field only where the governor is known.
  if (m.cpu_scaling_enabled) ctx["cpu_scaling_enabled"] = *m.cpu_scaling_enabled;
  for (const auto& [k, v] : user_context()) ctx[k] = v;
  return ctx;
}

void inject_fault(const PointId& id) {
  const char* env = std::getenv("ATTNBENCH_FAULT");
  if (!env) return;
  const std::string spec = env;
  const auto colon = spec.find(':');
  if (colon == std::string::npos || id.name().find(spec.substr(colon + 1)) == std::string::npos) return;
  const std::string kind = spec.substr(0, colon);
  std::cerr << "ATTNBENCH_FAULT: " << kind << " on " << id.name() << "\n" << std::flush;
  if (kind == "crash") std::raise(SIGSEGV);
  if (kind == "kill") std::raise(SIGKILL);
  if (kind == "exit") std::_Exit(3);
  if (kind == "hang")
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

std::vector<std::string> point_args(const PointId& id, const RunOptions& o) {
  // A training run is reproduced by `train` with its recipe (all identity fields); the timing
  // protocol's options do not apply.
  std::vector<std::string> a = {id.training() ? "train" : "run"};
  for (auto& x : point_identity_args(id)) a.push_back(std::move(x));
  auto add = [&](const char* flag, const std::string& value) {
    a.push_back(flag);
    a.push_back(value);
  };
  if (id.training()) return a;
  add("--seed", std::to_string(o.seed));
  add("--reps", std::to_string(o.reps));
  if (o.rounds > 1) add("--rounds", std::to_string(o.rounds));
  add("--min-time", fmt::format("{:g}", o.min_time));
  add("--warmup", std::to_string(o.warmup));
  if (o.error) a.push_back("--error");
  if (o.count_instructions) a.push_back("--instructions");
  return a;
}

std::string shell_quote(const std::string& arg) {
  static const std::string plain = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,+@%";
  if (!arg.empty() && arg.find_first_not_of(plain) == std::string::npos) return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string point_label(const PointId& id, const RunOptions& o) {
  // Every argument quoted where a shell would split or expand it: the label re-runs through sh -c.
  std::string s = "attnbench";
  for (const auto& a : point_args(id, o)) s += " " + shell_quote(a);
  return s;
}

}  // namespace ab
