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

// Every thread that may take the signal (the caller and the current OpenMP team) gets an
// alternate stack, then `sig` calls `handler` on it.
void install_on_alternate_stack(int sig, void (*handler)(int), int flags, struct sigaction* old) {
  bool ok = ensure_alternate_signal_stack();
#pragma omp parallel reduction(&& : ok)
  ok = ensure_alternate_signal_stack();
  if (!ok) throw std::runtime_error("sigaltstack failed: a signal could corrupt the heap");
  struct sigaction sa {};
  sa.sa_handler = handler;
  sa.sa_flags = SA_ONSTACK | flags;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, old);
}

}  // namespace

ContinueCounter::ContinueCounter() {
  install_on_alternate_stack(SIGCONT, on_continue, SA_RESTART, &old_cont_);  // a continued read or write goes on
}

ContinueCounter::~ContinueCounter() { sigaction(SIGCONT, &old_cont_, nullptr); }

StopSignalHandler::StopSignalHandler(void (*on_signal)(int)) {
  install_on_alternate_stack(SIGINT, on_signal, 0, &old_int_);
  install_on_alternate_stack(SIGTERM, on_signal, 0, &old_term_);
}

StopSignalHandler::~StopSignalHandler() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

uint64_t continued_count() { return g_continued.load(std::memory_order_relaxed); }

}  // namespace ab
