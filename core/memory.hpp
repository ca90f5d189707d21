// Tracked memory: every byte a mechanism allocates goes through here, so the peak working
// memory of a call is an exact count rather than an estimate. Buffers are 64-byte aligned
// (one cache line, one AVX-512 register) and are only ever created in untimed setup code.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <utility>

namespace ab {

class MemoryMeter {
 public:
  static void on_alloc(size_t bytes);
  static void on_free(size_t bytes);
  static size_t current();
  static size_t peak();
  // Start a new high-water mark at the current level.
  static void reset_peak();
  // Number of tracked allocations ever made (for tests of allocation complexity).
  static uint64_t allocations();
};

// "1.50 GiB": a byte count as the messages and tables print it.
std::string format_gib(double bytes);

void* tracked_alloc(size_t bytes);  // throws std::bad_alloc
void tracked_free(void* p, size_t bytes) noexcept;

// An owning, move-only, tracked array of trivially copyable T.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t count) : n_(count) {
    if (n_) p_ = static_cast<T*>(tracked_alloc(n_ * sizeof(T)));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~Buffer() { release(); }

  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  T& operator[](size_t i) const { return p_[i]; }
  void zero() const {
    if (n_) std::memset(static_cast<void*>(p_), 0, bytes());
  }

 private:
  void release() {
    if (p_) tracked_free(p_, bytes());
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace ab
