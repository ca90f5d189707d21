#include "core/stop_signals.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>

namespace ab {
namespace {

// Gives the calling thread an alternate signal stack unless it has one (a sanitizer's, say).
// The stack lives as long as the thread. False when the kernel refuses it.
bool ensure_alternate_signal_stack() {
  thread_local std::unique_ptr<char[]> stack;
  stack_t current{};
  if (sigaltstack(nullptr, &current) == 0 && !(current.ss_flags & SS_DISABLE)) return true;
  // Room for the frame with the widest register state (AVX-512 xsave is about 2.7 KiB) and the
  // handler; SIGSTKSZ is no longer a constant since glibc 2.34.
  const size_t size = static_cast<size_t>(std::max<long>(sysconf(_SC_SIGSTKSZ), 64 * 1024));
  stack = std::make_unique<char[]>(size);
  stack_t s{};
  s.ss_sp = stack.get();
  s.ss_size = size;
  return sigaltstack(&s, nullptr) == 0;
}

std::atomic<uint64_t> g_continued{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

void on_continue(int) { g_continued.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

StopSignalHandler::StopSignalHandler(void (*on_signal)(int)) {
  bool ok = ensure_alternate_signal_stack();
#pragma omp parallel reduction(&& : ok)
  ok = ensure_alternate_signal_stack();
  if (!ok) throw std::runtime_error("sigaltstack failed: a stop signal could corrupt the heap");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
  struct sigaction cont {};
  cont.sa_handler = on_continue;
  cont.sa_flags = SA_ONSTACK | SA_RESTART;  // a continued read or write goes on
  sigemptyset(&cont.sa_mask);
  sigaction(SIGCONT, &cont, &old_cont_);
}

StopSignalHandler::~StopSignalHandler() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGCONT, &old_cont_, nullptr);
}

uint64_t continued_count() { return g_continued.load(std::memory_order_relaxed); }

}  // namespace ab
