#include "bench/results/result_reader.hpp"

#include <fmt/format.h>

#include <algorithm>

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
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

// A number of a repetition that must be finite and at least `min` (times, counts, bytes).
double checked(const nlohmann::json& e, const char* key, const std::string& where, double min, bool required) {
  if (!e.contains(key)) {
    if (required) throw InvalidInput(fmt::format("{} has no '{}'", where, key));
    return min;
  }
  const auto& v = e.at(key);
  if (!v.is_number()) throw InvalidInput(fmt::format("{}: '{}' is not a number", where, key));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < min) throw InvalidInput(fmt::format("{}: '{}' is {}, not a finite number >= {}", where, key, x, min));
  return x;
}

// The deepest nesting of arrays and objects in a JSON text (strings skipped), so that a hostile
// file cannot overflow the parser's stack: result files nest four levels.
int json_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}
// The context fields attnbench reads, or adds to when it resumes, merges or re-judges a file, with
// their types: a file whose field has another type is refused when read, before anything is
// written to it (a sweep once added its resumption to a file, then failed on a wrongly typed
// 'warnings' with the JSON library's raw message).
void check_context_types(const nlohmann::json& context, const std::string& path) {
  enum class T { string, number, integer, strings, numbers, objects, objects_or_strings };
  static const std::vector<std::pair<const char*, T>> kTypes = {
      {"machine_id", T::string},   {"cpu_model", T::string},   {"git_commit", T::string},
      {"command", T::string},      {"host_name", T::string},   {"date", T::string},
      {"shard", T::string},        {"num_cpus", T::integer},   {"threads", T::integer},
      {"gemm_other_runnable", T::integer}, {"gemm_gflops_per_s_1thread", T::number},
      {"load_avg", T::numbers},    {"warnings", T::strings},   {"retried", T::objects},
      {"resumed_by", T::objects_or_strings},  {"merged_from", T::objects}};
  // resumed_by: one object per resumption (its command, time and points); files written before
  // 2026-11-25 hold the resuming command alone, a string (results/studies/lra-accuracy/).
  auto all_of = [](const nlohmann::json& v, auto&& pred) {
    if (!v.is_array()) return false;
    for (const auto& x : v)
      if (!pred(x)) return false;
    return true;
  };
  for (const auto& [key, type] : kTypes) {
    if (!context.contains(key)) continue;
    const auto& v = context.at(key);
    bool ok = false;
    const char* expected = "";
    switch (type) {
      case T::string: ok = v.is_string(), expected = "a string"; break;
      case T::number: ok = v.is_number(), expected = "a number"; break;
      case T::integer: ok = v.is_number_integer(), expected = "an integer"; break;
      case T::strings: ok = all_of(v, [](const auto& x) { return x.is_string(); }), expected = "a list of strings"; break;
      case T::numbers: ok = all_of(v, [](const auto& x) { return x.is_number(); }), expected = "a list of numbers"; break;
      case T::objects: ok = all_of(v, [](const auto& x) { return x.is_object(); }), expected = "a list of objects"; break;
      case T::objects_or_strings:
        ok = all_of(v, [](const auto& x) { return x.is_object() || x.is_string(); }), expected = "a list of objects (or of commands)";
        break;
    }
    if (!ok) throw InvalidInput(fmt::format("{}: context '{}' is not {}", path, key, expected));
  }
}
}  // namespace

ResultFile parse_result_document(const nlohmann::json& doc, const std::string& path) {
  ResultFile rf;
  rf.path = path;
  if (!doc.is_object() || !doc.contains("benchmarks") || !doc.at("benchmarks").is_array())
    throw InvalidInput(fmt::format("{} is not a result file: no 'benchmarks' array", path));
  rf.context = doc.contains("context") ? doc.at("context") : nlohmann::json::object();
  if (!rf.context.is_object()) throw InvalidInput(fmt::format("{}: 'context' is not an object", path));
  check_context_types(rf.context, path);
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
  std::set<std::string> seen;            // name#repetition: each once
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
      fill_declared_defaults(r.id);
      r.label = e.contains("label") && e.at("label").is_string() ? e.at("label").get<std::string>() : "";
      if (e.contains("error_occurred") && !e.at("error_occurred").is_boolean())
        throw InvalidInput(fmt::format("{}: 'error_occurred' is not true or false", where));
      if (e.value("error_occurred", false)) {
        r.status = parse_status(field<std::string>(e, "error_message", where), &r.message);
      } else {
        // The GEMM rate the point was judged against (merged files mix machines' contexts).
        const auto gf = counter(e, "gflops_per_s"), frac = counter(e, "peak_fraction");
        r.gemm_gflops = gf && frac && *frac > 0 ? *gf / *frac / r.id.threads : file_gemm;
        if (e.contains("note") && e.at("note").is_string()) r.message = e.at("note").get<std::string>();
      }
      index[name] = rf.points.size();
      rf.points.push_back(std::move(r));
      it = index.find(name);
    }
    PointResult& r = rf.points[it->second];
    if (r.status == Status::OK) {
      const double unit = 1e-3;  // time_unit ms
      if (field<std::string>(e, "time_unit", where) != "ms") throw InvalidInput(where + ": time_unit is not ms");
      const int64_t rep = static_cast<int64_t>(checked(e, "repetition_index", where, 0, true));
      if (!seen.insert(name + "#" + std::to_string(rep)).second)
        throw InvalidInput(fmt::format("{}: point {} repetition {} appears twice in the file", where, name, rep));
      const double real = checked(e, "real_time", where, 0, true), cpu = checked(e, "cpu_time", where, 0, true);
      if (!(real > 0)) throw InvalidInput(fmt::format("{}: 'real_time' is {}, not a positive time", where, real));
      const auto& iters = e.contains("iterations") ? e.at("iterations") : nlohmann::json();
      if (!iters.is_number_integer() || iters.get<int64_t>() < 1)
        throw InvalidInput(fmt::format("{}: 'iterations' is not a positive integer", where));
      for (const char* bytes : {"peak_bytes", "peak_rss_bytes", "flops"}) checked(e, bytes, where, 0, false);
      r.reps.push_back({real * unit, cpu * unit, iters.get<int64_t>(), std::nullopt});
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
  // A FIFO or a device would block the read forever, a directory reads as nothing: only a
  // regular file (through links) is a result file.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InvalidInput(fmt::format("cannot read result file {}: it does not exist", path));
  if (!S_ISREG(st.st_mode)) throw InvalidInput(fmt::format("{} is not a regular file (a directory, FIFO or device)", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput(fmt::format("cannot read result file {}", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (const int depth = json_depth(text); depth > 64)
    throw InvalidInput(fmt::format("{} nests {} levels deep; a result file nests a few: not a result file", path, depth));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(fmt::format("{} is not valid JSON (truncated or corrupt?): {}", path, e.what()));
  }
  try {
    return parse_result_document(doc, path);
  } catch (const nlohmann::json::exception& e) {
    // A field of an unexpected type that the checks above did not name.
    throw InvalidInput(fmt::format("{}: {}", path, e.what()));
  }
}

void require_points(const std::vector<ResultFile>& files) {
  for (const auto& f : files)
    if (f.points.empty()) throw InvalidInput(fmt::format("{} holds no points (an empty result file)", f.path));
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
