#include "core/files.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <iostream>

#include "core/params.hpp"

namespace ab {

namespace fs = std::filesystem;

namespace {
// The status of `path`, with "absent" told apart from "cannot tell" (a symbolic-link loop, a
// name too long, a directory without search permission): the latter throws InvalidInput.
fs::file_status status_or_refuse(const std::string& option, const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && st.type() != fs::file_type::not_found)
    throw InvalidInput(fmt::format("{} {}: {}", option, path, ec.message()));
  return st;
}
}  // namespace

namespace {
// A file written atomically is first FILE.tmp.PID beside it: its name must leave room for that.
void check_name_leaves_room_for_temporary(const std::string& option, const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  constexpr size_t kSuffix = 5 + 10;  // ".tmp." and a pid
  if (name.size() + kSuffix > 255)
    throw InvalidInput(fmt::format("{} {}: the file name is {} characters; at most {} (the file system's 255, less room "
                                   "for the temporary file a write goes through)",
                                   option, path, name.size(), 255 - kSuffix));
}
}  // namespace

void require_directory(const std::string& option, const std::string& dir) {
  const fs::file_status st = status_or_refuse(option, dir);
  if (!fs::exists(st)) throw InvalidInput(fmt::format("{} {}: no such directory", option, dir));
  if (!fs::is_directory(st)) throw InvalidInput(fmt::format("{} {} is not a directory", option, dir));
}

void require_regular_file(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) throw InvalidInput(fmt::format("{}: cannot open ({})", path, ec ? ec.message() : "missing?"));
  if (!fs::is_regular_file(st)) throw InvalidInput(fmt::format("{} is not a regular file (a directory, FIFO or device)", path));
}

void make_directory(const std::string& option, const std::string& dir) {
  if (dir.empty()) throw InvalidInput(fmt::format("{} is empty; give a directory", option));
  const fs::file_status st = status_or_refuse(option, dir);
  if (fs::exists(st) && !fs::is_directory(st))
    throw InvalidInput(fmt::format("{} {} exists and is not a directory", option, dir));
  if (!fs::exists(st)) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw InvalidInput(fmt::format("{} {}: cannot create it: {}", option, dir, ec.message()));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InvalidInput(fmt::format("{} {}: the directory is not writable ({})", option, dir, std::strerror(errno)));
}

void require_writable_file(const std::string& option, const std::string& path) {
  if (path.empty()) throw InvalidInput(fmt::format("{} is empty; give a file", option));
  const std::string target = link_target(path);
  const fs::file_status st = status_or_refuse(option, target);
  check_name_leaves_room_for_temporary(option, target);
  if (fs::exists(st)) {
    if (!fs::is_regular_file(st))
      throw InvalidInput(fmt::format("{} {} exists and is not a regular file (a directory, FIFO or device)", option, path));
    if (::access(target.c_str(), W_OK) != 0)
      throw InvalidInput(fmt::format("{} {} is not writable ({})", option, path, std::strerror(errno)));
    return;
  }
  const fs::path parent = fs::path(target).has_parent_path() ? fs::path(target).parent_path() : fs::path(".");
  const fs::file_status dir = status_or_refuse(option, parent.string());
  if (!fs::is_directory(dir))
    throw InvalidInput(fmt::format("{} {}: the directory {} does not exist", option, path, parent.string()));
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw InvalidInput(fmt::format("{} {}: the directory {} is not writable ({})", option, path, parent.string(),
                                   std::strerror(errno)));
}

std::string link_target(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  return p.string();
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  const bool same = fs::equivalent(a, b, ec);
  return !ec && same;
}

bool process_gone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

void remove_stale_temporaries(const std::string& file) {
  const fs::path target(file);
  const std::string prefix = target.filename().string() + ".tmp.";
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || !process_gone(std::atol(pid.c_str())))
      continue;
    std::error_code rm;
    if (fs::remove(entry.path(), rm) && !rm)
      std::cerr << "attnbench: removed " << entry.path().string() << ", left by a write that was stopped\n";
  }
}

}  // namespace ab
