#include "bench/process/process.hpp"

#include "core/files.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

extern char** environ;

namespace ab {

std::string ChildOutcome::describe() const {
  switch (kind) {
    case Exited: return fmt::format("exit code {}", exit_code);
    case Signaled: return fmt::format("signal {} ({})", signal, strsignal(signal));
    case TimedOut: return fmt::format("killed after {:.0f} s", seconds);
    case Interrupted: return "interrupted";
    case SpawnFailed: return "could not start the child process";
  }
  return "?";
}

namespace {
// The environment a child is started with: ours, plus who its parent is and its time limit, so
// the child can stop itself when the sweep cannot (guard_sweep_child).
constexpr const char* kParentVar = "ATTNBENCH_SWEEP_PID";
constexpr const char* kLimitVar = "ATTNBENCH_CHILD_TIME_LIMIT";
}  // namespace

void guard_sweep_child() {
  const char* parent = std::getenv(kParentVar);
  const char* limit = std::getenv(kLimitVar);
  const long parent_pid = parent ? std::atol(parent) : 0;
  const double limit_s = limit ? std::atof(limit) : 0;
  // Not for the child's own children (valgrind counting instructions runs attnbench again).
  unsetenv(kParentVar);
  unsetenv(kLimitVar);
  if (parent_pid <= 0) return;
  // 1. Die with the sweep: a sweep killed by SIGKILL cannot stop its children itself. The parent
  // may have died before the prctl took effect, so check it is still the one that started us.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != static_cast<pid_t>(parent_pid)) _exit(137);
  // 2. Stop at the time limit even if the sweep does not (it kills at the limit; this is the
  // second guard, a minute later): SIGALRM's default action ends the process.
  if (limit_s > 0) alarm(static_cast<unsigned>(std::min(limit_s + 60.0, 4.0e9)));
}

std::string self_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

ChildOutcome run_child(const std::vector<std::string>& argv, const std::string& stdout_path,
                       const std::string& stderr_path, double time_limit_s,
                       const std::atomic<bool>* interrupt, double grace_s) {
  ChildOutcome out;
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group: a timeout or an interrupt stops the child and anything it started
  // (valgrind, OpenMP threads), and the terminal's Ctrl-C reaches only the sweep, which decides.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t dflt;
  sigemptyset(&dflt);
  sigaddset(&dflt, SIGINT);
  sigaddset(&dflt, SIGTERM);
  posix_spawnattr_setsigdefault(&attr, &dflt);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, kParentVar, std::strlen(kParentVar)) != 0 && std::strncmp(*e, kLimitVar, std::strlen(kLimitVar)) != 0)
      env_text.emplace_back(*e);
  env_text.push_back(fmt::format("{}={}", kParentVar, static_cast<long>(getpid())));
  if (time_limit_s > 0) env_text.push_back(fmt::format("{}={}", kLimitVar, time_limit_s));
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, cargv[0], &fa, &attr, cargv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    out.kind = ChildOutcome::SpawnFailed;
    out.exit_code = rc;
    return out;
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  bool killed_for_time = false, killed_for_interrupt = false;
  double term_sent_at = -1;
  int status = 0;
  struct rusage ru {};
  while (true) {
    const pid_t w = wait4(pid, &status, WNOHANG, &ru);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    const double t = elapsed();
    if (!killed_for_time && time_limit_s > 0 && t > time_limit_s) {
      kill(-pid, SIGKILL);
      killed_for_time = true;
    }
    if (interrupt && interrupt->load() && !killed_for_interrupt) {
      kill(-pid, SIGTERM);
      killed_for_interrupt = true;
      term_sent_at = t;
    }
    if (killed_for_interrupt && t - term_sent_at > grace_s) kill(-pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(t < 1.0 ? 2 : 20));
  }
  kill(-pid, SIGKILL);  // anything the child left behind in its group
  out.seconds = elapsed();
  out.max_rss_kib = ru.ru_maxrss;
  if (killed_for_interrupt) out.kind = ChildOutcome::Interrupted;
  else if (killed_for_time) out.kind = ChildOutcome::TimedOut;
  else if (WIFSIGNALED(status)) {
    out.kind = ChildOutcome::Signaled;
    out.signal = WTERMSIG(status);
  } else {
    out.kind = ChildOutcome::Exited;
    out.exit_code = WEXITSTATUS(status);
  }
  return out;
}

std::string last_line_of(const std::string& path, size_t max_chars) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    // The progress lines of a child end in carriage returns; keep the last segment.
    const auto cr = line.find_last_of('\r', line.size() > 1 ? line.size() - 2 : 0);
    if (cr != std::string::npos && cr + 1 < line.size()) line = line.substr(cr + 1);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) last = line;
  }
  if (last.size() > max_chars) last = last.substr(0, max_chars) + "...";
  return last;
}

std::string scratch_root() {
  const char* dir = std::getenv("TMPDIR");
  return dir && *dir ? std::string(dir) : std::string("/tmp");
}

std::string make_scratch_dir(const std::string& kind) {
  namespace fs = std::filesystem;
  const std::string root = scratch_root();
  // 1. Those of earlier processes that are gone (a killed run leaves its scratch behind).
  const std::string prefix = "attnbench-" + kind + "-";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const auto dash = rest.find('-');
    if (dash == std::string::npos || rest.find_first_not_of("0123456789") != dash) continue;
    if (!process_gone(std::atol(rest.substr(0, dash).c_str()))) continue;
    std::error_code rm;
    fs::remove_all(entry.path(), rm);
    if (!rm) std::cerr << "attnbench: removed " << entry.path().string() << ", left by a run that was stopped\n";
  }
  // 2. Ours, named by our pid.
  std::string tmpl = (fs::path(root) / fmt::format("{}{}-XXXXXX", prefix, static_cast<long>(getpid()))).string();
  if (!mkdtemp(tmpl.data()))
    throw std::runtime_error(fmt::format("cannot create a scratch directory in {}: {}", root, std::strerror(errno)));
  return tmpl;
}

}  // namespace ab
