#include "bench/engine/instructions.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "bench/process/process.hpp"

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

// glibc's allocator: the functions of its malloc/ sources (named with libc6-dbg, which Debian's
// valgrind package depends on; without it only the exported entry points have names).
bool is_allocator(const std::string& object, const std::string& file, std::string fn) {
  const std::string base = object.substr(object.rfind('/') + 1);
  if (base.rfind("libc.so", 0) != 0 && base.rfind("libc-", 0) != 0) return false;
  if (file.find("malloc/malloc.c") != std::string::npos || file.find("malloc/arena.c") != std::string::npos)
    return true;
  fn = fn.substr(0, fn.find_first_of(".'@"));  // _mid_memalign.constprop.0, free@@GLIBC_2.2.5
  static const std::set<std::string> entry = {"malloc", "free", "calloc", "realloc", "posix_memalign",
                                              "memalign", "aligned_alloc", "valloc", "pvalloc", "cfree"};
  return entry.count(fn) > 0;
}
}  // namespace

// The callgrind format (valgrind.org/docs/manual/cl-format.html): names may be compressed to
// "(id) name" on first use and "(id)" after, with one id space for objects (ob=, cob=), one for
// files (fl=, fi=, fe=, cfi=, cfl=) and one for functions (fn=, cfn=). A cost line is a position
// followed by the event counts; the cost line right after calls= is the call's inclusive cost,
// already counted as the callee's own lines, so it is skipped.
CallgrindCount read_callgrind_profile(std::istream& in) {
  std::map<std::string, std::map<std::string, std::string>> names;  // id space -> id -> name
  auto resolve = [&](const std::string& space, const std::string& v) {
    if (v.empty() || v[0] != '(') return v;
    const size_t close = v.find(')');
    if (close == std::string::npos) throw std::runtime_error("unreadable compressed name: " + v);
    const std::string id = v.substr(1, close - 1);
    std::string name = close + 1 < v.size() ? v.substr(close + 1) : "";
    if (!name.empty() && name[0] == ' ') name.erase(0, 1);
    auto& m = names[space];
    if (!name.empty()) m[id] = name;
    return m[id];
  };
  CallgrindCount c;
  double declared = -1;
  size_t positions = 1, ir = std::string::npos;
  std::string object, fn_file, file, fn;
  bool allocator = false, skip_next = false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const char c0 = line[0];
    if ((c0 >= '0' && c0 <= '9') || c0 == '+' || c0 == '-' || c0 == '*') {
      if (skip_next) {
        skip_next = false;
        continue;
      }
      if (ir == std::string::npos) throw std::runtime_error("cost line before an events: line naming Ir");
      std::istringstream ss(line);
      std::string tok;
      for (size_t i = 0; i < positions; ++i) ss >> tok;  // the position columns
      double v = 0;
      for (size_t i = 0; i <= ir && ss >> tok; ++i)
        if (i == ir) v = std::strtod(tok.c_str(), nullptr);
      c.total += v;
      if (allocator) c.allocator += v;
      continue;
    }
    const size_t eq = line.find('='), colon = line.find(':');
    if (eq != std::string::npos && (colon == std::string::npos || eq < colon)) {
      const std::string key = line.substr(0, eq), val = line.substr(eq + 1);
      if (key == "ob") object = resolve("ob", val);
      else if (key == "cob") resolve("ob", val);
      else if (key == "fl") fn_file = file = resolve("fl", val);
      else if (key == "fi" || key == "fe") file = resolve("fl", val);
      else if (key == "cfi" || key == "cfl") resolve("fl", val);
      else if (key == "fn") fn = resolve("fn", val), file = fn_file;
      else if (key == "cfn") resolve("fn", val);
      else if (key == "calls") skip_next = true;
      if (key == "ob" || key == "fl" || key == "fi" || key == "fe" || key == "fn")  // the cost lines' owner
        allocator = is_allocator(object, file, fn);
      continue;
    }
    if (colon == std::string::npos) throw std::runtime_error("unreadable line: " + line.substr(0, 80));
    const std::string key = line.substr(0, colon);
    std::istringstream val(line.substr(colon + 1));
    std::vector<std::string> words;
    for (std::string w; val >> w;) words.push_back(w);
    if (key == "positions") {
      positions = words.size();
    } else if (key == "events") {
      for (size_t i = 0; i < words.size(); ++i)
        if (words[i] == "Ir") ir = i;
    } else if (key == "totals" || (key == "summary" && declared < 0)) {
      if (!words.empty() && ir < words.size()) declared = std::strtod(words[ir].c_str(), nullptr);
    }
  }
  if (declared < 0) throw std::runtime_error("the profile has no totals or summary line");
  if (c.total != declared)
    throw std::runtime_error(fmt::format("the profile's cost lines add up to {:.0f} instructions, its totals line says {:.0f}",
                                         c.total, declared));
  return c;
}

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
  // Instructions executed while collection was on, less the C allocator's (see the header).
  if (o.kind != ChildOutcome::Exited || o.exit_code != 0) {
    r.status = Status::FAILED;
    r.message = fmt::format("instruction count under callgrind failed ({}): {}", o.describe(),
                            last_line_of((dir / "stderr").string()));
  } else {
    try {
      std::ifstream in(out_file);
      if (!in) throw std::runtime_error("no profile at " + out_file);
      const CallgrindCount c = read_callgrind_profile(in);
      if (c.total <= 0) throw std::runtime_error("the profile counted no instructions");
      r.instructions = c.total - c.allocator;
    } catch (const std::exception& e) {
      r.status = Status::FAILED;
      r.message = std::string("instruction count: ") + e.what();
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace ab
