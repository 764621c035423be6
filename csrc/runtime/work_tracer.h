// The device's own record of the work it ran: a tracer (CUPTI's activity API on CUDA) that
// stamps every kernel, copy and memset with the device's clock when it starts and ends, and
// tells which host call queued it. The profiler ties that work to its bricks by interval ids it
// pushes on the launching thread around each brick (profiler/work_correlator.h). Plain C++: the
// records are the runtime's, not CUPTI's, so the correlation is tested without a GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace brick::runtime {

// One piece of work the device ran: the tracer's id of the host call that queued it (a call may
// queue several: a graph launch), and its start and end on the device's clock, in ns.
struct TracedWork {
  uint32_t call;
  int64_t start_ns;
  int64_t end_ns;
};

// A host call made while `interval` was pushed on its thread (its innermost one).
struct TracedCall {
  uint32_t call;
  uint64_t interval;
};

// What the tracer delivered since it was last drained.
struct TracedRecords {
  std::vector<TracedWork> work;
  std::vector<TracedCall> calls;
  uint64_t dropped = 0;  // records the tracer lost (its buffers were full, or none could be had)
};

class WorkTracer {
 public:
  virtual ~WorkTracer() = default;
  virtual const char* name() const noexcept = 0;
  // Starts tracing the device work of every thread. Throws Error saying why it cannot.
  virtual void start() = 0;
  // Stops tracing; what was traced stays to be drained.
  virtual void stop() noexcept = 0;
  // On the calling thread: the host calls it makes from now on belong to `interval` (nonzero),
  // until the matching pop(). Nested pushes form a stack; a call belongs to the innermost.
  virtual void push(uint64_t interval) noexcept = 0;
  virtual void pop() noexcept = 0;
  // pop() then push(interval), with no instant between them in which a call belongs to neither.
  virtual void replace(uint64_t interval) noexcept {
    pop();
    push(interval);
  }
  // Hands over every record of work that completed on the device before this call (the caller
  // waited for the work it needs), and of the calls that queued it.
  virtual void drain(TracedRecords* into) = 0;
  // Brick's launches (kernels, copies) seen through the launch hooks since start(): work the
  // tracer must have recorded.
  virtual uint64_t launches() const noexcept = 0;
};

// The host's: brick's launches on the host runtime run on the launching thread, so a launch's
// work is the time from its queueing to its end, on the steady clock (the registry's own clock
// domain for the host). Sees the launches through the launch hooks (runtime/launch_observer.h)
// while started. One per process is in use at a time.
std::unique_ptr<WorkTracer> make_host_work_tracer();
// In a forked child: the host tracer's locks renewed (a parent's thread may have held one at the
// fork) and the parent's records forgotten.
void host_work_tracer_after_fork_in_child() noexcept;

// CUPTI's activity API, loaded at run time (BRICK_CUPTI_LIBRARY, else libcupti.so by the
// loader's search): nullptr where this build has no CUDA or CUPTI cannot be loaded, with the
// reason in `why`.
std::unique_ptr<WorkTracer> make_cupti_tracer(std::string* why);

}  // namespace brick::runtime
