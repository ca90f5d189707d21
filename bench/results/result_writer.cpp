#include "bench/results/result_writer.hpp"

#include "core/files.hpp"
#include "bench/text/terminal.hpp"
#include "bench/text/text_table.hpp"

#include <fmt/format.h>
#include <algorithm>

#include <cstdio>
#include <set>
#include <filesystem>
#include <stdexcept>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ab {

namespace {
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
                        {"time_unit", "ms"},
                        {"label", r.label}};
    write_point(r.id, e);
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
    // An OK point's remark (attention dropout not applied, a length not tested).
    if (!r.message.empty()) e["note"] = r.message;
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

std::vector<Column> columns(bool for_csv) {
  std::vector<Column> c;
  // The identity, column by column as the point schema orders them.
  const auto titles = point_columns(PointId{});
  for (size_t i = 0; i < titles.size(); ++i)
    c.push_back({titles[i].first, [i](const PointResult& r) { return point_columns(r.id)[i].second; }});
  const std::vector<Column> rest = {
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
  c.insert(c.end(), rest.begin(), rest.end());
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

std::string to_markdown(const std::vector<PointResult>& rs, int width) {
  // A metric no row has (nmse without --error, instructions without --instructions) is left out.
  auto all = columns(false);
  std::vector<Column> cols;
  const size_t fixed = all.size() - result_fields().size();
  // Fitted to a terminal, the headline metrics only (--wide: all of them).
  static const std::set<std::string> headline = {"GFLOP/s",  "of GEMM", "peak MiB",  "nmse",     "nmse vs f32", "instructions",
                                                 "steps/s",  "accuracy", "val acc", "token acc", "test loss"};
  const bool training = std::any_of(rs.begin(), rs.end(), [](const PointResult& r) { return r.train.has_value(); });
  static const std::set<std::string> timing_details = {"median ms", "cv %", "cpu ms", "GFLOP/s", "of GEMM"};
  for (size_t i = 0; i < all.size(); ++i) {
    // Columns of some points only (model sizes, real data, training recipes): only with such rows.
    bool any = i < fixed && all[i].header != "model" && all[i].header != "training" && all[i].header != "data";
    for (const auto& r : rs) any = any || !all[i].cell(r).empty();
    if (width > 0 && i >= fixed && !headline.count(all[i].header)) any = false;
    // Training runs: the accuracy and the step rate say it; the per-step timing details are --wide's.
    if (width > 0 && training && timing_details.count(all[i].header)) any = false;
    if (any) cols.push_back(all[i]);
  }
  TextTable t;
  bool metrics = false;  // the columns after the status are measurements: right-aligned, never moved
  for (size_t i = 0; i < cols.size(); ++i) {
    t.header.push_back(cols[i].header);
    if (cols[i].header == "mechanism" || cols[i].header == "N") t.keep.insert(i);
    if (metrics) t.right_aligned.insert(i);
    else t.movable.insert(i);
    metrics = metrics || cols[i].header == "status";
  }
  for (const auto& r : rs) {
    std::vector<std::string> row;
    for (const auto& c : cols) row.push_back(c.cell(r));
    t.rows.push_back(std::move(row));
  }
  std::string out = render_markdown(t, width);
  std::vector<std::string> notes;
  for (const auto& r : rs)
    if (r.status != Status::OK)
      notes.push_back(fmt::format("{} N={}: {}: {}", r.id.mechanism, r.id.shape.N, to_string(r.status), r.message));
  for (const auto& n : notes) out += "\n- " + fit_columns(n, width);
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

std::string prepare_output_path(const std::string& path, bool force) {
  namespace fs = std::filesystem;
  if (path.empty() || path == "-") return path;
  const std::string target = link_target(path);
  std::error_code ec;
  if (fs::exists(fs::status(target, ec)) && fs::is_regular_file(fs::status(target, ec)) && !force)
    throw InvalidInput(fmt::format("--out {} exists; choose another name or pass --force to overwrite it", path));
  require_writable_file("--out", path);  // not a regular file, an unwritable directory, a name too long
  return target;
}

void refuse_overwriting_inputs(const std::string& out, const std::vector<std::string>& inputs) {
  if (out.empty() || out == "-") return;
  for (const auto& in : inputs)
    if (same_file(out, in))
      throw InvalidInput(fmt::format("--out {} is also an input of this command ({}); --force never replaces an input: "
                                     "choose another --out",
                                     out, in));
}

void write_file_atomic(const std::string& path, const std::string& content) {
  namespace fs = std::filesystem;
  const fs::path target = link_target(path);
  remove_stale_temporaries(target.string());
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

ResultFileLock::ResultFileLock(const std::string& path) {
  lock_path_ = link_target(path) + ".lock";
  // Open, lock, and check the lock file is still the one at the path (a holder that finished
  // removes it; a lock on a removed file would guard nothing): the usual lock-file loop.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw InvalidInput(fmt::format("cannot create the lock file {}: {}", lock_path_, std::strerror(errno)));
    // A lock file holds a pid or nothing (just made); anything else is a user's file that only
    // has the name: never written over, never removed.
    char seen[32] = {};
    const ssize_t got = ::pread(fd, seen, sizeof seen - 1, 0);
    if (got > 0 && std::string(seen, static_cast<size_t>(got)).find_first_not_of("0123456789\n") != std::string::npos) {
      ::close(fd);
      throw InvalidInput(fmt::format("{} exists and is not an attnbench lock file; move it away to write {}", lock_path_, path));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      char buf[32] = {};
      const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      ::close(fd);
      const std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
      throw InvalidInput(fmt::format("{} is being written by another attnbench (pid {}); wait for it to finish, or "
                                     "choose another --out",
                                     path, holder.substr(0, holder.find_first_of("\n "))));
    }
    struct stat held {}, now {};
    if (fstat(fd, &held) == 0 && ::stat(lock_path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      const std::string pid = std::to_string(static_cast<long>(getpid())) + "\n";
      if (ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
        // The pid is for messages only; the lock holds without it.
      }
      fd_ = fd;
      return;
    }
    ::close(fd);  // replaced while we waited: try the new one
  }
  throw InvalidInput(fmt::format("cannot lock {}", lock_path_));
}

ResultFileLock::~ResultFileLock() {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // while still holding it: a waiter then retries on a new file
  ::close(fd_);
}

}  // namespace ab
