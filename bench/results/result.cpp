#include "bench/results/result.hpp"

#include "model/transformer.hpp"  // layer_type_names

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ab {

const char* to_string(Status s) {
  switch (s) {
    case Status::OK: return "OK";
    case Status::SKIPPED: return "SKIPPED";
    case Status::OOM: return "OOM";
    case Status::TIMEOUT: return "TIMEOUT";
    case Status::CRASHED: return "CRASHED";
    case Status::FAILED: return "FAILED";
  }
  return "?";
}

namespace {
TimeStats stats_of(std::vector<double> v) {
  TimeStats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(n);
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.stddev = n > 1 ? std::sqrt(ss / static_cast<double>(n - 1)) : 0.0;
  s.min = v.front();
  s.max = v.back();
  return s;
}
}  // namespace

TimeStats real_stats(const PointResult& r) {
  std::vector<double> v;
  for (const auto& rep : r.reps) v.push_back(rep.real_s);
  return stats_of(v);
}
TimeStats cpu_stats(const PointResult& r) {
  std::vector<double> v;
  for (const auto& rep : r.reps) v.push_back(rep.cpu_s);
  return stats_of(v);
}

const std::vector<Field>& result_fields() {
  using R = const PointResult&;
  using O = std::optional<double>;
  using P = const Repetition*;
  constexpr double MiB = 1 << 20;
  static const std::vector<Field> fields = [] {
  using S = PointResult&;
  using W = Repetition*;
  std::vector<Field> f = {
      {"flops", "GFLOP/call", 3, Better::Neither, 1e9, [](R r, double, P) -> O { return r.flops; },
       [](S r, W, double v) { r.flops = v; }},
      {"gflops_per_s", "GFLOP/s", 1, Better::Higher, 1,
       [](R r, double t, P) -> O { return t > 0 ? O(r.flops / t / 1e9) : std::nullopt; }, nullptr},
      {"peak_fraction", "of GEMM", 2, Better::Higher, 1,
       [](R r, double t, P) -> O {
         if (t <= 0 || r.gemm_gflops <= 0) return std::nullopt;
         return r.flops / t / 1e9 / (r.gemm_gflops * r.id.threads);
       },
       nullptr},
      {"admissible_fraction", "admissible", 2, Better::Higher, 1,
       [](R r, double, P) -> O { return r.admissible_fraction; }, [](S r, W, double v) { r.admissible_fraction = v; }},
      {"tokens_per_s", "tokens/s", 0, Better::Higher, 1,
       [](R r, double t, P) -> O { return t > 0 ? O(static_cast<double>(r.tokens()) / t) : std::nullopt; }, nullptr},
      {"peak_bytes", "peak MiB", 1, Better::Lower, MiB,
       [](R r, double, P) -> O { return static_cast<double>(r.peak_bytes); },
       [](S r, W, double v) { r.peak_bytes = static_cast<size_t>(v); }},
      {"peak_rss_bytes", "RSS MiB", 1, Better::Lower, MiB,
       [](R r, double, P) -> O { return static_cast<double>(r.peak_rss_bytes); },
       [](S r, W, double v) { r.peak_rss_bytes = static_cast<size_t>(v); }},
      {"rss_delta_bytes", "RSS +MiB", 1, Better::Lower, MiB,
       [](R r, double, P) -> O { return static_cast<double>(r.rss_delta_bytes); },
       [](S r, W, double v) { r.rss_delta_bytes = static_cast<int64_t>(v); }},
      {"nmse", "nmse", -1, Better::Lower, 1, [](R r, double, P) -> O { return r.nmse; },
       [](S r, W, double v) { r.nmse = v; }},
      {"nmse_f32", "nmse vs f32", -1, Better::Lower, 1, [](R r, double, P) -> O { return r.nmse_f32; },
       [](S r, W, double v) { r.nmse_f32 = v; }},
      {"instructions", "instructions", 0, Better::Lower, 1, [](R r, double, P) -> O { return r.instructions; },
       [](S r, W, double v) { r.instructions = v; }},
      // Model level.
      {"steps_per_s", "steps/s", 2, Better::Higher, 1,
       [](R r, double t, P) -> O { return r.id.level == Level::model && t > 0 ? O(1.0 / t) : std::nullopt; }, nullptr},
      {"loss", "loss", 4, Better::Neither, 1,
       [](R r, double, P rep) -> O {
         if (rep) return rep->loss;
         // Aggregates and tables: the mean over the repetitions.
         double s = 0;
         int n = 0;
         for (const auto& x : r.reps)
           if (x.loss) s += *x.loss, ++n;
         return n ? O(s / n) : std::nullopt;
       },
       [](S, W rep, double v) { rep->loss = v; }},
  };
  // Training runs: one field per TrainResult member.
  struct TrainField {
    const char* key;
    const char* header;
    int precision;
    Better better;
    double TrainResult::*member;
  };
  static const TrainField train_fields[] = {
      {"accuracy", "accuracy", 4, Better::Higher, &TrainResult::accuracy},
      {"final_accuracy", "final acc", 4, Better::Higher, &TrainResult::final_accuracy},
      {"val_accuracy", "val acc", 4, Better::Higher, &TrainResult::val_accuracy},
      {"token_accuracy", "token acc", 4, Better::Higher, &TrainResult::token_accuracy},
      {"eval_loss", "test loss", 4, Better::Lower, &TrainResult::eval_loss},
      {"train_steps", "steps", 0, Better::Neither, &TrainResult::train_steps},
      {"best_step", "best step", 0, Better::Neither, &TrainResult::best_step},
      {"train_seconds", "train s", 1, Better::Lower, &TrainResult::train_seconds},
      {"data_seconds", "data s", 1, Better::Lower, &TrainResult::data_seconds},
      {"eval_seconds", "eval s", 1, Better::Lower, &TrainResult::eval_seconds},
      {"checkpoint_seconds", "ckpt s", 2, Better::Lower, &TrainResult::checkpoint_seconds},
      {"checkpoint_bytes", "ckpt MiB", 1, Better::Lower, &TrainResult::checkpoint_bytes},
  };
  for (const auto& tf : train_fields) {
    auto member = tf.member;
    f.push_back({tf.key, tf.header, tf.precision, tf.better, std::string(tf.key) == "checkpoint_bytes" ? MiB : 1.0,
                 [member](R r, double, P) -> O { return r.train ? O((*r.train).*member) : std::nullopt; },
                 [member](S r, W, double v) {
                   if (!r.train) r.train = TrainResult{};
                   (*r.train).*member = v;
                 }});
  }
  // Length extrapolation: the test accuracy at each other length (train --test-seq).
  static std::vector<std::string> at_keys, at_headers;
  for (int64_t n = kFirstTestSeq; n <= kLastTestSeq; n *= 2) {
    at_keys.push_back(fmt::format("accuracy_at_{}", n));
    at_headers.push_back(fmt::format("acc N={}", n));
  }
  for (size_t i = 0; i < at_keys.size(); ++i) {
    const int64_t n = kFirstTestSeq << i;
    f.push_back({at_keys[i].c_str(), at_headers[i].c_str(), 4, Better::Higher, 1,
                 [n](R r, double, P) -> O {
                   if (!r.train || !r.train->accuracy_at.count(n)) return std::nullopt;
                   return r.train->accuracy_at.at(n);
                 },
                 [n](S r, W, double v) {
                   if (!r.train) r.train = TrainResult{};
                   r.train->accuracy_at[n] = v;
                 }});
  }
  // One column per layer type of the model's time breakdown.
  // (Field holds C strings: the names live in fixed static arrays.)
  static std::array<std::string, kLayerTypes> keys, headers;
  for (size_t i = 0; i < kLayerTypes; ++i) {
    keys[i] = fmt::format("{}_ms", layer_type_names()[i]);
    headers[i] = fmt::format("{} ms", layer_type_names()[i]);
  }
  for (size_t i = 0; i < kLayerTypes; ++i)
    f.push_back({keys[i].c_str(), headers[i].c_str(), 2, Better::Lower, 1,
                 [i](R r, double, P) -> O { return i < r.layer_ms.size() ? O(r.layer_ms[i]) : std::nullopt; },
                 [i](S r, W, double v) {
                   if (r.layer_ms.size() <= i) r.layer_ms.resize(i + 1);
                   r.layer_ms[i] = v;
                 }});
  return f;
  }();
  return fields;
}

const Field* find_field(const std::string& key) {
  for (const auto& f : result_fields())
    if (key == f.key) return &f;
  return nullptr;
}

// precision -1: scientific notation (errors span many decades).
std::string Field::format(double v) const {
  if (precision < 0) return fmt::format("{:.3e}", v / display_scale);
  return fmt::format("{:.{}f}", v / display_scale, precision);
}

}  // namespace ab
