// The observer's session: enabling and disabling the callback, the sync mode, the registry it
// records into (its one owner), snapshots and resets, health, the fork handlers, and the probe
// that tells schema-named RecordFunctions from string-named ones.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "profiler/device_timer.h"
#include "profiler/fork.h"
#include "profiler/observer_callback.h"
#include "profiler/observer_state.h"
#include "profiler/profiler.h"
#include "profiler/traced_work.h"
#include "runtime/launch_observer.h"
#include "runtime/runtime.h"
#include "runtime/work_tracer.h"

namespace brick::profiler {

using namespace detail;

namespace {

// Outlives every thread. Replaced (the old one leaked) in a forked child: see after_fork_in_child.
registry::Registry*& registry_instance() {
  static registry::Registry* instance = new registry::Registry();
  return instance;
}

}  // namespace

registry::Registry& brick_registry() { return *registry_instance(); }

// The observer's state (observer_state.h), owned by the session, which sets it up.
constinit ObserverState detail::g_observer;

// In a forked child the registry is replaced rather than reset (its node and shard locks may
// have been held by threads that do not exist there), and this thread's cached nodes of the old
// registry and its open bricks are dropped. Profiling stays as it was: the child's work is
// recorded, into the child's registry.
void prepare_observer_for_fork() { g_observer.control_mutex.lock(); }

void observer_after_fork_in_parent() { g_observer.control_mutex.unlock(); }

void observer_after_fork_in_child() {
  g_observer.control_mutex.unlock();
  registry_instance() = new registry::Registry();
  g_observer.registry.store(registry_instance(), std::memory_order_relaxed);
  g_observer.session.fetch_add(1, std::memory_order_acq_rel);
  g_observer.unbalanced_exits.store(0, std::memory_order_relaxed);
  g_observer.timing_failures.store(0, std::memory_order_relaxed);
  g_observer.capture_skipped_base.store(capture_skipped(TimingClient::Registry),
                                        std::memory_order_relaxed);
  ThreadState* state = tls_state;
  // Other threads' states are gone; a lock another thread held at the fork stays held: renew.
  new (&g_observer.states_mutex) std::mutex();
  // A resolution under way in another thread at the fork: its lock and its correlator (possibly
  // mid-change) are left behind; the child's closed bricks start afresh.
  TracedWork::instance().after_fork_in_child();
  g_observer.states.clear();
  g_observer.exited_closed.clear();
  g_observer.exited_traced_threads.clear();
  if (state != nullptr) {
    g_observer.states.push_back(state);
    new (&state->pending.mutex) std::mutex();
    drop_open_bricks(*state);
    state->session = g_observer.session.load(std::memory_order_relaxed);
    state->by_schema_name.clear();
    state->by_name.clear();
    state->no_work.clear();
    // The parent resolves these pairs; in the child they are dropped, their events reused.
    for (const PendingPair& pair : state->pending.pairs) {
      state->events.release(pair.device, pair.start);
      state->events.release(pair.device, pair.end);
    }
    state->pending.pairs.clear();
    state->pending.size.store(0, std::memory_order_relaxed);
    state->pending.closed.clear();
    state->pending.closed_size.store(0, std::memory_order_relaxed);
    state->published_top.store(registry::kNoParent, std::memory_order_relaxed);
    state->published_interval.store(0, std::memory_order_relaxed);
  }
  runtime::host_work_tracer_after_fork_in_child();
  g_observer.owner.store(g_observer.enabled.load(std::memory_order_relaxed) ? state : nullptr,
                         std::memory_order_relaxed);
}

namespace {

constexpr runtime::KernelTimer kKernelTimer{&on_kernel_begin, &on_kernel_end};

// Called under g_observer.control_mutex by enable(): starts the tracer DeviceTiming::Traced
// uses, or throws saying why there is none.
void start_work_tracer(runtime::Runtime& rt) {
  const SyncMode mode = g_observer.mode.load(std::memory_order_relaxed);
  TORCH_CHECK(mode == SyncMode::Event,
              "brick profiler: traced device timing gives Event mode's device times, but the "
              "sync mode is ",
              registry::sync_mode_name(mode),
              " (which reads the host's clock): use sync_mode='event', or device_timing='events'");
  // CUPTI hands its activity records to one client: inside torch.profiler with CUDA activities
  // (Kineto's CUPTI) brick's records would go to Kineto, or Kineto's to brick.
  TORCH_CHECK(!torch_profiler_uses_cupti(),
              "brick profiler: traced device timing reads CUPTI, which torch.profiler is "
              "using now (CUPTI gives its records to one client): profile with "
              "device_timing='events' inside torch.profiler, or end torch.profiler first");
  discard_traced();
  TracedWork& traced = TracedWork::instance();
  {
    std::lock_guard<std::mutex> lock(traced.lock());
    try {
      traced.acquire(TracedClient::Registry, rt);
    } catch (const std::exception& error) {
      TORCH_CHECK(false, "brick profiler: traced device timing needs the device's work tracer: ",
                  error.what(), " (device_timing='events' times bricks by device events instead)");
    }
    traced.correlator().reset();  // the registry's own: its last profile's bricks are discarded
    traced.attach(&traced.correlator());
    g_observer.traced_bricks_lost = 0;
  }
  g_observer.tracer.store(traced.tracer(), std::memory_order_relaxed);
}

class SchemaDeregistrationListener final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle& /*op*/) override {}
  void onOperatorDeregistered(const c10::OperatorHandle& /*op*/) override {
    g_observer.schema_epoch.fetch_add(1, std::memory_order_relaxed);
  }
};

// Once per process: finds the address overload_name() gives for string-named RecordFunctions
// (two probes, at different addresses, must agree) and starts watching schema deregistrations.
// Called under g_observer.control_mutex.
std::atomic<c10::RegistrationHandleRAII*> g_schema_listener{nullptr};

void prepare_schema_names() {
  static bool prepared = false;
  if (prepared) return;
  prepared = true;
  // A RecordFunction whose before() has not run holds an empty string as its name.
  at::RecordFunction on_stack(at::RecordScope::USER_SCOPE);
  const auto on_heap = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  const char* marker = on_stack.overload_name();
  if (marker != nullptr && marker == on_heap->overload_name() && *marker == '\0') {
    // Never freed (held by g_schema_listener, so still reachable): a deregistration at exit
    // must find it alive.
    g_schema_listener.store(
        new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().addRegistrationListener(
            std::make_unique<SchemaDeregistrationListener>())),
        std::memory_order_release);
    g_observer.string_overload_name.store(marker, std::memory_order_relaxed);
  }
}

}  // namespace

void enable() {
  std::lock_guard<std::mutex> lock(g_observer.control_mutex);
  TORCH_CHECK(!g_observer.enabled.load(), "brick profiler: enable() called while already enabled");
  // The runtime is created (a device initialized) now, not inside the first brick.
  g_observer.runtime.store(&runtime::get(), std::memory_order_relaxed);
  g_observer.async.store(async_runtime(), std::memory_order_relaxed);
  g_observer.registry.store(&brick_registry(), std::memory_order_relaxed);
  prepare_schema_names();
  g_observer.session.fetch_add(1, std::memory_order_acq_rel);
  ThreadState& owner = thread_state();
  drop_open_bricks(owner);
  owner.session = g_observer.session.load(std::memory_order_relaxed);
  owner.published_top.store(registry::kNoParent, std::memory_order_relaxed);
  g_observer.owner.store(&owner, std::memory_order_release);
  const bool traced =
      g_observer.device_timing.load(std::memory_order_relaxed) == DeviceTiming::Traced;
  if (traced) start_work_tracer(*g_observer.runtime.load(std::memory_order_relaxed));
  g_observer.traced.store(traced, std::memory_order_relaxed);
  const bool kernels = g_observer.op_timing.load(std::memory_order_relaxed) == OpTiming::Kernels;
  const bool shapes = record_shapes();  // (never with kernels: set_op_timing refuses both)
  g_observer.shapes_active.store(shapes, std::memory_order_relaxed);
  g_observer.handle =
      at::addGlobalCallback(observer_callback(&on_enter, &on_exit, shapes, !kernels));
  if (kernels) runtime::set_kernel_timer(&kKernelTimer);
  if (!traced && g_observer.async.load(std::memory_order_relaxed) &&
      g_observer.mode.load(std::memory_order_relaxed) == SyncMode::Event) {
    runtime::set_queue_hook(&start_awaiting_bricks);
  }
  g_observer.enabled.store(true, std::memory_order_release);
}

void disable() {
  std::lock_guard<std::mutex> lock(g_observer.control_mutex);
  TORCH_CHECK(g_observer.enabled.load(), "brick profiler: disable() called while not enabled");
  runtime::set_kernel_timer(nullptr);
  at::removeCallback(g_observer.handle);
  g_observer.handle = 0;
  runtime::set_queue_hook(nullptr);
  if (g_observer.traced.load(std::memory_order_relaxed)) {
    g_observer.traced.store(false, std::memory_order_relaxed);
    // Its records stay to drain. (Inside a torch.profiler that started since, CUPTI's activity
    // kinds are Kineto's too: they are left enabled for it.)
    TracedWork& traced = TracedWork::instance();
    std::lock_guard<std::mutex> lock(traced.lock());
    traced.release(TracedClient::Registry, torch_profiler_uses_cupti());
  }
  g_observer.owner.store(nullptr, std::memory_order_release);
  g_observer.enabled.store(false, std::memory_order_release);
}

bool is_enabled() noexcept { return g_observer.enabled.load(std::memory_order_acquire); }

void set_sync_mode(SyncMode mode) {
  std::lock_guard<std::mutex> lock(g_observer.control_mutex);
  TORCH_CHECK(!g_observer.enabled.load(),
              "brick profiler: the sync mode cannot change while profiling (",
              registry::sync_mode_name(g_observer.mode.load()), " is in use); disable() first");
  g_observer.mode.store(mode, std::memory_order_relaxed);
}

SyncMode sync_mode() noexcept { return g_observer.mode.load(std::memory_order_relaxed); }

void set_record_shapes(bool on) {
  std::lock_guard<std::mutex> lock(g_observer.control_mutex);
  TORCH_CHECK(!g_observer.enabled.load(),
              "brick profiler: record_shapes cannot change while profiling; disable() first");
  TORCH_CHECK(!on || g_observer.op_timing.load() == OpTiming::Dispatcher,
              "brick profiler: record_shapes needs ops timed at the dispatcher (their inputs "
              "are RecordFunction's), but ops are timed at brick's kernels");
  g_observer.record_shapes.store(on, std::memory_order_relaxed);
}

bool record_shapes() noexcept { return g_observer.record_shapes.load(std::memory_order_relaxed); }

void set_op_timing(OpTiming timing) {
  std::lock_guard<std::mutex> lock(g_observer.control_mutex);
  TORCH_CHECK(!g_observer.enabled.load(),
              "brick profiler: where ops are timed cannot change while profiling; disable() "
              "first");
  TORCH_CHECK(timing == OpTiming::Dispatcher || !g_observer.record_shapes.load(),
              "brick profiler: ops timed at brick's kernels cannot record shapes (their inputs "
              "are RecordFunction's); set_record_shapes(false) first");
  g_observer.op_timing.store(timing, std::memory_order_relaxed);
}

OpTiming op_timing() noexcept { return g_observer.op_timing.load(std::memory_order_relaxed); }

void set_device_timing(DeviceTiming timing) {
  std::lock_guard<std::mutex> lock(g_observer.control_mutex);
  TORCH_CHECK(!g_observer.enabled.load(),
              "brick profiler: the device timing cannot change while profiling; disable() first");
  g_observer.device_timing.store(timing, std::memory_order_relaxed);
}

DeviceTiming device_timing() noexcept {
  return g_observer.device_timing.load(std::memory_order_relaxed);
}

bool torch_profiler_uses_cupti() {
  if (runtime::get().backing_kind() != runtime::BackingKind::Cuda ||
      !torch::profiler::impl::profilerEnabled()) {
    return false;
  }
  const auto state = torch::profiler::impl::getProfilerConfig().state;
  return state == torch::profiler::impl::ProfilerState::KINETO ||
         state == torch::profiler::impl::ProfilerState::KINETO_ONDEMAND;
}

namespace {
std::atomic<DeviceTiming> g_default_device_timing{DeviceTiming::Events};
}  // namespace

void set_default_device_timing(DeviceTiming timing) noexcept {
  g_default_device_timing.store(timing, std::memory_order_relaxed);
}

DeviceTiming default_device_timing() noexcept {
  return g_default_device_timing.load(std::memory_order_relaxed);
}

std::pair<std::string, std::string> work_tracer_status() {
  std::string why;
  const runtime::WorkTracer* tracer = TracedWork::tracer_for(runtime::get(), &why);
  return tracer != nullptr ? std::make_pair(std::string(tracer->name()), std::string())
                           : std::make_pair(std::string(), why);
}

registry::Snapshot snapshot() {
  // Every closed traced brick, and every thread's outstanding pairs (asynchronous runtimes
  // only), resolve here, waiting for their device work.
  resolve_traced(TracedResolution::Snapshot);
  {
    ThreadState* self = &thread_state();
    std::lock_guard<std::mutex> states(g_observer.states_mutex);
    for (ThreadState* state : g_observer.states) {
      if (state->pending.size.load(std::memory_order_relaxed) == 0) continue;
      std::lock_guard<std::mutex> lock(state->pending.mutex);
      resolve_locked(*state, /*by_owner=*/state == self, /*wait_all=*/true);
    }
  }
  return brick_registry().snapshot();
}

void reset() {
  std::lock_guard<std::mutex> lock(g_observer.control_mutex);
  brick_registry().reset();
  reset_shapes();
  // The registry's own counters start again with its figures: a report (bp.profile resets at
  // its start) says what its profile missed, not what an earlier one in the process did.
  g_observer.unbalanced_exits.store(0, std::memory_order_relaxed);
  g_observer.timing_failures.store(0, std::memory_order_relaxed);
  g_observer.capture_skipped_base.store(capture_skipped(TimingClient::Registry),
                                        std::memory_order_relaxed);
}

Health health() {
  Health h;
  h.unbalanced_exits = g_observer.unbalanced_exits.load(std::memory_order_relaxed);
  h.timing_failures = g_observer.timing_failures.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> states(g_observer.states_mutex);
    for (const ThreadState* state : g_observer.states) {
      h.pending_events += state->pending.size.load(std::memory_order_relaxed) +
                          state->pending.closed_size.load(std::memory_order_relaxed);
    }
  }
  {
    TracedWork& traced = TracedWork::instance();
    std::lock_guard<std::mutex> lock(traced.lock());
    const WorkCorrelator& correlator = traced.correlator();
    h.traced_unattributed = correlator.unattributed();
    h.traced_lost = correlator.dropped_by_tracer() + g_observer.traced_bricks_lost;
    h.traced_work_ns = correlator.traced_ns();
  }
  h.capture_skipped = capture_skipped(TimingClient::Registry) -
                      g_observer.capture_skipped_base.load(std::memory_order_relaxed);
  h.stub_capture_skipped = capture_skipped(TimingClient::LegacyStubs);
  h.stub_failures = stub_failures();
  for (const int64_t events : live_events_by_device()) h.live_events += events;
  return h;
}

std::vector<int64_t> live_events_by_device() {
  // (The device count is asked only of a runtime that exists: none, no event either.)
  const int devices = runtime::runtime_created_in_pid() != -1 ? runtime::get().device_count() : 0;
  std::vector<int64_t> out;
  for (int device = 0; device < devices; ++device) {
    out.push_back(g_live_events[device].load(std::memory_order_relaxed));
  }
  return out;
}

}  // namespace brick::profiler
