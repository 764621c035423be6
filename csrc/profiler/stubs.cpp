// Brick's ProfilerStubs for PyTorch's legacy autograd profiler.
//
// With torch.autograd.profiler.profile(use_device="brick"), PyTorch calls record() at the start
// and end of every op and range it observes and elapsed() on each pair when it builds its
// events. record() logs the call on the device timeline, so a trace can place every op's device
// interval on a per-stream track. On an asynchronous runtime it also puts a pooled timing event
// on the current brick stream; on a synchronous one an op's device work is done when the call
// that issued it returns, so the record's CPU time is its device time and the event handed to
// PyTorch is that time itself, carried in the pointer of a std::shared_ptr that owns nothing.
// Every event also carries the thread's brick work count: an op or range during which the thread
// queued no brick work and allocated no brick memory (a CPU op) gets no device time.
// With traced device timing (set_default_device_timing(Traced)), record() marks the thread's work
// instead (runtime/work_marks.h), the mark carried in the pointer as a time event's is, and
// elapsed() is the work the device traced between the two marks (profiler/traced_work.h): the
// tracer runs from the profile's first record() until its events are read, once it has ended.
// On its common path record() takes no lock and allocates nothing (events, and the shared_ptr
// control blocks that hand them to PyTorch, come from a per-thread pool; the log is the
// thread's own). No exception may escape record(): PyTorch does not catch one there, and it
// would break the op.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "profiler/device_timer.h"
#include "profiler/fork.h"
#include "profiler/profiler.h"
#include "profiler/stub_event_pool.h"
#include "profiler/timeline.h"
#include "profiler/traced_work.h"
#include "runtime/launch_observer.h"
#include "runtime/runtime.h"
#include "runtime/work_marks.h"

namespace brick::profiler {

namespace {

// What PyTorch holds for one record() on an asynchronous runtime: the pooled event, the thread's
// brick work count then and, while its device time was not known at record(), where the
// timeline awaits it.
struct StubEvent {
  StubSlot* slot;
  TimelineLog::Handle pending;
  uint64_t work;

  StubEvent(StubSlot* s, TimelineLog::Handle p, uint64_t w) noexcept
      : slot(s), pending(p), work(w) {}
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

std::atomic<uint64_t> g_stub_failures{0};  // records and elapsed times that failed

// A synchronous runtime's stub event: the record's time and the thread's brick work count
// (runtime::device_work_seen()) packed into the pointer of a shared_ptr made by the aliasing
// constructor over an empty owner. It has no control block (use_count() 0), so making, copying
// and dropping it touch no memory; PyTorch only tests it for null and hands it back to
// elapsed(). Both are kept modulo a power of two, which elapsed() only subtracts: exact for an
// op or range shorter than 2^44 ns (4.8 hours) in which the count moved by other than a multiple
// of 2^19. The top bit keeps the pointer non-null.
constexpr int kWorkBits = 19;
constexpr int kTimeBits = 44;
constexpr uint64_t kWorkMask = (uint64_t{1} << kWorkBits) - 1;
constexpr uint64_t kTimeMask = (uint64_t{1} << kTimeBits) - 1;
constexpr uint64_t kTimeEventMarker = uint64_t{1} << 63;
static_assert(kWorkBits + kTimeBits < 64);

torch::profiler::impl::ProfilerVoidEventStub time_as_event(int64_t cpu_ns, uint64_t work) noexcept {
  const uint64_t packed = kTimeEventMarker |
                          ((static_cast<uint64_t>(cpu_ns) & kTimeMask) << kWorkBits) |
                          (work & kWorkMask);
  return {std::shared_ptr<void>(), reinterpret_cast<void*>(static_cast<uintptr_t>(packed))};
}

bool is_time_event(const torch::profiler::impl::ProfilerVoidEventStub& event) noexcept {
  return event.use_count() == 0;  // a pooled StubEvent always has an owner
}

uint64_t packed_of(const torch::profiler::impl::ProfilerVoidEventStub& event) noexcept {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(event.get()));
}

// The microseconds between two time events; 0 when the thread ran no brick work between them
// (a CPU op: no device time, as CUDA's stubs give a CPU op).
float time_events_elapsed_us(uint64_t start, uint64_t end) noexcept {
  if ((start & kWorkMask) == (end & kWorkMask)) return 0.0f;
  const uint64_t ns = ((end >> kWorkBits) - (start >> kWorkBits)) & kTimeMask;
  return static_cast<float>(static_cast<double>(ns) / 1000.0);
}

// Traced events: a work mark (the thread's number above kSegmentBits, the segment below, the top
// bit set) in the pointer of a shared_ptr that shares the ownership of its profile's
// StubSession. A pooled StubEvent's pointer is a real address (top bit clear); a time event has
// no owner.
bool is_traced_event(const torch::profiler::impl::ProfilerVoidEventStub& event) noexcept {
  return event.use_count() != 0 && (packed_of(event) & kTimeEventMarker) != 0;
}

WorkMark mark_of(uint64_t packed) noexcept {
  return {static_cast<uint32_t>((packed & ~kTimeEventMarker) >> kSegmentBits),
          packed & kSegmentMask};
}

// One legacy profile's traced timing: its own correlator, handed what the tracer delivers while
// the profile records and once more when it has ended, kept while PyTorch holds any of its
// events (they own it). All of it under TracedWork's lock.
struct StubSession {
  WorkCorrelator correlator;
  const void* profile = nullptr;  // the profiler state it records for (identity only)
  bool recording = true;
  bool lost = false;  // its records went to another client of CUPTI, or could not be read
};

// The session recording now and every live one (TracedWork's lock); kept for the process, since
// threads may record during exit. `g_recording_now` says which records without the lock.
struct StubSessions {
  std::shared_ptr<StubSession> recording;
  std::vector<std::weak_ptr<StubSession>> all;
};
StubSessions& stub_sessions() {
  static StubSessions* const kept = new StubSessions();
  return *kept;
}
std::atomic<StubSession*> g_recording_now{nullptr};
// A thread's session, as it last joined it (lock-free while it is the one recording).
thread_local std::weak_ptr<StubSession> tls_session;
thread_local StubSession* tls_session_raw = nullptr;

// Under TracedWork's lock: `session` records no more; the last reading has been handed to it.
void end_stub_session(TracedWork& traced, StubSession& session) noexcept {
  if (!session.recording) return;
  session.recording = false;
  traced.detach(&session.correlator);
  bool keep_kinds = false;
  try {
    keep_kinds = torch_profiler_uses_cupti();
  } catch (...) {
  }
  traced.release(TracedClient::LegacyStubs, keep_kinds);
  StubSessions& sessions = stub_sessions();
  if (sessions.recording.get() == &session) {
    sessions.recording.reset();
    g_recording_now.store(nullptr, std::memory_order_release);
  }
}

// Under TracedWork's lock: waits for the devices and hands `session` what the tracer has. (On a
// device, work is in flight until no profile traces.) A reading that fails loses the session.
void settle_stub_session(TracedWork& traced, StubSession& session, bool ended) {
  session.lost = true;
  const bool delivered = traced.settle(runtime::get());
  session.correlator.settle(/*all_delivered=*/!async_runtime() ||
                            (ended && !traced.holds(TracedClient::Registry)));
  session.lost = !delivered;
}

// The session a traced record() joins, starting one at a profile's first traced record (an
// earlier one still recording for another profile, never read, ends first): nullptr (counted by
// the caller) where none can start, and the records go on as events.
std::shared_ptr<StubSession> join_stub_session(runtime::Runtime& rt) {
  StubSession* const now = g_recording_now.load(std::memory_order_acquire);
  if (now != nullptr && now == tls_session_raw) {
    if (std::shared_ptr<StubSession> mine = tls_session.lock()) return mine;
  }
  TracedWork& traced = TracedWork::instance();
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(traced.lock());
    StubSessions& sessions = stub_sessions();
    // The profiler's state object, as PyTorch keeps it for the thread (every release has it
    // there; ProfilerStateBase's own accessor changed name).
    const void* profile = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
    if (sessions.recording != nullptr && sessions.recording->profile != profile) {
      StubSession& old = *sessions.recording;
      try {
        settle_stub_session(traced, old, /*ended=*/true);
      } catch (...) {  // (lost: its readings fail, counted)
      }
      end_stub_session(traced, old);
    }
    if (sessions.recording == nullptr) {
      if (profile == nullptr) return nullptr;  // a record after its profile ended
      try {
        if (torch_profiler_uses_cupti()) {
          throw runtime::Error("torch.profiler is using CUPTI (it serves one client)");
        }
        auto session = std::make_shared<StubSession>();
        session->profile = profile;
        std::erase_if(sessions.all,
                      [](const std::weak_ptr<StubSession>& old) { return old.expired(); });
        sessions.all.reserve(sessions.all.size() + 1);
        traced.acquire(TracedClient::LegacyStubs, rt);
        traced.attach(&session->correlator);  // (the last that can throw: no undoing needed)
        sessions.all.push_back(session);
        sessions.recording = std::move(session);
        g_recording_now.store(sessions.recording.get(), std::memory_order_release);
      } catch (const std::exception& error) {
        traced.release(TracedClient::LegacyStubs, /*keep_kinds=*/false);  // (if it was taken)
        refused = error.what();
      }
    }
    if (refused.empty()) {
      tls_session = sessions.recording;
      tls_session_raw = sessions.recording.get();
      return sessions.recording;
    }
  }
  TORCH_WARN_ONCE("brick: the legacy profiler's traced device timing could not start (", refused,
                  "): its ops are timed by device events");
  return nullptr;
}

// Under TracedWork's lock: the live session that owns `event` (nullptr: none).
std::shared_ptr<StubSession> owner_of(const torch::profiler::impl::ProfilerVoidEventStub& event) {
  for (const std::weak_ptr<StubSession>& weak : stub_sessions().all) {
    if (!event.owner_before(weak) && !weak.owner_before(event)) return weak.lock();
  }
  return nullptr;
}

// The device time between two traced events of one profile, in us. A profile still recording is
// brought up to date first; once no profile records (PyTorch reads the events after it has
// ended), that last reading waits for the devices and leaves the tracer.
float traced_elapsed_us(const torch::profiler::impl::ProfilerVoidEventStub& start,
                        const torch::profiler::impl::ProfilerVoidEventStub& end) {
  TracedWork& traced = TracedWork::instance();
  std::lock_guard<std::mutex> lock(traced.lock());
  const std::shared_ptr<StubSession> session = owner_of(start);
  if (session == nullptr || session != owner_of(end)) {
    throw runtime::Error("the two records are of different profiles");
  }
  if (session->recording) {
    const bool ended = !torch::profiler::impl::profilerEnabled();
    // Ended whatever the reading gives (a device that failed must not keep the tracer running).
    struct EndIfEnded {
      TracedWork& traced;
      StubSession& session;
      bool ended;
      ~EndIfEnded() {
        if (ended) end_stub_session(traced, session);
      }
    } end_if_ended{traced, *session, ended};
    settle_stub_session(traced, *session, ended);
  }
  // Another client of CUPTI took the records: every op of the profile is lost, not 0.
  if (session->lost) throw runtime::Error("the profile's traced records were lost");
  const WorkSum sum =
      session->correlator.between(mark_of(packed_of(start)), mark_of(packed_of(end)));
  return static_cast<float>(static_cast<double>(sum.ns) / 1000.0);
}

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
      if (default_device_timing() == DeviceTiming::Traced) [[unlikely]] {
        if (record_traced(rt, index, event, cpu_ns)) return;
      }
      if (!async_runtime()) {
        const int64_t now = c10::getTime();
        if (cpu_ns != nullptr) *cpu_ns = now;
        process_timeline().append(
            StubRecord{at::RecordFunction::currentThreadId(), now, kDeviceAtCpuTime, index, stream},
            nullptr);
        if (event != nullptr) *event = time_as_event(now, runtime::device_work_seen());
        return;
      }
      if (skip_in_capture(rt, index, stream, TimingClient::LegacyStubs)) [[unlikely]] {
        // Nothing is timed on a capturing stream: the op gets no device time.
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
                                                  runtime::device_work_seen());
      if (event != nullptr) *event = std::move(stub);
    } catch (...) {
      g_stub_failures.fetch_add(1, std::memory_order_relaxed);
      if (event != nullptr) event->reset();
      if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    }
  }

  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) return 0.0f;
    const bool timed = is_time_event(*start);
    const bool traced = is_traced_event(*start);
    if (timed != is_time_event(*end) || traced != is_traced_event(*end)) {
      g_stub_failures.fetch_add(1, std::memory_order_relaxed);  // the timing changed inside the op
      return 0.0f;
    }
    if (timed) return time_events_elapsed_us(packed_of(*start), packed_of(*end));
    if (traced) {
      try {
        return traced_elapsed_us(*start, *end);
      } catch (...) {  // the devices or the tracer failed, or its records went to another client
        g_stub_failures.fetch_add(1, std::memory_order_relaxed);
        return 0.0f;
      }
    }
    // No exception may escape: PyTorch calls this while building the profile's events, where
    // one would lose the user's whole profile. A failure gives the op no device time, counted.
    try {
      auto* a = static_cast<StubEvent*>(start->get());
      auto* b = static_cast<StubEvent*>(end->get());
      if (a->work == b->work) return 0.0f;  // the thread ran no brick work in between
      auto& rt = runtime::get();
      rt.synchronize_event(a->slot->event);
      rt.synchronize_event(b->slot->event);
      if (a->slot->device == b->slot->device) {
        return static_cast<float>(rt.elapsed_ms(a->slot->event, b->slot->event) * 1000.0);  // us
      }
      // An op whose current device changed between its records (the runtime times only pairs
      // on one device): both events placed on the host clock.
      const int64_t a_ns = rt.event_host_time_ns(a->slot->event);
      const int64_t b_ns = rt.event_host_time_ns(b->slot->event);
      if (a_ns >= 0 && b_ns >= a_ns)
        return static_cast<float>(static_cast<double>(b_ns - a_ns) / 1000.0);
    } catch (...) {
    }
    g_stub_failures.fetch_add(1, std::memory_order_relaxed);
    return 0.0f;
  }

  void mark(const char* name) const override { brick::profiler::mark(name); }
  void rangePush(const char* name) const override { brick::profiler::range_push(name); }
  void rangePop() const override {
    if (has_open_range()) brick::profiler::range_pop();
  }

  bool enabled() const override { return true; }

 private:
  // A traced record(): the thread's work marked now. False where the stubs cannot trace (the
  // record goes on as an event).
  static bool record_traced(runtime::Runtime& rt, int index,
                            torch::profiler::impl::ProfilerVoidEventStub* event, int64_t* cpu_ns) {
    std::shared_ptr<StubSession> session = join_stub_session(rt);
    runtime::WorkTracer* tracer = TracedWork::instance().tracer();
    if (session == nullptr || tracer == nullptr) {
      g_stub_failures.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    TracedWork::instance().note_device(index);
    const WorkMark mark = runtime::mark_work(*tracer);
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    if (mark.thread == 0) {  // beyond the threads marks can name
      g_stub_failures.fetch_add(1, std::memory_order_relaxed);
      if (event != nullptr) event->reset();
      return true;
    }
    const uint64_t packed = kTimeEventMarker | uint64_t{mark.thread} << kSegmentBits | mark.segment;
    if (event != nullptr) {
      *event = std::shared_ptr<void>(std::move(session),
                                     reinterpret_cast<void*>(static_cast<uintptr_t>(packed)));
    }
    return true;
  }

 public:
  // Both leave alone the devices this process has not used: on CUDA backing, making a GPU
  // current (or synchronizing it) creates its context (~0.5 GB per GPU and rank under
  // torchrun). The hooks answer: always used on the host, CUDA's primary context on CUDA.
  void onEachDevice(std::function<void(int)> op) const override {
    const int count = runtime::get().device_count();
    for (int index = 0; index < count; ++index) {
      if (!device_in_use(index)) continue;
      c10::DeviceGuard guard(
          c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
      op(index);
    }
  }

  void synchronize() const override {
    auto& rt = runtime::get();
    for (int index = 0; index < rt.device_count(); ++index) {
      if (device_in_use(index)) rt.synchronize_device(index);
    }
  }

 private:
  static bool device_in_use(int index) {
    return at::detail::getPrivateUse1Hooks().hasPrimaryContext(
        static_cast<c10::DeviceIndex>(index));
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

void stubs_after_fork_in_child() {
  g_stub_failures.store(0, std::memory_order_relaxed);
  // The parent's profiles (the traced timer forgot their client): read as they are, never
  // settled or ended in the child.
  StubSessions& sessions = stub_sessions();
  for (const std::weak_ptr<StubSession>& weak : sessions.all) {
    if (const std::shared_ptr<StubSession> session = weak.lock()) session->recording = false;
  }
  sessions.recording.reset();
  g_recording_now.store(nullptr, std::memory_order_relaxed);
}

uint64_t stub_failures() noexcept { return g_stub_failures.load(std::memory_order_relaxed); }

}  // namespace brick::profiler
