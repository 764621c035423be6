// The observer's state, shared by its three parts (internal to csrc/profiler): the hot path
// (observer.cpp: the RecordFunction callbacks and the node caches), the asynchronous timing
// (observer_events.cpp: device events, the pending pairs and their resolution, the queue hook)
// and the session (observer_session.cpp: enable/disable, the registry's owner, fork, health).
// Hidden from other modules, so the hot path reads the state's members as it would file-local
// globals: one object at a fixed address, each member a fixed offset from it.
#pragma once

#include <ATen/record_function.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/chunked_log.h"
#include "profiler/device_timer.h"
#include "profiler/profiler.h"
#include "profiler/shape_table.h"
#include "profiler/work_correlator.h"
#include "registry/registry.h"
#include "runtime/runtime.h"
#include "runtime/work_tracer.h"

namespace brick::profiler::detail {

#pragma GCC visibility push(hidden)

using registry::NodeId;
using registry::SyncMode;

constexpr NodeId kIgnored = UINT32_MAX - 1;  // profiler-internal ops are not bricks
// A brick that began while its stream was being captured into a CUDA graph: nothing may be
// recorded on such a stream, and the work it launches runs only at replay, so it is skipped
// (and counted: health().capture_skipped).
constexpr NodeId kSkippedInCapture = UINT32_MAX - 2;

struct ThreadState;

// The observer's state, one object for the process (g_observer, defined by the session in
// observer_session.cpp). Its members are what every part reads; the per-thread part is each
// thread's ThreadState. The members the op path reads come first.
struct ObserverState {
  std::atomic<bool> enabled{false};
  // bumped by enable: per-thread stacks from older sessions are dropped
  std::atomic<uint64_t> session{0};
  // Bumped whenever an operator schema is deregistered: its name's address may then be reused
  // by another schema's name, so every thread's node cache keyed by those addresses is flushed.
  std::atomic<uint64_t> schema_epoch{0};
  // What the callbacks need, set by enable() before the callback is registered (and by the fork
  // handler): no function-local static guard or lookup on the op path.
  std::atomic<runtime::Runtime*> runtime{nullptr};
  std::atomic<registry::Registry*> registry{nullptr};
  std::atomic<bool> async{false};          // async_runtime(): bricks are timed by device events
  std::atomic<bool> shapes_active{false};  // the running profile records shapes
  std::atomic<SyncMode> mode{SyncMode::Event};
  // What RecordFunction::overload_name() returns for a RecordFunction named by a string (a
  // record_function range, an autograd node) rather than by an operator schema: the address of
  // one constant empty string, found by probing at enable(). A different address means the name
  // is a schema's. nullptr when the probe did not find one constant: every name is then looked
  // up by its text.
  std::atomic<const char*> string_overload_name{nullptr};
  // The thread that enabled profiling: backward work that PyTorch's autograd engine runs on its
  // device threads is attributed to the brick open on this thread (the one waiting in
  // backward()).
  std::atomic<ThreadState*> owner{nullptr};

  std::atomic<uint64_t> unbalanced_exits{0};
  std::atomic<uint64_t> timing_failures{0};
  std::atomic<uint64_t> capture_skipped_base{0};  // not reported: before reset(), or a parent's

  std::mutex control_mutex;  // enable / disable / set_sync_mode / reset
  at::CallbackHandle handle = 0;
  std::atomic<bool> record_shapes{false};  // the setting: profiles enabled from now on
  std::atomic<OpTiming> op_timing{
      OpTiming::Dispatcher};  // the setting: profiles enabled from now on
  std::atomic<DeviceTiming> device_timing{DeviceTiming::Events};  // the setting

  // Traced timing (DeviceTiming::Traced, observer_traced.cpp, over profiler/traced_work.h).
  // `traced`: the running profile uses it; `tracer`: the tracer its marks go to, kept after the
  // profile (a brick open across disable() still closes its marks).
  std::atomic<bool> traced{false};
  std::atomic<runtime::WorkTracer*> tracer{nullptr};
  std::atomic<uint64_t> next_interval{1};  // brick ids: nested ones open later, larger
  // Bricks whose work another client of CUPTI took (TracedWork::settle): lost, not recorded as
  // 0. Guarded by TracedWork's lock.
  uint64_t traced_bricks_lost = 0;

  // Every live thread's state, so snapshot() can resolve the pairs each thread still owes.
  std::mutex states_mutex;
  std::vector<ThreadState*> states;
  // Closed traced bricks of threads that have exited, for the next resolution, and those
  // threads' work-mark numbers, whose segments it then forgets (states_mutex).
  std::vector<ClosedInterval> exited_closed;
  std::vector<uint32_t> exited_traced_threads;
};

extern constinit ObserverState g_observer;

struct Frame {
  NodeId node;
  int device;
  int64_t start_ns;             // Deferred / Immediate
  runtime::Event* start_event;  // Event
  // Event mode on an asynchronous runtime, an op: its start event is recorded right before the
  // first work it queues (start_awaiting_bricks), on that work's device; none yet.
  bool awaiting_work = false;
  bool is_op = false;         // an op (scope FUNCTION), not a range or an autograd node
  uint32_t shape = kNoShape;  // its signature, while the profile records shapes
  // An op: the thread's brick work count (runtime::device_work_seen()) when it opened. Its
  // start_ns is then read on every runtime and mode: the host time of an op that ran none.
  uint64_t work_at_open = 0;
  // Traced timing: this brick's id (0: not traced), the one it opened in (another thread's:
  // `parent_elsewhere`) and its thread's work mark at its open.
  uint64_t interval = 0;
  uint64_t parent_interval = 0;
  WorkMark open_mark;
  bool parent_elsewhere = false;
  // An op that opened inside an op that had already run brick work: part of that work (brick's
  // kernels run the backing device's ops, e.g. a CPU aten::copy_ inside brick's aten::addmm),
  // timed as an op whatever it queued.
  bool inside_device_work = false;
};

// What an op that ran no brick work did, judged once per node from its schema (see
// record_without_device_work in observer.cpp); Opaque: named by text, no schema to judge.
enum class NoWorkClass : uint8_t { Unknown, Metadata, HostWork, Opaque };

// Per node, the observer's memo for calls that ran no brick work.
struct NoWorkInfo {
  NoWorkClass kind = NoWorkClass::Unknown;
  NodeId host_twin = registry::kNoParent;  // the node's Kind::Host twin, once interned
};

// Finished event pairs whose device work may still be running (asynchronous runtimes).
struct PendingPair {
  NodeId node;
  int device;
  runtime::StreamId stream;  // of its end event
  runtime::Event* start;
  runtime::Event* end;
  uint32_t shape;
};

// Records one completed call of a brick: in the registry, and per signature while the profile
// records shapes.
inline void record_brick(registry::Registry& registry, NodeId node, uint32_t shape, int64_t ns,
                         int64_t end_ns) noexcept {
  registry.record(node, ns, end_ns);
  if (shape != kNoShape && !record_shape(node, shape, ns)) [[unlikely]]
    g_observer.timing_failures.fetch_add(1, std::memory_order_relaxed);
}

struct NameKey {
  NodeId parent;
  int device;
  std::string name;
  bool operator==(const NameKey& other) const = default;
};

struct NameKeyView {
  NodeId parent;
  int device;
  std::string_view name;
};

struct NameKeyHash {
  using is_transparent = void;
  size_t operator()(const NameKey& key) const noexcept {
    return hash(key.parent, key.device, key.name);
  }
  size_t operator()(const NameKeyView& key) const noexcept {
    return hash(key.parent, key.device, key.name);
  }
  static size_t hash(NodeId parent, int device, std::string_view name) noexcept {
    return (std::hash<std::string_view>{}(name)*31 + parent) * 31 + static_cast<size_t>(device);
  }
};

struct NameKeyEqual {
  using is_transparent = void;
  bool operator()(const NameKey& a, const NameKey& b) const noexcept { return a == b; }
  bool operator()(const NameKeyView& a, const NameKey& b) const noexcept {
    return a.parent == b.parent && a.device == b.device && a.name == b.name;
  }
  bool operator()(const NameKey& a, const NameKeyView& b) const noexcept {
    return a.parent == b.parent && a.device == b.device && a.name == b.name;
  }
};

// A direct-mapped cache of the nodes of schema-named calls: (name address, parent, device) ->
// node. A miss (a new call site, or a collision) looks the node up by text and takes the slot.
class SchemaNodeCache {
 public:
  static constexpr size_t kBits = 10;  // 1024 slots: a decode step's call sites fit

  // The node cached for this call site, or kNoNode.
  NodeId find(const char* name, NodeId parent, int device) const noexcept {
    const Entry& entry = entries_[index(name, parent, device)];
    return entry.name == name && entry.parent == parent && entry.device == device ? entry.node
                                                                                  : kNoNode;
  }
  void put(const char* name, NodeId parent, int device, NodeId node) noexcept {
    entries_[index(name, parent, device)] = {name, parent, device, node};
  }
  void clear() noexcept { entries_.fill(Entry{}); }

  static constexpr NodeId kNoNode = registry::kNoParent;

 private:
  struct Entry {
    const char* name = nullptr;
    NodeId parent = 0;
    int device = 0;
    NodeId node = kNoNode;
  };
  static size_t index(const char* name, NodeId parent, int device) noexcept {
    // Fibonacci hashing of the three integers: two multiplies, no text.
    constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
    const uint64_t key = reinterpret_cast<uintptr_t>(name) ^
                         ((uint64_t{parent} << 8 | static_cast<uint8_t>(device)) * kGolden);
    return static_cast<size_t>((key * kGolden) >> (64 - kBits));
  }
  std::array<Entry, size_t{1} << kBits> entries_{};
};

// Finished event pairs whose device work may still be running. Only an asynchronous runtime
// queues any (on the host every pair has completed when its brick ends), and only that path
// takes the lock: snapshot() resolves every thread's queue, so it must see them all.
struct PendingQueue {
  std::mutex mutex;
  std::deque<PendingPair> pairs;  // oldest first: streams complete their work in order
  // Events of pairs resolved by another thread (snapshot), for the owner's pool.
  std::vector<std::pair<int, runtime::Event*>> returned;
  std::atomic<size_t> size{0};  // pairs.size(), readable without the lock
  std::atomic<bool> has_returned{false};
  // Traced timing: closed bricks whose work the tracer may still deliver.
  ChunkedLog<ClosedInterval> closed;
  std::atomic<size_t> closed_size{0};
};

struct ThreadState {
  uint64_t session = 0;
  uint64_t schema_epoch = 0;  // of by_schema_name's entries
  std::vector<Frame> stack;
  PendingQueue pending;
  // Ops named by their schema: looked up by the name's address.
  SchemaNodeCache by_schema_name;
  // Everything else (record_function ranges, autograd nodes, per-call op names) by text.
  std::unordered_map<NameKey, NodeId, NameKeyHash, NameKeyEqual> by_name;
  // Indexed by node: grown on the first call of a node that ran no brick work.
  std::vector<NoWorkInfo> no_work;
  // The innermost open brick, readable by other threads (see on_enter: autograd workers).
  std::atomic<NodeId> published_top{registry::kNoParent};
  std::atomic<uint64_t> published_interval{0};  // its interval (traced timing)
  // Traced timing: segment_interval() of a mark no mark of this thread's open bricks, nor any it
  // makes later, is below (its outermost open brick's open mark, or the mark its last outermost
  // brick closed at); 0: none yet. What a resolution may fold below.
  std::atomic<uint64_t> traced_floor{0};
  EventPool events;
  // This thread opened an autograd node while another thread owned the profile: it is one of
  // the autograd engine's threads, whose kernels outside any brick are that backward's work.
  bool runs_autograd_nodes = false;
  uint32_t unpushed = 0;  // enters whose frame could not be pushed (out of memory)
  bool marking = false;   // traced timing: it has marked its work since its stack was empty
  uint32_t awaiting = 0;  // frames on the stack with awaiting_work set
  // Event mode: the end event of the op that ended last on this thread, held (one reference)
  // while this thread has queued no work since: an enclosing op that ends now ends at the same
  // point of the stream, and shares it instead of recording another (nested ops: aten::linear
  // around aten::addmm). Forgotten at the next queue hook.
  struct {
    runtime::Event* event = nullptr;
    int device = 0;
    runtime::StreamId stream = 0;
  } last_op_end;
};

// Drops the thread's hold on the end event of the op that ended last (work was queued since).
inline void forget_last_op_end(ThreadState& state) {
  if (state.last_op_end.event == nullptr) return;
  state.events.release(state.last_op_end.device, state.last_op_end.event);
  state.last_op_end.event = nullptr;
}

// The calling thread's state: initial-exec, a direct %fs access even inside a dlopen()ed module.
[[gnu::tls_model("initial-exec")]] extern constinit thread_local ThreadState* tls_state;

[[gnu::noinline]] ThreadState& create_thread_state();

// The calling thread's state, made on its first brick.
inline ThreadState& thread_state() {
  ThreadState* state = tls_state;
  if (state != nullptr) [[likely]]
    return *state;
  return create_thread_state();
}

// ---- the hot path (observer.cpp) ----
void drop_open_bricks(ThreadState& state);
std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn);
void on_exit(const at::RecordFunction& fn, at::ObserverContext* ctx);
// The kernel timer's pair (OpTiming::Kernels: runtime::KernelTimer).
void on_kernel_begin(const char* name) noexcept;
void on_kernel_end() noexcept;

// ---- asynchronous timing (observer_events.cpp) ----
void resolve_locked(ThreadState& state, bool by_owner, bool wait_all);
runtime::Event* acquire_event(ThreadState& state, int device);
void start_async_timing(ThreadState& state, runtime::Runtime& rt, Frame& frame, bool is_op);
void finish_async_timing(ThreadState& state, runtime::Runtime& rt, const Frame& frame);
void start_awaiting_bricks(runtime::DeviceIndex device) noexcept;

// ---- traced timing (observer_traced.cpp) ----
void start_traced_timing(runtime::Runtime& rt, ThreadState& state, Frame& frame,
                         uint64_t parent_interval, bool parent_elsewhere);
// Marks the calling thread's work where a brick closed (state.marking). Where its stack is now
// empty, the mark is its next floor: publish_traced_floor() once every brick closed before it
// is queued (a resolution that read the floor must find them).
WorkMark close_traced_mark(ThreadState& state) noexcept;
void publish_traced_floor(ThreadState& state, const WorkMark& mark) noexcept;
// Queues `frame`'s interval, closed at `close_segment`, for resolution.
void finish_traced_timing(ThreadState& state, const Frame& frame, uint64_t close_segment);
// Waits for the devices traced bricks ran on, drains the tracer and records every closed
// brick's device time: for a snapshot (on an asynchronous device only once the profile has
// ended), or because a thread holds too many closed bricks. Takes TracedWork's lock, then
// states_mutex and every thread's pending mutex.
enum class TracedResolution : uint8_t { Snapshot, Bound };
void resolve_traced(TracedResolution why);
// Forgets what an earlier traced profile left unresolved (its closed bricks, the tracer's
// records): a new profile starts from nothing.
void discard_traced();

#pragma GCC visibility pop

}  // namespace brick::profiler::detail
