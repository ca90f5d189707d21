#include "bench/results/merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "bench/results/result_writer.hpp"

namespace ab {

namespace {
// Whether two results are the same measurement: equal but for the last digits of their numbers.
// A result read back and written again can move in its 16th digit (times are kept in seconds and
// written in their unit), so a point carried through a different number of files differs there.
bool same_result(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return x == y || std::fabs(x - y) <= 1e-12 * std::max(std::fabs(x), std::fabs(y));
  }
  if (a.type() != b.type() || a.size() != b.size()) return false;
  if (a.is_array()) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!same_result(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    for (auto it = a.begin(); it != a.end(); ++it)
      if (!b.contains(it.key()) || !same_result(it.value(), b.at(it.key()))) return false;
    return true;
  }
  return a == b;
}
}  // namespace

nlohmann::json merge_files(const std::vector<ResultFile>& files, bool allow_mixed_cpus, const std::string& command) {
  if (files.empty()) throw InvalidInput("merge needs at least one file");
  const std::string cpu = files.front().context.value("cpu_model", "");
  std::map<std::string, std::pair<std::string, size_t>> where;  // point -> (its file, its index in points)
  std::vector<PointResult> points;
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& f : files) {
    const std::string c = f.context.value("cpu_model", "");
    if (c != cpu && !allow_mixed_cpus)
      throw InvalidInput(fmt::format("{} was measured on '{}' but {} on '{}'; pass --allow-mixed-cpus to merge them anyway",
                                     files.front().path, cpu, f.path, c));
    for (const auto& r : f.points) {
      const auto [it, fresh] = where.emplace(r.id.name(), std::make_pair(f.path, points.size()));
      if (fresh) {
        points.push_back(r);
        continue;
      }
      // The same result carried in two files is one point: a shard resumed from a merged file
      // (a grid moved to new machines) holds the other shards' finished points too. Two
      // different results for one point are two measurements: refused.
      const auto& [first_path, index] = it->second;
      if (!same_result(to_json_entries(points[index], 0), to_json_entries(r, 0)))
        throw InvalidInput(fmt::format("point {} is in both {} and {}, with different results", r.id.name(),
                                       first_path, f.path));
    }
    sources.push_back({{"path", f.path},
                       {"command", f.context.value("command", "")},
                       {"host_name", f.context.value("host_name", "")},
                       {"cpu_model", c},
                       {"machine_id", f.context.value("machine_id", "")},
                       {"date", f.context.value("date", "")},
                       {"shard", f.context.value("shard", "")},
                       // the points resumptions added, with the machine and commit of each
                       {"resumed_by", f.context.value("resumed_by", nlohmann::json::array())}});
  }
  nlohmann::json context = files.front().context;
  context["command"] = command;
  context["merged_from"] = sources;
  context.erase("shard");
  return results_document(context, points);
}

int cmd_merge(const std::vector<std::string>& paths, const std::string& out, bool allow_mixed_cpus,
              const std::string& command) {
  std::set<std::filesystem::path> seen;
  for (const auto& p : paths)
    if (!seen.insert(std::filesystem::weakly_canonical(p)).second) throw InvalidInput(fmt::format("{} is given twice", p));
  const auto doc = merge_files(read_result_files(paths), allow_mixed_cpus, command);
  write_file_atomic(out, doc.dump(2) + "\n");
  std::cerr << fmt::format("merge: {} files into {}\n", paths.size(), out);
  return 0;
}

}  // namespace ab
