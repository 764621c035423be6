// The brick profiler: the RecordFunction observer that feeds the registry, PyTorch's
// ProfilerStubs for the legacy autograd profiler, and the device timeline they record.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "registry/registry.h"

namespace brick::profiler {

// ---- the native registry -------------------------------------------------------------------

// The process-wide registry every brick op and range is recorded into.
registry::Registry& brick_registry();

// Registers the RecordFunction observer (ops, record_function ranges, autograd nodes; ops at
// brick's kernels instead with OpTiming::Kernels). While disabled no callback is registered: the
// op path pays nothing. Throws if already enabled.
void enable();
void disable();  // throws if not enabled
bool is_enabled() noexcept;
// Throws while enabled: a profiled region is timed in one mode from start to end.
void set_sync_mode(registry::SyncMode mode);
registry::SyncMode sync_mode() noexcept;
// Whether the profiles enabled from now on record each op's input shapes (shape_stats.h).
// Throws while enabled: a profiled region records them from start to end or not at all.
void set_record_shapes(bool on);
bool record_shapes() noexcept;
// Where the registry times ops (ranges and autograd nodes are timed alike in both).
enum class OpTiming : uint8_t {
  // Every op the dispatcher runs on the profiled thread (composites such as aten::linear with
  // the ops inside them, views, factories), through RecordFunction, named as PyTorch's profilers
  // name them. Every op call then takes PyTorch's RecordFunction path (its cost with no
  // callback work at all is most of what profiling costs a model of small ops).
  Dispatcher,
  // Every brick kernel and copy (the ops that run device work: aten::addmm for a Linear, no
  // views), timed at brick's kernel entry: ops do not take the RecordFunction path.
  Kernels,
};
// Throws while enabled, like the sync mode.
void set_op_timing(OpTiming timing);
OpTiming op_timing() noexcept;
// What gives bricks their device time in Event mode (Immediate and Deferred read the host's
// clock; set_device_timing refuses Traced for them at enable()).
enum class DeviceTiming : uint8_t {
  // A pair of device events around each brick's work on its stream: the interval between them
  // (on a stream the host barely keeps fed, the gaps between launches too).
  Events,
  // The device's own record of each piece of work (runtime/work_tracer.h: CUPTI on CUDA, the
  // launches on the host runtime): the sum of the durations of the work each brick queued, its
  // nested bricks' included. enable() throws, saying why, where no tracer can be had.
  Traced,
};
// Throws while enabled, like the sync mode.
void set_device_timing(DeviceTiming timing);
DeviceTiming device_timing() noexcept;
// The tracer Traced timing uses on this process's runtime ("CUPTI", "host"), or why there is
// none: (name, reason), one of them empty. Creates the runtime.
std::pair<std::string, std::string> work_tracer_status();

// Resolves outstanding device events, then merges every thread's figures: one reading, from
// which both views (by call path, by name) derive.
registry::Snapshot snapshot();
void reset();

// Counters of what the observer could not time (shown in reports, never silently lost). The
// registry's (unbalanced exits, timing failures, capture skips) count since its last reset(),
// as its figures do; the legacy stubs' since the process started.
struct Health {
  uint64_t unbalanced_exits = 0;  // exits with no open brick on the thread (started earlier)
  uint64_t timing_failures = 0;   // a runtime call failed while timing; the brick was dropped
  uint64_t pending_events = 0;    // event pairs recorded but not yet resolved
  int64_t live_events = 0;        // device events the profiler holds (pooled or in use)
  uint64_t capture_skipped = 0;   // bricks skipped: their stream was being captured (CUDA graph)
  uint64_t stub_capture_skipped = 0;  // legacy-profiler records on a capturing stream (no time)
  uint64_t stub_failures = 0;         // legacy-profiler records or elapsed times that failed (no
                                      // device time for that op)
  // Traced timing: work the tracer recorded that no brick queued (outside every brick, or its
  // call never named); records the tracer lost (its buffers full), and bricks not recorded
  // because the tracer delivered none of their work (another CUPTI client took it).
  uint64_t traced_unattributed = 0;
  uint64_t traced_lost = 0;
  // Traced timing: the durations of all the device work the tracer delivered, a brick's or not
  // (what top-level bricks' traced time covers).
  int64_t traced_work_ns = 0;
};
Health health();
// Health::live_events per brick device (empty before the runtime exists): events are made only
// on the devices the profilers record on.
std::vector<int64_t> live_events_by_device();

// ---- ProfilerStubs and the device timeline ------------------------------------------------

// Registers brick's ProfilerStubs with PyTorch (once; the object lives for the process).
void register_profiler_stubs();
// Stub records and elapsed times that failed since the process (or forked child) started.
uint64_t stub_failures() noexcept;
// Whether torch.profiler (Kineto) is profiling with CUPTI now, on CUDA backing (CUPTI serves
// one client).
bool torch_profiler_uses_cupti();
// The process's device timing: what gives the legacy profiler's ops their device time
// (torch.autograd.profiler.profile(use_device="brick"), from its next record() on) and what
// profile() uses where it is not given one. Events until set.
void set_default_device_timing(DeviceTiming timing) noexcept;
DeviceTiming default_device_timing() noexcept;

// StubRecord::device_ns of a record made on a synchronous runtime: the device reached it when it
// was made, at cpu_ns (one clock read per record; no conversion between clocks, so the device
// interval of an op is exactly its span between the two records).
constexpr int64_t kDeviceAtCpuTime = -2;

// One call of ProfilerStubs::record, in call order per thread.
struct StubRecord {
  uint64_t thread;  // at::RecordFunction::currentThreadId() of the recording thread
  int64_t cpu_ns;   // c10::getTime() when recorded (the profiler's time base)
  // When the device reached the event, host steady_clock ns (-1: unknown; kDeviceAtCpuTime: at
  // cpu_ns).
  int64_t device_ns;
  int device;
  int64_t stream;
};

// A mark or a pushed/popped range on brick's own timeline.
struct Annotation {
  std::string name;
  uint64_t thread;
  int64_t start_cpu_ns;  // c10::getTime()
  int64_t end_cpu_ns;    // == start for a mark
  bool is_range;
};

struct TimelineSnapshot {
  std::vector<StubRecord> records;
  std::vector<Annotation> annotations;
  uint64_t dropped_records = 0;  // beyond the log's capacity
  // c10::getTime() minus steady_clock, sampled now, to place device times on the CPU time base.
  int64_t steady_to_cpu_offset_ns = 0;
};
TimelineSnapshot timeline();
void clear_timeline();

// The stubs' annotation entry points, also exposed to Python.
void mark(const char* name);
void range_push(const char* name);
void range_pop();  // throws if the calling thread has no open range

}  // namespace brick::profiler
