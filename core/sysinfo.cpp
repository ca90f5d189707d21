#include "core/sysinfo.hpp"

#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace ab {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

bool reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  bool ok = std::fputs("5", f) >= 0;
  ok = (std::fclose(f) == 0) && ok;
  return ok;
}

namespace {
size_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(k, 0) == 0) return std::strtoull(line.c_str() + k.size(), nullptr, 10);
  }
  return 0;
}

std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string k = line.substr(0, colon);
    k.erase(k.find_last_not_of(" \t") + 1);
    if (k != key) continue;  // the whole key: "model" is not "model name"
    auto v = line.substr(colon + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  }
  return "";
}
}  // namespace

size_t current_rss_bytes() { return status_kib("VmRSS") * 1024; }
size_t peak_rss_bytes() { return status_kib("VmHWM") * 1024; }

size_t default_memory_limit() { return physical_memory_bytes() / 5 * 4; }

size_t physical_memory_bytes() {
  return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

MachineInfo machine_info() {
  MachineInfo m;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  m.host_name = host;
  m.cpu_model = cpuinfo_field("model name");
  m.mhz_per_cpu = std::atof(cpuinfo_field("cpu MHz").c_str());
  m.num_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  auto add = [&](const char* type, int level, long size) {
    if (size > 0) m.caches.push_back({type, level, size, level >= 3 ? m.num_cpus : 1});
  };
  add("Data", 1, sysconf(_SC_LEVEL1_DCACHE_SIZE));
  add("Instruction", 1, sysconf(_SC_LEVEL1_ICACHE_SIZE));
  add("Unified", 2, sysconf(_SC_LEVEL2_CACHE_SIZE));
  add("Unified", 3, sysconf(_SC_LEVEL3_CACHE_SIZE));
  m.cpu_isa = __builtin_cpu_supports("avx512f")  ? "avx512"
              : __builtin_cpu_supports("avx2")   ? "avx2"
              : __builtin_cpu_supports("avx")    ? "avx"
              : __builtin_cpu_supports("sse4.2") ? "sse4.2"
                                                 : "x86-64";
  std::string id;
  for (const char c : m.cpu_model) {
    const bool alnum = std::isalnum(static_cast<unsigned char>(c)) != 0;
    if (alnum) id += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!id.empty() && id.back() != '-') id += '-';
  }
  if (!id.empty() && id.back() == '-') id.pop_back();
  m.machine_id = fmt::format("{}-{}-l1d{}k-l2{}k-{}cpu", id.empty() ? "cpu" : id, m.cpu_isa,
                             sysconf(_SC_LEVEL1_DCACHE_SIZE) / 1024, sysconf(_SC_LEVEL2_CACHE_SIZE) / 1024, m.num_cpus);
  double la[3] = {0, 0, 0};
  if (getloadavg(la, 3) == 3) m.load_avg = {la[0], la[1], la[2]};
  m.physical_memory = physical_memory_bytes();
  m.cpu_family = cpuinfo_field("cpu family");
  m.cpu_model_number = cpuinfo_field("model");
  m.cpu_stepping = cpuinfo_field("stepping");
  struct utsname u {};
  if (uname(&u) == 0) m.kernel = std::string(u.sysname) + " " + u.release;
  for (int cpu = 0; cpu < m.num_cpus; ++cpu) {
    std::ifstream gov(fmt::format("/sys/devices/system/cpu/cpu{}/cpufreq/scaling_governor", cpu));
    std::string g;
    if (gov >> g) m.cpu_scaling_enabled = m.cpu_scaling_enabled.value_or(false) || g != "performance";
  }
  char buf[64];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", &tm);
  std::string d = buf;
  if (d.size() > 2) d.insert(d.size() - 2, ":");  // Google Benchmark writes +00:00
  m.date = d;
  return m;
}

}  // namespace ab
