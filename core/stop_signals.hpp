// Catching SIGINT and SIGTERM in a process that runs oneDNN.
//
// oneDNN 2.x's generated f32 GEMM kernels (the "gemm:jit" matmul, which small tiles such as
// flash attention's backward products over 128 keys get) point rsp into a heap buffer while they
// run, when the product's inner dimension exceeds what they keep on the stack (oneDNN issue
// #4845, fixed upstream in March 2026 by pull request #4855; Debian's libdnnl 2.6 has it). A handler that runs
// on the interrupted thread's stack then has its signal frame, several KiB with AVX-512 state,
// written into the heap below that buffer: glibc aborts at a later free ("corrupted size vs.
// prev_size"), a division traps, or libgomp waits forever on an overwritten futex word. A
// stopped training run then lost the steps since its last checkpoint, or hung.
//
// So the handlers are installed with SA_ONSTACK, and the calling thread and every thread of the
// current OpenMP team get an alternate signal stack: the kernel writes the frame there, never at
// rsp. (A process-directed signal goes to the main thread unless it blocks it.)
//
// The same handler counts SIGCONT: a process stopped (SIGSTOP, Ctrl-Z, a job paused so another
// can be timed) and continued sees wall time pass that it did not run. A timer that sees
// `continued_count()` change across its interval knows it was paused and drops the interval.
#pragma once
#include <signal.h>

#include <cstdint>

namespace ab {

// While alive: SIGCONT increments continued_count(), on an alternate stack. Destruction restores
// the handler that was there before. Timers hold one around what they time.
class ContinueCounter {
 public:
  ContinueCounter();
  ~ContinueCounter();
  ContinueCounter(const ContinueCounter&) = delete;
  ContinueCounter& operator=(const ContinueCounter&) = delete;

 private:
  struct sigaction old_cont_ {};
};

// While alive: SIGINT and SIGTERM call `on_signal` (which should only set a flag) on an
// alternate stack, and SIGCONT is counted (a ContinueCounter). Destruction restores the handlers
// that were there before.
class StopSignalHandler {
 public:
  explicit StopSignalHandler(void (*on_signal)(int));
  ~StopSignalHandler();
  StopSignalHandler(const StopSignalHandler&) = delete;
  StopSignalHandler& operator=(const StopSignalHandler&) = delete;

 private:
  ContinueCounter continued_;
  struct sigaction old_int_ {}, old_term_ {};
};

// How many times this process was continued after a stop while a ContinueCounter was alive.
uint64_t continued_count();

}  // namespace ab
