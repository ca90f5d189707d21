#include "bench/merge.hpp"

#include <fmt/format.h>

#include <iostream>
#include <map>

#include "bench/result_writer.hpp"

namespace ab {

nlohmann::json merge_files(const std::vector<ResultFile>& files, bool allow_mixed_cpus, const std::string& command) {
  if (files.empty()) throw InvalidInput("merge needs at least one file");
  const std::string cpu = files.front().context.value("cpu_model", "");
  std::map<std::string, std::string> where;
  std::vector<PointResult> points;
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& f : files) {
    const std::string c = f.context.value("cpu_model", "");
    if (c != cpu && !allow_mixed_cpus)
      throw InvalidInput(fmt::format("{} was measured on '{}' but {} on '{}'; pass --allow-mixed-cpus to merge them anyway",
                                     files.front().path, cpu, f.path, c));
    for (const auto& r : f.points) {
      const auto [it, fresh] = where.emplace(r.id.name(), f.path);
      if (!fresh) throw InvalidInput(fmt::format("point {} is in both {} and {}", r.id.name(), it->second, f.path));
      points.push_back(r);
    }
    sources.push_back({{"path", f.path},
                       {"command", f.context.value("command", "")},
                       {"host_name", f.context.value("host_name", "")},
                       {"cpu_model", c},
                       {"date", f.context.value("date", "")},
                       {"shard", f.context.value("shard", "")}});
  }
  nlohmann::json context = files.front().context;
  context["command"] = command;
  context["merged_from"] = sources;
  context.erase("shard");
  return results_document(context, points);
}

int cmd_merge(const std::vector<std::string>& paths, const std::string& out, bool allow_mixed_cpus,
              const std::string& command) {
  const auto doc = merge_files(read_result_files(paths), allow_mixed_cpus, command);
  write_file_atomic(out, doc.dump(2) + "\n");
  std::cerr << fmt::format("merge: {} files into {}\n", paths.size(), out);
  return 0;
}

}  // namespace ab
