#include "core/memory.hpp"

#include <fmt/format.h>

#include <cstdlib>

namespace ab {
namespace {
std::atomic<size_t> g_current{0};
std::atomic<size_t> g_peak{0};
std::atomic<uint64_t> g_allocations{0};
constexpr size_t kAlign = 64;
}  // namespace

std::string format_gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / (1ull << 30)); }

void MemoryMeter::on_alloc(size_t bytes) {
  size_t now = g_current.fetch_add(bytes) + bytes;
  size_t prev = g_peak.load();
  while (now > prev && !g_peak.compare_exchange_weak(prev, now)) {
  }
  g_allocations.fetch_add(1);
}
void MemoryMeter::on_free(size_t bytes) { g_current.fetch_sub(bytes); }
size_t MemoryMeter::current() { return g_current.load(); }
size_t MemoryMeter::peak() { return g_peak.load(); }
void MemoryMeter::reset_peak() { g_peak.store(g_current.load()); }
uint64_t MemoryMeter::allocations() { return g_allocations.load(); }

void* tracked_alloc(size_t bytes) {
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) throw std::bad_alloc();
  MemoryMeter::on_alloc(bytes);
  return p;
}

void tracked_free(void* p, size_t bytes) noexcept {
  std::free(p);
  MemoryMeter::on_free(bytes);
}

}  // namespace ab
