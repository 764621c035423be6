// The RecordFunction observer that turns every op and range into a brick in the registry.
//
// While enabled, one global RecordFunction callback runs at every op, record_function range and
// autograd node. Its state is per thread (a stack of open bricks and a cache of interned nodes),
// so the hot path takes no lock and allocates nothing once a call site has been seen.
//
// The op path (a synchronous runtime, the host's): an op's node is found by the address of its
// schema's name in a direct-mapped per-thread cache (no hashing of text, no string compare: a
// schema's name lives as long as the schema, and deregistering any schema flushes the caches),
// and the brick is timed by two reads of the registry's clock. On a synchronous runtime every
// sync mode times the same thing, the work between the two reads, so none records a device
// event or synchronizes. Ranges and autograd nodes, whose names are per-call strings, are looked
// up by their text.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "profiler/device_timer.h"
#include "profiler/fork.h"
#include "profiler/observer_callback.h"
#include "profiler/profiler.h"
#include "runtime/launch_observer.h"
#include "runtime/runtime.h"

namespace brick::profiler {

namespace {

using registry::NodeId;
using registry::SyncMode;

constexpr NodeId kIgnored = UINT32_MAX - 1;  // profiler-internal ops are not bricks
// A brick that began while its stream was being captured into a CUDA graph: nothing may be
// recorded on such a stream, and the work it launches runs only at replay, so it is skipped
// (and counted: health().capture_skipped).
constexpr NodeId kSkippedInCapture = UINT32_MAX - 2;

std::mutex g_control_mutex;  // enable / disable / set_sync_mode / reset
std::atomic<bool> g_enabled{false};
std::atomic<SyncMode> g_mode{SyncMode::Event};
std::atomic<uint64_t> g_session{
    0};  // bumped by enable: per-thread stacks from older sessions are dropped
at::CallbackHandle g_handle = 0;

// What the callbacks need, set by enable() before the callback is registered (and by the fork
// handler): no function-local static guard or lookup on the op path.
std::atomic<runtime::Runtime*> g_runtime{nullptr};
std::atomic<registry::Registry*> g_registry{nullptr};
std::atomic<uint64_t> g_capture_skipped_base{0};  // not reported: before reset(), or a parent's
std::atomic<bool> g_async{false};  // async_runtime(): bricks are timed by device events

// Bumped whenever an operator schema is deregistered: its name's address may then be reused by
// another schema's name, so every thread's node cache keyed by those addresses is flushed.
std::atomic<uint64_t> g_schema_epoch{0};

// What RecordFunction::overload_name() returns for a RecordFunction named by a string (a
// record_function range, an autograd node) rather than by an operator schema: the address of
// one constant empty string, found by probing at enable(). A different address means the name
// is a schema's. nullptr when the probe did not find one constant: every name is then looked up
// by its text.
std::atomic<const char*> g_string_overload_name{nullptr};

std::atomic<uint64_t> g_unbalanced_exits{0};
std::atomic<uint64_t> g_timing_failures{0};

struct Frame {
  NodeId node;
  int device;
  int64_t start_ns;             // Deferred / Immediate
  runtime::Event* start_event;  // Event
  // Event mode on an asynchronous runtime, an op: its start event is recorded right before the
  // first work it queues (start_awaiting_bricks), on that work's device; none yet.
  bool awaiting_work = false;
  bool is_op = false;  // an op (scope FUNCTION), not a range or an autograd node
};

// Finished event pairs whose device work may still be running (asynchronous runtimes).
struct PendingPair {
  NodeId node;
  int device;
  runtime::StreamId stream;  // of its end event
  runtime::Event* start;
  runtime::Event* end;
};

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
  // The innermost open brick, readable by other threads (see on_enter: autograd workers).
  std::atomic<NodeId> published_top{registry::kNoParent};
  EventPool events;
  uint32_t unpushed = 0;  // enters whose frame could not be pushed (out of memory)
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

void forget_last_op_end(ThreadState& state) {
  if (state.last_op_end.event == nullptr) return;
  state.events.release(state.last_op_end.device, state.last_op_end.event);
  state.last_op_end.event = nullptr;
}

// The thread that enabled profiling: backward work that PyTorch's autograd engine runs on its
// device threads is attributed to the brick open on this thread (the one waiting in backward()).
std::atomic<ThreadState*> g_owner{nullptr};

// Every live thread's state, so snapshot() can resolve the pairs each thread still owes.
std::mutex g_states_mutex;
std::vector<ThreadState*> g_states;

void resolve_locked(ThreadState& state, bool by_owner, bool wait_all);

// The calling thread's state: initial-exec, a direct %fs access even inside a dlopen()ed module.
[[gnu::tls_model("initial-exec")]] constinit thread_local ThreadState* tls_state = nullptr;

// Owns the calling thread's state. The state lives on the heap: this module's TLS is accessed
// initial-exec, so all of it comes out of the small static TLS block.
struct ThreadStateOwner {
  std::unique_ptr<ThreadState> owned = std::make_unique<ThreadState>();
  ThreadStateOwner() {
    std::lock_guard<std::mutex> lock(g_states_mutex);
    g_states.push_back(owned.get());
    tls_state = owned.get();
  }
  ~ThreadStateOwner() {
    ThreadState& state = *owned;
    tls_state = nullptr;
    ThreadState* self = &state;
    g_owner.compare_exchange_strong(self, nullptr);
    {
      // Once out of the list no snapshot can be resolving this state.
      std::lock_guard<std::mutex> lock(g_states_mutex);
      std::erase(g_states, &state);
    }
    std::lock_guard<std::mutex> lock(state.pending.mutex);
    resolve_locked(state, /*by_owner=*/true, /*wait_all=*/true);  // what this thread still owes
    forget_last_op_end(state);
    // Events a snapshot freed for this thread go back to its pool, which destroys them next.
    for (auto [device, event] : state.pending.returned) state.events.release(device, event);
    state.pending.returned.clear();
  }
};

[[gnu::noinline]] ThreadState& create_thread_state() {
  // The registry's per-thread state must outlive this thread's ThreadStateOwner, whose
  // destructor records the pairs still pending: thread_locals die in reverse order of
  // construction, so it is constructed first.
  registry::Registry::prepare_thread();
  thread_local ThreadStateOwner owner;
  return *owner.owned;
}

ThreadState& thread_state() {
  ThreadState* state = tls_state;
  if (state != nullptr) [[likely]]
    return *state;
  return create_thread_state();
}

bool is_profiler_internal(const char* name) {
  return std::string_view(name).starts_with("profiler::");
}

// The name a brick gets for a range opened with an empty name (record_function("")): it is
// timed like any other, not dropped.
constexpr const char* kUnnamedRange = "(unnamed range)";

NodeId intern_node(ThreadState& state, const char* name, NodeId parent, int device,
                   registry::Kind kind) {
  if (*name == '\0') name = kUnnamedRange;
  const NameKeyView view{parent, device, name};
  auto it = state.by_name.find(view);
  if (it != state.by_name.end()) return it->second;
  const NodeId node = kind == registry::Kind::Op && is_profiler_internal(name)
                          ? kIgnored
                          : brick_registry().intern(parent, name, kind, device);
  state.by_name.emplace(NameKey{parent, device, name}, node);
  return node;
}

// Whether `fn` is named by an operator schema (its name's address is then stable).
bool named_by_schema(const at::RecordFunction& fn) noexcept {
  const char* string_marker = g_string_overload_name.load(std::memory_order_relaxed);
  return string_marker != nullptr && fn.overload_name() != string_marker;
}

NodeId node_for(ThreadState& state, const at::RecordFunction& fn, NodeId parent, int device) {
  const char* name = fn.name();
  if (fn.scope() != at::RecordScope::FUNCTION) {
    return intern_node(state, name, parent, device, registry::Kind::Range);
  }
  if (!named_by_schema(fn)) [[unlikely]] {
    return intern_node(state, name, parent, device, registry::Kind::Op);
  }
  const uint64_t epoch = g_schema_epoch.load(std::memory_order_relaxed);
  if (state.schema_epoch != epoch) [[unlikely]] {
    state.by_schema_name.clear();
    state.schema_epoch = epoch;
  }
  NodeId node = state.by_schema_name.find(name, parent, device);
  if (node == SchemaNodeCache::kNoNode) [[unlikely]] {
    node = intern_node(state, name, parent, device, registry::Kind::Op);
    state.by_schema_name.put(name, parent, device, node);
  }
  return node;
}

// Work the autograd engine runs for a backward() call (on its device threads for brick).
bool is_autograd_engine_work(const at::RecordFunction& fn) {
  return fn.scope() == at::RecordScope::BACKWARD_FUNCTION ||
         std::string_view(fn.name()).starts_with("autograd::engine::");
}

void publish_top(ThreadState& state) {
  if (g_owner.load(std::memory_order_relaxed) != &state) return;
  state.published_top.store(state.stack.empty() ? registry::kNoParent : state.stack.back().node,
                            std::memory_order_relaxed);
}

// Resolves pairs from the front of `state`'s queue: every one when `wait_all`, else those
// complete (and the oldest beyond kMaxPending). Called with state.pending.mutex held; a pair
// that cannot be timed is dropped and counted, never retried forever.
void resolve_locked(ThreadState& state, bool by_owner, bool wait_all) {
  PendingQueue& queue = state.pending;
  if (queue.pairs.empty()) return;
  auto& rt = runtime::get();
  // A stream completes its work in order: once the newest pair's end has completed, so has every
  // older pair's on that stream, which is then read without a query of its own.
  const PendingPair& newest = queue.pairs.back();
  bool newest_done = false;
  try {
    newest_done = !wait_all && rt.query_event(newest.end);
  } catch (...) {  // left to that pair's own read below
  }
  const int done_device = newest.device;
  const runtime::StreamId done_stream = newest.stream;
  while (!queue.pairs.empty()) {
    const PendingPair pair = queue.pairs.front();
    try {
      const bool known_done =
          newest_done && pair.device == done_device && pair.stream == done_stream;
      const bool must_wait = wait_all || known_done || queue.pairs.size() > kMaxOutstanding;
      DeviceInterval interval;
      if (!read_interval(rt, pair.start, pair.end, must_wait, /*place=*/false, &interval,
                         /*known_done=*/known_done)) {
        break;
      }
      brick_registry().record(pair.node, interval.duration_ns);
    } catch (...) {
      g_timing_failures.fetch_add(1, std::memory_order_relaxed);
    }
    queue.pairs.pop_front();
    if (by_owner) {
      state.events.release(pair.device, pair.start);
      state.events.release(pair.device, pair.end);
    } else {
      queue.returned.emplace_back(pair.device, pair.start);
      queue.returned.emplace_back(pair.device, pair.end);
      queue.has_returned.store(true, std::memory_order_relaxed);
    }
  }
  queue.size.store(queue.pairs.size(), std::memory_order_relaxed);
}

// An event from the calling (owning) thread's pool, taking back first the events that a
// snapshot on another thread freed.
runtime::Event* acquire_event(ThreadState& state, int device) {
  if (state.pending.has_returned.load(std::memory_order_relaxed) && !state.events.has_free(device))
      [[unlikely]] {
    std::lock_guard<std::mutex> lock(state.pending.mutex);
    for (auto [owner_device, event] : state.pending.returned) {
      state.events.release(owner_device, event);
    }
    state.pending.returned.clear();
    state.pending.has_returned.store(false, std::memory_order_relaxed);
  }
  return state.events.acquire(device);
}

// Forgets the calling thread's open bricks (a new profiling session), returning their start
// events to the pool.
void drop_open_bricks(ThreadState& state) {
  for (const Frame& frame : state.stack) {
    if (frame.start_event != nullptr) state.events.release(frame.device, frame.start_event);
  }
  state.stack.clear();
  state.awaiting = 0;
  forget_last_op_end(state);
}

// The parent of a brick that opens with no brick open on its thread.
NodeId top_level_parent(const ThreadState& state, const at::RecordFunction& fn) {
  ThreadState* owner = g_owner.load(std::memory_order_relaxed);
  // An autograd engine thread starting backward work: its caller's open brick is the parent.
  if (owner == nullptr || owner == &state || !is_autograd_engine_work(fn)) {
    return registry::kNoParent;
  }
  return owner->published_top.load(std::memory_order_relaxed);
}

// Starts an asynchronous runtime's timing of `frame` (its device and node set): a device event
// on the current stream (Event), a clock read after the device drained (Immediate) or at once
// (Deferred). A brick on a stream being captured into a CUDA graph is skipped. In Event mode an
// op's start waits for its first work (start_awaiting_bricks): its device time is its work's,
// from the stream's point where that was queued, not the host's preparation before it; a range
// times the stream from its enter to its exit, whatever was queued in it.
void start_async_timing(ThreadState& state, runtime::Runtime& rt, Frame& frame, bool is_op) {
  const SyncMode mode = g_mode.load(std::memory_order_relaxed);
  if (mode == SyncMode::Event && is_op) {
    frame.awaiting_work = true;
    return;
  }
  const runtime::StreamId stream = rt.current_stream(frame.device);
  if (skip_in_capture(rt, frame.device, stream, TimingClient::Registry)) [[unlikely]] {
    frame.node = kSkippedInCapture;
    return;
  }
  switch (mode) {
    case SyncMode::Immediate:
      rt.synchronize_device(frame.device);
      frame.start_ns = registry::Registry::now_ns();
      break;
    case SyncMode::Deferred:
      frame.start_ns = registry::Registry::now_ns();
      break;
    case SyncMode::Event:
      frame.start_event = acquire_event(state, frame.device);
      try {
        rt.record_event(frame.start_event, frame.device, stream);
      } catch (...) {
        state.events.release(frame.device, frame.start_event);
        frame.start_event = nullptr;
        throw;
      }
      break;
  }
}

// Ends an asynchronous runtime's timing of `frame`; an event pair is queued, to be resolved
// once the device has reached its end.
void finish_async_timing(ThreadState& state, runtime::Runtime& rt, const Frame& frame) {
  if (frame.awaiting_work) {  // an op that queued no device work: its device time is none
    g_registry.load(std::memory_order_relaxed)->record(frame.node, 0);
    return;
  }
  switch (g_mode.load(std::memory_order_relaxed)) {
    case SyncMode::Immediate: {
      rt.synchronize_device(frame.device);
      const int64_t end = registry::Registry::now_ns();
      g_registry.load(std::memory_order_relaxed)->record(frame.node, end - frame.start_ns, end);
      return;
    }
    case SyncMode::Deferred: {
      const int64_t end = registry::Registry::now_ns();
      g_registry.load(std::memory_order_relaxed)->record(frame.node, end - frame.start_ns, end);
      return;
    }
    case SyncMode::Event:
      break;
  }
  const runtime::StreamId stream = rt.current_stream(frame.device);
  auto& last = state.last_op_end;
  runtime::Event* end = nullptr;
  if (frame.is_op && last.event != nullptr && last.device == frame.device &&
      last.stream == stream) {
    // Nothing was queued since the op nested in this one ended: this one ends there too.
    end = last.event;
    state.events.share(end);
  } else {
    end = acquire_event(state, frame.device);
    try {
      rt.record_event(end, frame.device, stream);
    } catch (...) {
      state.events.release(frame.device, end);
      state.events.release(frame.device, frame.start_event);
      throw;
    }
    if (frame.is_op) {
      forget_last_op_end(state);
      state.events.share(end);
      last = {end, frame.device, stream};
    }
  }
  std::lock_guard<std::mutex> lock(state.pending.mutex);
  state.pending.pairs.push_back({frame.node, frame.device, stream, frame.start_event, end});
  state.pending.size.store(state.pending.pairs.size(), std::memory_order_relaxed);
  if (state.pending.pairs.size() % kResolveEvery == 0 ||
      state.pending.pairs.size() > kMaxOutstanding) {
    resolve_locked(state, /*by_owner=*/true, /*wait_all=*/false);
  }
}

// The queue hook (runtime/launch_observer.h), installed in Event mode on an asynchronous runtime:
// work is about to be queued on `device`'s current stream, so every open op of this thread still
// waiting for its first work starts now, with one event each recorded there (skipped, and
// counted, when that stream is being captured into a CUDA graph).
void start_awaiting_bricks(runtime::DeviceIndex device) noexcept {
  ThreadState* state = tls_state;
  if (state == nullptr) return;
  // Work follows: an op that ends from now on ends after it.
  if (state->last_op_end.event != nullptr) forget_last_op_end(*state);
  if (state->awaiting == 0) [[likely]]
    return;
  try {
    runtime::Runtime& rt = *g_runtime.load(std::memory_order_relaxed);
    const runtime::StreamId stream = rt.current_stream(device);
    const bool capturing = rt.is_capturing(device, stream);
    // Every op waiting for its first work starts here, at one point of the stream: one event,
    // shared by all of them.
    runtime::Event* shared_start = nullptr;
    for (auto it = state->stack.rbegin(); it != state->stack.rend() && state->awaiting > 0; ++it) {
      Frame& frame = *it;
      if (!frame.awaiting_work) continue;
      frame.awaiting_work = false;
      --state->awaiting;
      frame.device = device;
      if (capturing) [[unlikely]] {
        g_capture_skipped[static_cast<size_t>(TimingClient::Registry)].fetch_add(
            1, std::memory_order_relaxed);
        frame.node = kSkippedInCapture;
        continue;
      }
      if (shared_start != nullptr) {
        state->events.share(shared_start);
        frame.start_event = shared_start;
        continue;
      }
      runtime::Event* event = acquire_event(*state, device);
      try {
        rt.record_event(event, device, stream);
        frame.start_event = event;
        shared_start = event;
      } catch (...) {
        state->events.release(device, event);
        frame.node = kIgnored;
        g_timing_failures.fetch_add(1, std::memory_order_relaxed);
      }
    }
  } catch (...) {
    g_timing_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  ThreadState* state = nullptr;
  try {
    state = &thread_state();
  } catch (...) {
    g_timing_failures.fetch_add(1, std::memory_order_relaxed);
    return nullptr;  // no thread state: its exit finds none either (counted as unbalanced)
  }
  runtime::Runtime& rt = *g_runtime.load(std::memory_order_relaxed);
  Frame frame{kIgnored, rt.current_device(), 0, nullptr};
  frame.is_op = fn.scope() == at::RecordScope::FUNCTION;
  try {
    const uint64_t session = g_session.load(std::memory_order_acquire);
    if (state->session != session) [[unlikely]] {
      state->session = session;
      state->unpushed = 0;
      drop_open_bricks(*state);
    }
    NodeId parent = state->stack.empty() ? top_level_parent(*state, fn) : state->stack.back().node;
    if (parent == kIgnored || parent == kSkippedInCapture) parent = registry::kNoParent;
    frame.node = node_for(*state, fn, parent, frame.device);
    if (frame.node != kIgnored) {
      if (g_async.load(std::memory_order_relaxed)) [[unlikely]] {
        start_async_timing(*state, rt, frame, frame.is_op);
      } else {
        // A synchronous runtime: the brick is the work done before its end's clock read.
        frame.start_ns = registry::Registry::now_ns();
      }
    }
  } catch (...) {
    // The brick is dropped (counted), but its frame is still pushed: the exit that comes for
    // this call must pop this frame, not its parent's (which would close the parent early and
    // mis-parent every brick after it).
    g_timing_failures.fetch_add(1, std::memory_order_relaxed);
    frame.node = kIgnored;
    frame.start_event = nullptr;  // (start_async_timing returned it to the pool)
    frame.awaiting_work = false;
  }
  try {
    state->stack.push_back(frame);
  } catch (...) {  // out of memory: the exit for this call is told to pop nothing
    g_timing_failures.fetch_add(1, std::memory_order_relaxed);
    if (frame.start_event != nullptr) state->events.release(frame.device, frame.start_event);
    ++state->unpushed;
    return nullptr;
  }
  if (frame.awaiting_work) ++state->awaiting;
  publish_top(*state);
  return nullptr;
}

void on_exit(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  try {
    ThreadState& state = thread_state();
    if (state.unpushed > 0) [[unlikely]] {  // its enter could not push a frame
      --state.unpushed;
      return;
    }
    if (state.stack.empty() || state.session != g_session.load(std::memory_order_acquire))
        [[unlikely]] {
      g_unbalanced_exits.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const Frame frame = state.stack.back();
    state.stack.pop_back();
    if (frame.awaiting_work) --state.awaiting;
    publish_top(state);
    if (frame.node == kIgnored || frame.node == kSkippedInCapture) return;
    if (g_async.load(std::memory_order_relaxed)) [[unlikely]] {
      finish_async_timing(state, *g_runtime.load(std::memory_order_relaxed), frame);
      return;
    }
    const int64_t end = registry::Registry::now_ns();
    g_registry.load(std::memory_order_relaxed)->record(frame.node, end - frame.start_ns, end);
  } catch (...) {
    g_timing_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

namespace {

// Outlives every thread. Replaced (the old one leaked) in a forked child: see after_fork_in_child.
registry::Registry*& registry_instance() {
  static registry::Registry* instance = new registry::Registry();
  return instance;
}

}  // namespace

registry::Registry& brick_registry() { return *registry_instance(); }

// In a forked child the registry is replaced rather than reset (its node and shard locks may
// have been held by threads that do not exist there), and this thread's cached nodes of the old
// registry and its open bricks are dropped. Profiling stays as it was: the child's work is
// recorded, into the child's registry.
void prepare_observer_for_fork() { g_control_mutex.lock(); }

void observer_after_fork_in_parent() { g_control_mutex.unlock(); }

void observer_after_fork_in_child() {
  g_control_mutex.unlock();
  registry_instance() = new registry::Registry();
  g_registry.store(registry_instance(), std::memory_order_relaxed);
  g_session.fetch_add(1, std::memory_order_acq_rel);
  g_unbalanced_exits.store(0, std::memory_order_relaxed);
  g_timing_failures.store(0, std::memory_order_relaxed);
  g_capture_skipped_base.store(capture_skipped(TimingClient::Registry), std::memory_order_relaxed);
  ThreadState* state = tls_state;
  // Other threads' states are gone; a lock another thread held at the fork stays held: renew.
  new (&g_states_mutex) std::mutex();
  g_states.clear();
  if (state != nullptr) {
    g_states.push_back(state);
    new (&state->pending.mutex) std::mutex();
    drop_open_bricks(*state);
    state->session = g_session.load(std::memory_order_relaxed);
    state->by_schema_name.clear();
    state->by_name.clear();
    // The parent resolves these pairs; in the child they are dropped, their events reused.
    for (const PendingPair& pair : state->pending.pairs) {
      state->events.release(pair.device, pair.start);
      state->events.release(pair.device, pair.end);
    }
    state->pending.pairs.clear();
    state->pending.size.store(0, std::memory_order_relaxed);
    state->published_top.store(registry::kNoParent, std::memory_order_relaxed);
  }
  g_owner.store(g_enabled.load(std::memory_order_relaxed) ? state : nullptr,
                std::memory_order_relaxed);
}

namespace {

class SchemaDeregistrationListener final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle& /*op*/) override {}
  void onOperatorDeregistered(const c10::OperatorHandle& /*op*/) override {
    g_schema_epoch.fetch_add(1, std::memory_order_relaxed);
  }
};

// Once per process: finds the address overload_name() gives for string-named RecordFunctions
// (two probes, at different addresses, must agree) and starts watching schema deregistrations.
// Called under g_control_mutex.
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
    g_string_overload_name.store(marker, std::memory_order_relaxed);
  }
}

}  // namespace

void enable() {
  std::lock_guard<std::mutex> lock(g_control_mutex);
  TORCH_CHECK(!g_enabled.load(), "brick profiler: enable() called while already enabled");
  // The runtime is created (a device initialized) now, not inside the first brick.
  g_runtime.store(&runtime::get(), std::memory_order_relaxed);
  g_async.store(async_runtime(), std::memory_order_relaxed);
  g_registry.store(&brick_registry(), std::memory_order_relaxed);
  prepare_schema_names();
  g_session.fetch_add(1, std::memory_order_acq_rel);
  ThreadState& owner = thread_state();
  drop_open_bricks(owner);
  owner.session = g_session.load(std::memory_order_relaxed);
  owner.published_top.store(registry::kNoParent, std::memory_order_relaxed);
  g_owner.store(&owner, std::memory_order_release);
  g_handle = at::addGlobalCallback(observer_callback(&on_enter, &on_exit));
  if (g_async.load(std::memory_order_relaxed) &&
      g_mode.load(std::memory_order_relaxed) == SyncMode::Event) {
    runtime::set_queue_hook(&start_awaiting_bricks);
  }
  g_enabled.store(true, std::memory_order_release);
}

void disable() {
  std::lock_guard<std::mutex> lock(g_control_mutex);
  TORCH_CHECK(g_enabled.load(), "brick profiler: disable() called while not enabled");
  at::removeCallback(g_handle);
  g_handle = 0;
  runtime::set_queue_hook(nullptr);
  g_owner.store(nullptr, std::memory_order_release);
  g_enabled.store(false, std::memory_order_release);
}

bool is_enabled() noexcept { return g_enabled.load(std::memory_order_acquire); }

void set_sync_mode(SyncMode mode) {
  std::lock_guard<std::mutex> lock(g_control_mutex);
  TORCH_CHECK(!g_enabled.load(), "brick profiler: the sync mode cannot change while profiling (",
              registry::sync_mode_name(g_mode.load()), " is in use); disable() first");
  g_mode.store(mode, std::memory_order_relaxed);
}

SyncMode sync_mode() noexcept { return g_mode.load(std::memory_order_relaxed); }

registry::Snapshot snapshot() {
  // Every thread's outstanding pairs (asynchronous runtimes only) resolve here, waiting for
  // their device work.
  {
    ThreadState* self = &thread_state();
    std::lock_guard<std::mutex> states(g_states_mutex);
    for (ThreadState* state : g_states) {
      if (state->pending.size.load(std::memory_order_relaxed) == 0) continue;
      std::lock_guard<std::mutex> lock(state->pending.mutex);
      resolve_locked(*state, /*by_owner=*/state == self, /*wait_all=*/true);
    }
  }
  return brick_registry().snapshot();
}

void reset() {
  std::lock_guard<std::mutex> lock(g_control_mutex);
  brick_registry().reset();
  // The registry's own counters start again with its figures: a report (bp.profile resets at
  // its start) says what its profile missed, not what an earlier one in the process did.
  g_unbalanced_exits.store(0, std::memory_order_relaxed);
  g_timing_failures.store(0, std::memory_order_relaxed);
  g_capture_skipped_base.store(capture_skipped(TimingClient::Registry), std::memory_order_relaxed);
}

Health health() {
  Health h;
  h.unbalanced_exits = g_unbalanced_exits.load(std::memory_order_relaxed);
  h.timing_failures = g_timing_failures.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> states(g_states_mutex);
    for (const ThreadState* state : g_states) {
      h.pending_events += state->pending.size.load(std::memory_order_relaxed);
    }
  }
  h.capture_skipped = capture_skipped(TimingClient::Registry) -
                      g_capture_skipped_base.load(std::memory_order_relaxed);
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
