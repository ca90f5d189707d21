#include "bench/result_reader.hpp"

#include <fmt/format.h>

#include <algorithm>

#include <fstream>
#include <map>
#include <sstream>


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
  if (!rf.context.is_object()) throw InvalidInput(fmt::format("{}: 'context' is not an object", path));
  if (rf.context.contains("json_schema_version")) {
    const auto& v = rf.context.at("json_schema_version");
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      throw InvalidInput(fmt::format("{}: 'json_schema_version' is not a positive integer", path));
    if (v.get<int64_t>() > kResultSchemaVersion)
      throw InvalidInput(fmt::format("{} has json_schema_version {}; this attnbench reads up to version {} (a newer "
                                     "attnbench wrote it)", path, v.get<int64_t>(), kResultSchemaVersion));
  }
  const double file_gemm = rf.context.value("gemm_gflops_per_s_1thread", 0.0);
  std::map<std::string, size_t> index;  // point name -> position in rf.points
  const auto& entries = doc.at("benchmarks");
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const std::string where = fmt::format("{}: entry {}", path, i);
    if (!e.is_object()) throw InvalidInput(where + " is not an object");
    if (field<std::string>(e, "run_type", where) != "iteration") continue;  // aggregates are derived
    const std::string name = field<std::string>(e, "run_name", where);
    auto it = index.find(name);
    if (it == index.end()) {
      PointResult r;
      r.id = read_point(e, name, where);
      if (r.id.name() != name)
        throw InvalidInput(fmt::format("{}: its name '{}' does not match its point fields ('{}')", where, name, r.id.name()));
      r.label = e.value("label", "");
      if (e.value("error_occurred", false)) {
        r.status = parse_status(field<std::string>(e, "error_message", where), &r.message);
      } else {
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
                        field<int64_t>(e, "iterations", where), std::nullopt});
      // Every stored metric, through the one list of fields (derived rates are recomputed).
      for (const auto& f : result_fields())
        if (f.store)
          if (const auto v = counter(e, f.key)) f.store(r, &r.reps.back(), *v);
    }
  }
  for (const auto& r : rf.points)
    if (r.status == Status::OK && r.reps.empty())
      throw InvalidInput(fmt::format("{}: point {} has no repetitions", path, r.id.name()));
  return rf;
}

std::vector<ResultFile> read_result_files(const std::vector<std::string>& paths) {
  std::vector<ResultFile> files;
  for (const auto& p : paths) files.push_back(read_result_file(p));
  return files;
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

void filter_result_files(std::vector<ResultFile>& files, const std::string& regex) {
  if (regex.empty()) return;
  const NameFilter keep(regex);
  size_t left = 0, all = 0;
  for (auto& f : files) {
    all += f.points.size();
    f.points.erase(std::remove_if(f.points.begin(), f.points.end(), [&](const PointResult& r) { return !keep(r.id.name()); }),
                   f.points.end());
    left += f.points.size();
  }
  if (!left) throw InvalidInput(fmt::format("--filter '{}' matches none of the {} points in the file(s)", regex, all));
}

}  // namespace ab
