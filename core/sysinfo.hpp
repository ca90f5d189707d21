// Facts about the machine and the process: clocks, resident memory, CPU description.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ab {

double wall_seconds();
// CPU time of the whole process (all threads): OpenMP code is timed by both clocks.
double process_cpu_seconds();

// Resets the kernel's resident-set high-water mark (VmHWM) through /proc/self/clear_refs.
// Returns false where the kernel does not allow it; peak RSS then covers the process lifetime.
bool reset_peak_rss();
size_t current_rss_bytes();
size_t peak_rss_bytes();
size_t physical_memory_bytes();
// The memory a point or a batch may be predicted to need before it is refused: 80% of RAM (run's
// --mem-limit default; dump and task rate use it too).
size_t default_memory_limit();

struct CacheInfo {
  std::string type;
  int level = 0;
  long size = 0;
  int num_sharing = 0;
};

struct MachineInfo {
  std::string host_name, cpu_model, date;
  // The widest vector extension the CPU has (avx512, avx2, avx, sse4.2, x86-64): oneDNN's
  // kernels and ours take different paths on each, so wall times differ by more than clocks.
  std::string cpu_isa;
  // One token naming the machine for wall-time comparisons: model, ISA, private cache sizes and
  // CPU count (a VM's model name alone, such as "AMD EPYC", does not tell Zen 3 from Zen 5).
  std::string machine_id;
  int num_cpus = 0;
  double mhz_per_cpu = 0;
  std::vector<CacheInfo> caches;
  std::vector<double> load_avg;
  size_t physical_memory = 0;
  // /proc/cpuinfo's "cpu family", "model" and "stepping" (empty where absent), and the kernel
  // release (uname): a hypervisor's model name alone does not say which core it is.
  std::string cpu_family, cpu_model_number, cpu_stepping, kernel;
  // Whether any CPU's frequency governor is not "performance" (Google Benchmark's rule);
  // nullopt where the kernel exposes no governor (many virtual machines).
  std::optional<bool> cpu_scaling_enabled;
};
MachineInfo machine_info();

}  // namespace ab
