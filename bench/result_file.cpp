#include "bench/result_file.hpp"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <sstream>

#include "model/transformer.hpp"  // layer_type_names

namespace ab {

Status parse_status(const std::string& error_message, std::string* rest) {
  const auto colon = error_message.find(':');
  const std::string word = error_message.substr(0, colon);
  if (rest) {
    *rest = colon == std::string::npos ? "" : error_message.substr(colon + 1);
    if (!rest->empty() && (*rest)[0] == ' ') rest->erase(0, 1);
  }
  for (Status s : {Status::SKIPPED, Status::OOM, Status::TIMEOUT, Status::CRASHED, Status::FAILED})
    if (word == to_string(s)) return s;
  if (rest) *rest = error_message;
  return Status::FAILED;
}

namespace {
Mode mode_from(const std::string& m, const std::string& where) {
  for (Mode x : {Mode::fwd, Mode::fwdbwd, Mode::decode, Mode::train})
    if (m == to_string(x)) return x;
  throw InvalidInput(fmt::format("{}: unknown mode '{}'", where, m));
}

template <class T>
T field(const nlohmann::json& e, const char* key, const std::string& where) {
  if (!e.contains(key)) throw InvalidInput(fmt::format("{} has no '{}'", where, key));
  try {
    return e.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InvalidInput(fmt::format("{}: '{}' has the wrong type", where, key));
  }
}

std::optional<double> counter(const nlohmann::json& e, const char* key) {
  if (!e.contains(key) || !e.at(key).is_number()) return std::nullopt;
  return e.at(key).get<double>();
}
}  // namespace

ResultFile parse_result_document(const nlohmann::json& doc, const std::string& path) {
  ResultFile rf;
  rf.path = path;
  if (!doc.is_object() || !doc.contains("benchmarks") || !doc.at("benchmarks").is_array())
    throw InvalidInput(fmt::format("{} is not a result file: no 'benchmarks' array", path));
  rf.context = doc.value("context", nlohmann::json::object());
  const double file_gemm = rf.context.value("gemm_gflops_per_s_1thread", 0.0);
  std::map<std::string, size_t> index;  // point name -> position in rf.points
  const auto& entries = doc.at("benchmarks");
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const std::string where = fmt::format("{}: entry {}", path, i);
    if (!e.is_object()) throw InvalidInput(where + " is not an object");
    if (field<std::string>(e, "run_type", where) != "iteration") continue;  // aggregates are derived
    const std::string name = field<std::string>(e, "run_name", where);
    const auto& p = e.contains("point") ? e.at("point") : throw InvalidInput(where + " has no 'point'");
    auto it = index.find(name);
    if (it == index.end()) {
      PointResult r;
      r.id.mechanism = field<std::string>(p, "attn", where + " point");
      // Parameters in declaration order, as the name lists them (a JSON object is unordered).
      const auto params = field<nlohmann::json>(p, "params", where + " point");
      if (!params.is_object()) throw InvalidInput(where + ": 'params' is not an object");
      size_t pos = name.find('/');
      while (pos != std::string::npos && name.compare(pos + 1, 6, "level:") != 0) {
        const size_t next = name.find('/', pos + 1);
        const std::string kv = name.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
        const std::string k = kv.substr(0, kv.find(':'));
        if (!params.contains(k) || !params.at(k).is_string())
          throw InvalidInput(fmt::format("{}: parameter '{}' of its name is not in its point fields", where, k));
        r.id.params.set(k, params.at(k).get<std::string>());
        pos = next;
      }
      r.id.level = field<std::string>(p, "level", where + " point");
      r.id.mode = mode_from(field<std::string>(p, "mode", where + " point"), where);
      r.id.task = field<std::string>(p, "task", where + " point");
      r.id.shape = Shape4{field<int64_t>(p, "batch", where), field<int64_t>(p, "heads", where),
                          field<int64_t>(p, "seq", where), field<int64_t>(p, "dhead", where)};
      r.id.causal = field<bool>(p, "causal", where + " point");
      if (r.id.level == "model")
        r.id.model = ModelDims{field<int64_t>(p, "layers", where + " point"), field<int64_t>(p, "dmodel", where + " point"),
                               field<int64_t>(p, "mlp", where + " point")};
      r.id.threads = field<int>(e, "threads", where);
      if (r.id.name() != name)
        throw InvalidInput(fmt::format("{}: its name '{}' does not match its point fields ('{}')", where, name, r.id.name()));
      r.label = e.value("label", "");
      if (e.value("error_occurred", false)) {
        r.status = parse_status(field<std::string>(e, "error_message", where), &r.message);
      } else {
        r.flops = counter(e, "flops").value_or(0);
        r.peak_bytes = static_cast<size_t>(counter(e, "peak_bytes").value_or(0));
        r.peak_rss_bytes = static_cast<size_t>(counter(e, "peak_rss_bytes").value_or(0));
        r.rss_delta_bytes = static_cast<int64_t>(counter(e, "rss_delta_bytes").value_or(0));
        r.admissible_fraction = counter(e, "admissible_fraction");
        r.nmse = counter(e, "nmse");
        r.instructions = counter(e, "instructions");
        for (const char* name : layer_type_names())
          if (auto ms = counter(e, fmt::format("{}_ms", name).c_str())) r.layer_ms.push_back(*ms);
        // The GEMM rate the point was judged against (merged files mix machines' contexts).
        const auto gf = counter(e, "gflops_per_s"), frac = counter(e, "peak_fraction");
        r.gemm_gflops = gf && frac && *frac > 0 ? *gf / *frac / r.id.threads : file_gemm;
      }
      index[name] = rf.points.size();
      rf.points.push_back(std::move(r));
      it = index.find(name);
    }
    PointResult& r = rf.points[it->second];
    if (r.status == Status::OK) {
      const double unit = 1e-3;  // time_unit ms
      if (e.value("time_unit", "ms") != "ms") throw InvalidInput(where + ": time_unit is not ms");
      r.reps.push_back({field<double>(e, "real_time", where) * unit, field<double>(e, "cpu_time", where) * unit,
                        field<int64_t>(e, "iterations", where), counter(e, "loss")});
    }
  }
  for (const auto& r : rf.points)
    if (r.status == Status::OK && r.reps.empty())
      throw InvalidInput(fmt::format("{}: point {} has no repetitions", path, r.id.name()));
  return rf;
}

ResultFile read_result_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput(fmt::format("cannot read result file {}", path));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw InvalidInput(fmt::format("{} is not valid JSON (truncated or corrupt?): {}", path, e.what()));
  }
  return parse_result_document(doc, path);
}

}  // namespace ab
