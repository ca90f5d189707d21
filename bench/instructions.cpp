#include "bench/instructions.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/process.hpp"

namespace ab {

namespace {
std::string find_valgrind() {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string candidate = dir + "/valgrind";
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}
}  // namespace

void check_instruction_counting() {
#ifdef __AVX512F__
  throw InvalidInput(
      "--instructions needs a build without AVX-512 (valgrind cannot execute it): "
      "scripts/build.sh build-count -DATTNBENCH_ARCH=x86-64-v3, then build-count/attnbench");
#endif
#ifdef __SANITIZE_ADDRESS__
  throw InvalidInput(
      "--instructions needs a build without AddressSanitizer (valgrind cannot run it, and its "
      "checks would be counted): scripts/build.sh build-count -DATTNBENCH_ARCH=x86-64-v3");
#endif
  if (find_valgrind().empty())
    throw InvalidInput("--instructions needs valgrind on PATH (Debian package valgrind)");
}

void count_point_instructions(const std::vector<std::string>& run_args, PointResult& r) {
  namespace fs = std::filesystem;
  fs::path dir;
  try {
    dir = make_scratch_dir("callgrind");
  } catch (const std::exception& e) {
    r.status = Status::FAILED;
    r.message = std::string("instruction count: ") + e.what();
    return;
  }
  const std::string out_file = (dir / "callgrind.out").string();
  std::vector<std::string> argv = {find_valgrind(), "--tool=callgrind", "--collect-atstart=no",
                                   "--callgrind-out-file=" + out_file, self_executable()};
  argv.insert(argv.end(), run_args.begin(), run_args.end());
  for (const char* a : {"--gemm-gflops", "1", "--callgrind-child", "--format", "json"})
    argv.push_back(a);
  const ChildOutcome o = run_child(argv, (dir / "stdout").string(), (dir / "stderr").string(), 0, nullptr);
  // The "totals:" line of the profile: Ir (instructions executed) while collection was on.
  double total = -1;
  std::ifstream in(out_file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("totals:", 0) == 0 || (total < 0 && line.rfind("summary:", 0) == 0))
      total = std::strtod(line.c_str() + line.find(':') + 1, nullptr);
  if (o.kind != ChildOutcome::Exited || o.exit_code != 0 || total <= 0) {
    r.status = Status::FAILED;
    r.message = fmt::format("instruction count under callgrind failed ({}): {}", o.describe(),
                            last_line_of((dir / "stderr").string()));
  } else {
    r.instructions = total;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace ab
