// Brick's ProfilerStubs for PyTorch's legacy autograd profiler.
//
// With torch.autograd.profiler.profile(use_device="brick"), PyTorch calls record() at the start
// and end of every op and range it observes and elapsed() on each pair when it builds its
// events. record() puts a pooled timing event on the current brick stream and logs the call on
// the device timeline, so a trace can place every op's device interval on a per-stream track; on
// its common path it takes no lock and allocates nothing (the event, and the std::shared_ptr
// that hands it to PyTorch, come from a per-thread pool; the log is the thread's own). No
// exception may escape record(): PyTorch does not catch one there, and it would break the op.
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <new>

#include "profiler/event_pool.h"
#include "profiler/fork.h"
#include "profiler/profiler.h"
#include "profiler/stub_event_pool.h"
#include "profiler/timeline.h"
#include "runtime/runtime.h"

namespace brick::profiler {

namespace {

// What PyTorch holds for one record(): the pooled event and, while its device time was not
// known at record(), where the timeline awaits it.
struct StubEvent {
  StubSlot* slot;
  TimelineLog::Handle pending;
  // On a synchronous runtime, when the record was made (c10::getTime()); the slot's event is
  // then unused. -1 on an asynchronous one.
  int64_t recorded_cpu_ns;

  StubEvent(StubSlot* s, TimelineLog::Handle p, int64_t cpu_ns) noexcept
      : slot(s), pending(p), recorded_cpu_ns(cpu_ns) {}
  StubEvent(const StubEvent&) = delete;
  StubEvent& operator=(const StubEvent&) = delete;
  // Runs before the slot (its event included) goes back to the pool for reuse.
  ~StubEvent() { process_timeline().resolve(pending, slot->event); }
};

// Places the shared_ptr's control block, with its StubEvent, in the slot's storage; freeing it
// gives the slot back to the pool (on whichever thread PyTorch drops the last reference).
template <typename T>
struct SlotAllocator {
  using value_type = T;
  StubSlot* slot;

  explicit SlotAllocator(StubSlot* s) noexcept : slot(s) {}
  template <typename U>
  SlotAllocator(const SlotAllocator<U>& other) noexcept : slot(other.slot) {}

  T* allocate(size_t n) {
    static_assert(sizeof(T) <= StubSlot::kStorageBytes && alignof(T) <= alignof(std::max_align_t),
                  "the shared_ptr's control block does not fit a StubSlot: raise kStorageBytes");
    if (n != 1) throw std::bad_alloc();
    return reinterpret_cast<T*>(slot->storage);
  }
  void deallocate(T* /*block*/, size_t /*n*/) noexcept { release_stub_slot(slot); }

  template <typename U>
  bool operator==(const SlotAllocator<U>& other) const noexcept {
    return slot == other.slot;
  }
};

std::atomic<uint64_t> g_record_failures{0};

class BrickProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    try {
      // The stamp is taken as early as possible: PyTorch reads the op's CPU end time right
      // before an end record, and its start time right after a start record.
      auto& rt = runtime::get();
      const int index = rt.current_device();
      const runtime::StreamId stream = rt.current_stream(index);
      if (device != nullptr) *device = static_cast<c10::DeviceIndex>(index);
      if (!async_runtime()) {
        StubSlot* slot = acquire_stub_slot(index);
        const int64_t now = c10::getTime();
        if (cpu_ns != nullptr) *cpu_ns = now;
        process_timeline().append(
            StubRecord{at::RecordFunction::currentThreadId(), now, kDeviceAtCpuTime, index, stream},
            nullptr);
        auto stub = std::allocate_shared<StubEvent>(SlotAllocator<StubEvent>(slot), slot,
                                                    TimelineLog::Handle{}, now);
        if (event != nullptr) *event = std::move(stub);
        return;
      }
      if (rt.is_capturing(index, stream)) [[unlikely]] {
        // Nothing may be recorded on a capturing stream: the op gets no device time.
        g_capture_skipped.fetch_add(1, std::memory_order_relaxed);
        if (event != nullptr) event->reset();
        if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
        return;
      }
      StubSlot* slot = acquire_stub_slot(index);
      int64_t now = 0;
      int64_t device_ns = -1;
      try {
        rt.record_event(slot->event, index, stream);
        now = c10::getTime();
        // Known at once on the host runtime with deferred completion only once it completes.
        device_ns = rt.event_host_time_ns(slot->event);
      } catch (...) {
        release_stub_slot(slot);
        throw;
      }
      if (cpu_ns != nullptr) *cpu_ns = now;
      const TimelineLog::Handle logged = process_timeline().append(
          StubRecord{at::RecordFunction::currentThreadId(), now, device_ns, index, stream},
          device_ns < 0 ? slot->event : nullptr);
      auto stub = std::allocate_shared<StubEvent>(SlotAllocator<StubEvent>(slot), slot,
                                                  device_ns < 0 ? logged : TimelineLog::Handle{},
                                                  int64_t{-1});
      if (event != nullptr) *event = std::move(stub);
    } catch (...) {
      g_record_failures.fetch_add(1, std::memory_order_relaxed);
      if (event != nullptr) event->reset();
      if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    }
  }

  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) return 0.0f;
    auto* a = static_cast<StubEvent*>(start->get());
    auto* b = static_cast<StubEvent*>(end->get());
    if (a->recorded_cpu_ns >= 0 && b->recorded_cpu_ns >= 0) {  // a synchronous runtime
      return static_cast<float>(static_cast<double>(b->recorded_cpu_ns - a->recorded_cpu_ns) /
                                1000.0);  // us
    }
    auto& rt = runtime::get();
    rt.synchronize_event(a->slot->event);
    rt.synchronize_event(b->slot->event);
    return static_cast<float>(rt.elapsed_ms(a->slot->event, b->slot->event) * 1000.0);  // us
  }

  void mark(const char* name) const override { brick::profiler::mark(name); }
  void rangePush(const char* name) const override { brick::profiler::range_push(name); }
  void rangePop() const override {
    if (has_open_range()) brick::profiler::range_pop();
  }

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    const int count = runtime::get().device_count();
    for (int index = 0; index < count; ++index) {
      c10::DeviceGuard guard(
          c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
      op(index);
    }
  }

  void synchronize() const override {
    auto& rt = runtime::get();
    for (int index = 0; index < rt.device_count(); ++index) rt.synchronize_device(index);
  }
};

}  // namespace

void register_profiler_stubs() {
  static BrickProfilerStubs* stubs = [] {
    // The event pool fills itself when first used (the first record(), at the start of a
    // profile): touching the runtime here would create it at import.
    auto* instance = new BrickProfilerStubs();  // PyTorch keeps the raw pointer for the process
    torch::profiler::impl::registerPrivateUse1Methods(instance);
    return instance;
  }();
  (void)stubs;
}

void stubs_after_fork_in_child() { g_record_failures.store(0, std::memory_order_relaxed); }

}  // namespace brick::profiler
