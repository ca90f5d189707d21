#include "bench/results.hpp"

#include "model/transformer.hpp"  // layer_type_names

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <stdexcept>
#include <unistd.h>

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

std::string PointId::name() const {
  std::string n = "attn:" + mechanism;
  for (const auto& [k, v] : params.items()) n += "/" + k + ":" + format_param_value(v);
  n += fmt::format("/level:{}/mode:{}/task:{}", level, to_string(mode), task);
  if (level == "model") n += fmt::format("/L:{}/dmodel:{}/mlp:{}", model.layers, model.dmodel, model.mlp);
  n += fmt::format("/B:{}/H:{}/N:{}/D:{}/causal:{}/threads:{}", shape.B, shape.H, shape.N, shape.D, causal ? 1 : 0,
                   threads);
  return n;
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
  std::vector<Field> f = {
      {"flops", "GFLOP/call", 3, Better::Neither, 1e9, [](R r, double, P) -> O { return r.flops; }},
      {"gflops_per_s", "GFLOP/s", 1, Better::Higher, 1,
       [](R r, double t, P) -> O { return t > 0 ? O(r.flops / t / 1e9) : std::nullopt; }},
      {"peak_fraction", "of GEMM", 2, Better::Higher, 1,
       [](R r, double t, P) -> O {
         if (t <= 0 || r.gemm_gflops <= 0) return std::nullopt;
         return r.flops / t / 1e9 / (r.gemm_gflops * r.id.threads);
       }},
      {"admissible_fraction", "admissible", 2, Better::Higher, 1,
       [](R r, double, P) -> O { return r.admissible_fraction; }},
      {"tokens_per_s", "tokens/s", 0, Better::Higher, 1,
       [](R r, double t, P) -> O { return t > 0 ? O(static_cast<double>(r.tokens()) / t) : std::nullopt; }},
      {"peak_bytes", "peak MiB", 1, Better::Lower, MiB,
       [](R r, double, P) -> O { return static_cast<double>(r.peak_bytes); }},
      {"peak_rss_bytes", "RSS MiB", 1, Better::Lower, MiB,
       [](R r, double, P) -> O { return static_cast<double>(r.peak_rss_bytes); }},
      {"rss_delta_bytes", "RSS +MiB", 1, Better::Lower, MiB,
       [](R r, double, P) -> O { return static_cast<double>(r.rss_delta_bytes); }},
      {"nmse", "nmse", -1, Better::Lower, 1, [](R r, double, P) -> O { return r.nmse; }},
      {"instructions", "instructions", 0, Better::Lower, 1, [](R r, double, P) -> O { return r.instructions; }},
      // Model level.
      {"steps_per_s", "steps/s", 2, Better::Higher, 1,
       [](R r, double t, P) -> O { return r.id.level == "model" && t > 0 ? O(1.0 / t) : std::nullopt; }},
      {"loss", "loss", 4, Better::Neither, 1,
       [](R r, double, P rep) -> O {
         if (rep) return rep->loss;
         // Aggregates and tables: the mean over the repetitions.
         double s = 0;
         int n = 0;
         for (const auto& x : r.reps)
           if (x.loss) s += *x.loss, ++n;
         return n ? O(s / n) : std::nullopt;
       }},
  };
  // One column per layer type of the model's time breakdown.
  // (Field holds C strings: the names live in fixed static arrays.)
  static std::array<std::string, kLayerTypes> keys, headers;
  for (size_t i = 0; i < kLayerTypes; ++i) {
    keys[i] = fmt::format("{}_ms", layer_type_names()[i]);
    headers[i] = fmt::format("{} ms", layer_type_names()[i]);
  }
  for (size_t i = 0; i < kLayerTypes; ++i)
    f.push_back({keys[i].c_str(), headers[i].c_str(), 2, Better::Lower, 1,
                 [i](R r, double, P) -> O { return i < r.layer_ms.size() ? O(r.layer_ms[i]) : std::nullopt; }});
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

namespace {
nlohmann::json identity(const PointResult& r) {
  nlohmann::json p = nlohmann::json::object();
  for (const auto& [k, v] : r.id.params.items()) p[k] = format_param_value(v);
  nlohmann::json id = {{"attn", r.id.mechanism}, {"params", p},           {"level", r.id.level},
                       {"mode", to_string(r.id.mode)}, {"task", r.id.task}, {"batch", r.id.shape.B},
                       {"heads", r.id.shape.H},        {"seq", r.id.shape.N}, {"dhead", r.id.shape.D},
                       {"causal", r.id.causal}};
  if (r.id.level == "model") {
    id["layers"] = r.id.model.layers;
    id["dmodel"] = r.id.model.dmodel;
    id["mlp"] = r.id.model.mlp;
  }
  return id;
}

void add_counters(nlohmann::json& e, const PointResult& r, double seconds, const Repetition* rep) {
  for (const auto& f : result_fields())
    if (auto v = f.value(r, seconds, rep)) e[f.key] = *v;
}
}  // namespace

nlohmann::json to_json_entries(const PointResult& r, int family_index) {
  nlohmann::json out = nlohmann::json::array();
  const std::string name = r.id.name();
  auto base = [&](const std::string& entry_name) {
    nlohmann::json e = {{"name", entry_name},
                        {"family_index", family_index},
                        {"per_family_instance_index", 0},
                        {"run_name", name},
                        {"threads", r.id.threads},
                        {"time_unit", "ms"},
                        {"label", r.label},
                        {"point", identity(r)}};
    return e;
  };
  if (r.status != Status::OK) {
    nlohmann::json e = base(name);
    e["run_type"] = "iteration";
    e["repetitions"] = 1;
    e["repetition_index"] = 0;
    e["iterations"] = 0;
    e["real_time"] = 0.0;
    e["cpu_time"] = 0.0;
    e["error_occurred"] = true;
    e["error_message"] = std::string(to_string(r.status)) + (r.message.empty() ? "" : ": " + r.message);
    out.push_back(e);
    return out;
  }
  const int reps = static_cast<int>(r.reps.size());
  for (int i = 0; i < reps; ++i) {
    const auto& rep = r.reps[static_cast<size_t>(i)];
    nlohmann::json e = base(name);
    e["run_type"] = "iteration";
    e["repetitions"] = reps;
    e["repetition_index"] = i;
    e["iterations"] = rep.iterations;
    e["real_time"] = rep.real_s * 1e3;
    e["cpu_time"] = rep.cpu_s * 1e3;
    add_counters(e, r, rep.real_s, &rep);
    out.push_back(e);
  }
  const TimeStats rs = real_stats(r), cs = cpu_stats(r);
  struct Agg {
    const char* name;
    double real, cpu;
    const char* unit;
  };
  const Agg aggs[] = {{"median", rs.median, cs.median, "time"},
                      {"mean", rs.mean, cs.mean, "time"},
                      {"stddev", rs.stddev, cs.stddev, "time"},
                      {"cv", rs.cv(), cs.cv(), "percentage"}};
  for (const auto& a : aggs) {
    nlohmann::json e = base(name + "_" + a.name);
    e["run_type"] = "aggregate";
    e["repetitions"] = reps;
    e["aggregate_name"] = a.name;
    e["aggregate_unit"] = a.unit;
    e["iterations"] = reps;
    const bool pct = std::string(a.unit) == "percentage";
    e["real_time"] = pct ? a.real : a.real * 1e3;
    e["cpu_time"] = pct ? a.cpu : a.cpu * 1e3;
    // Counters of the median and mean aggregates are evaluated at that time.
    if (std::string(a.name) == "median" || std::string(a.name) == "mean") add_counters(e, r, a.real, nullptr);
    out.push_back(e);
  }
  return out;
}

nlohmann::json results_document(const nlohmann::json& context, const std::vector<PointResult>& rs) {
  nlohmann::json doc = {{"context", context}, {"benchmarks", nlohmann::json::array()}};
  int family = 0;
  for (const auto& r : rs)
    for (auto& e : to_json_entries(r, family++)) doc["benchmarks"].push_back(std::move(e));
  return doc;
}

namespace {
// The table columns: identity, status, time statistics, then every Field.
struct Column {
  std::string header;
  std::function<std::string(const PointResult&)> cell;
};

std::string params_text(const PointResult& r) {
  std::string s;
  for (const auto& [k, v] : r.id.params.items()) s += (s.empty() ? "" : " ") + k + "=" + format_param_value(v);
  return s;
}

std::vector<Column> columns(bool for_csv) {
  std::vector<Column> c = {
      {"mechanism", [](const PointResult& r) { return r.id.mechanism; }},
      {"params", params_text},
      {"level", [](const PointResult& r) { return r.id.level; }},
      {"task", [](const PointResult& r) { return r.id.task; }},
      {"model", [](const PointResult& r) {
         return r.id.level == "model" ? fmt::format("L={} d={} mlp={}", r.id.model.layers, r.id.model.dmodel, r.id.model.mlp)
                                      : std::string();
       }},
      {"mode", [](const PointResult& r) { return std::string(to_string(r.id.mode)); }},
      {"causal", [](const PointResult& r) { return std::string(r.id.causal ? "1" : "0"); }},
      {"B", [](const PointResult& r) { return std::to_string(r.id.shape.B); }},
      {"H", [](const PointResult& r) { return std::to_string(r.id.shape.H); }},
      {"N", [](const PointResult& r) { return std::to_string(r.id.shape.N); }},
      {"D", [](const PointResult& r) { return std::to_string(r.id.shape.D); }},
      {"threads", [](const PointResult& r) { return std::to_string(r.id.threads); }},
      {"status",
       [for_csv](const PointResult& r) {
         std::string s = to_string(r.status);
         if (r.status != Status::OK && !r.message.empty() && for_csv) s += ": " + r.message;
         return s;
       }},
      {for_csv ? "real_time_ms" : "median ms",
       [](const PointResult& r) {
         return r.status == Status::OK ? fmt::format("{:.4g}", real_stats(r).median * 1e3) : "";
       }},
      {for_csv ? "cv" : "cv %",
       [for_csv](const PointResult& r) {
         if (r.status != Status::OK) return std::string();
         double cv = real_stats(r).cv();
         return for_csv ? fmt::format("{:.4f}", cv) : fmt::format("{:.1f}", 100 * cv);
       }},
      {for_csv ? "cpu_time_ms" : "cpu ms",
       [](const PointResult& r) {
         return r.status == Status::OK ? fmt::format("{:.4g}", cpu_stats(r).median * 1e3) : "";
       }},
  };
  for (const auto& f : result_fields()) {
    c.push_back({for_csv ? f.key : f.header, [&f, for_csv](const PointResult& r) -> std::string {
                   if (r.status != Status::OK) return "";
                   auto v = f.value(r, real_stats(r).median, nullptr);
                   if (!v) return "";
                   if (for_csv) return fmt::format("{:.6g}", *v);
                   return f.format(*v);
                 }});
  }
  return c;
}
}  // namespace

std::string to_markdown(const std::vector<PointResult>& rs) {
  // A metric no row has (nmse without --error, instructions without --count) is left out.
  auto all = columns(false);
  std::vector<Column> cols;
  const size_t fixed = all.size() - result_fields().size();
  for (size_t i = 0; i < all.size(); ++i) {
    bool any = i < fixed && all[i].header != "model";  // model sizes: only with model rows
    for (const auto& r : rs) any = any || !all[i].cell(r).empty();
    if (any) cols.push_back(all[i]);
  }
  std::string out = "|";
  for (const auto& c : cols) out += " " + c.header + " |";
  out += "\n|";
  for (size_t i = 0; i < cols.size(); ++i) out += "---|";
  out += "\n";
  for (const auto& r : rs) {
    out += "|";
    for (const auto& c : cols) out += " " + c.cell(r) + " |";
    out += "\n";
  }
  std::vector<std::string> notes;
  for (const auto& r : rs)
    if (r.status != Status::OK)
      notes.push_back(fmt::format("{} N={}: {}: {}", r.id.mechanism, r.id.shape.N, to_string(r.status), r.message));
  for (const auto& n : notes) out += "\n- " + n;
  if (!notes.empty()) out += "\n";
  return out;
}

namespace {
std::string csv_escape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"') o += '"';
    o += ch;
  }
  return o + "\"";
}
}  // namespace

std::string to_csv(const std::vector<PointResult>& rs) {
  auto cols = columns(true);
  std::string out;
  for (size_t i = 0; i < cols.size(); ++i) out += (i ? "," : "") + csv_escape(cols[i].header);
  out += "\n";
  for (const auto& r : rs) {
    for (size_t i = 0; i < cols.size(); ++i) out += (i ? "," : "") + csv_escape(cols[i].cell(r));
    out += "\n";
  }
  return out;
}

void write_file_atomic(const std::string& path, const std::string& content) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path tmp = target;
  tmp += fmt::format(".tmp.{}", static_cast<long>(getpid()));
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  bool ok = std::fwrite(content.data(), 1, content.size(), f) == content.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw std::runtime_error("failed writing " + path);
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + ec.message());
  }
}

}  // namespace ab
