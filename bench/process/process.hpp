// Child processes for the isolated sweep points and for valgrind instruction counts.
#pragma once
#include <atomic>
#include <string>
#include <vector>

namespace ab {

struct ChildOutcome {
  enum Kind { Exited, Signaled, TimedOut, Interrupted, SpawnFailed } kind = Exited;
  int exit_code = 0;
  int signal = 0;
  double seconds = 0;
  long max_rss_kib = 0;  // the child's peak resident set (getrusage)
  std::string describe() const;  // "exit code 3", "signal 11 (Segmentation fault)", ...
};

// Runs argv[0] (a path) with argv in its own process group, stdout and stderr redirected to the
// given files. Kills the whole group with SIGKILL after `time_limit_s` (0: no limit), and with
// SIGTERM (then, `grace_s` seconds later, SIGKILL) when `*interrupt` becomes true: a training
// run uses the grace to finish its step and write a checkpoint.
// Called first by every attnbench process: when it is a sweep's child, it dies with the sweep
// (PR_SET_PDEATHSIG) and stops itself a minute after its time limit.
void guard_sweep_child();

ChildOutcome run_child(const std::vector<std::string>& argv, const std::string& stdout_path,
                       const std::string& stderr_path, double time_limit_s,
                       const std::atomic<bool>* interrupt, double grace_s = 2.0);

// The last non-empty line of a text file (at most `max_chars`), for error messages.
std::string last_line_of(const std::string& path, size_t max_chars = 300);

// The running executable's absolute path (/proc/self/exe).
std::string self_executable();

// Where scratch directories go: $TMPDIR when set (the tests point it at a folder of their own),
// else /tmp.
std::string scratch_root();

// A scratch directory of this process, <scratch_root>/attnbench-KIND-PID-XXXXXX. Before it is made, those
// of processes that are gone (a run killed with SIGKILL cannot clean up) are removed, with a
// message: the suite made them and their owner no longer exists.
std::string make_scratch_dir(const std::string& kind);


}  // namespace ab
