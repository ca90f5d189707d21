// Writing results: Google Benchmark's JSON format (one entry per repetition plus the median,
// mean, stddev and cv aggregates), and `run`'s markdown and CSV tables.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/results/result.hpp"

namespace ab {

nlohmann::json to_json_entries(const PointResult& r, int family_index);
nlohmann::json results_document(const nlohmann::json& context, const std::vector<PointResult>& rs);

// `width` > 0: fitted to that many columns (bench/text/text_table.hpp), 0: every column in full.
std::string to_markdown(const std::vector<PointResult>& rs, int width = 0);
std::string to_csv(const std::vector<PointResult>& rs);

// Checks an --out path before any work: refused (InvalidInput, exit 2) when it exists and `force`
// is off, when it is not a regular file, or when its directory is missing or not writable.
// Returns the file it names (a symbolic link's target).
std::string prepare_output_path(const std::string& path, bool force);

// Refuses (InvalidInput) an --out that names one of the command's input files, through links and
// hard links: --force lets an output replace an earlier output, never what the command reads.
void refuse_overwriting_inputs(const std::string& out, const std::vector<std::string>& inputs);

// Writes through a temporary file and a rename, so the destination is never partial; through a
// symbolic link, the file it points to is written and the link kept.
void write_file_atomic(const std::string& path, const std::string& content);

// An exclusive lock on a result file for a writer's whole run: flock on PATH.lock, which holds the
// writer's pid and is removed when the lock is released. A second writer (two sweeps, or a sweep
// and a train, on one --out) is refused with InvalidInput naming the holder's pid, instead of the
// two overwriting each other's points.
class ResultFileLock {
 public:
  explicit ResultFileLock(const std::string& path);
  ~ResultFileLock();
  ResultFileLock(const ResultFileLock&) = delete;
  ResultFileLock& operator=(const ResultFileLock&) = delete;

 private:
  int fd_ = -1;
  std::string lock_path_;
};

}  // namespace ab
