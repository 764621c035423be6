// The RecordFunction observer that turns every op and range into a brick in the registry.
//
// While enabled, one global RecordFunction callback runs at every op, record_function range and
// autograd node. Its state is per thread (a stack of open bricks and a cache of interned nodes),
// so the hot path takes no lock and allocates nothing once a call site has been seen.
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "profiler/event_pool.h"
#include "profiler/fork.h"
#include "profiler/profiler.h"
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

std::atomic<uint64_t> g_unbalanced_exits{0};
std::atomic<uint64_t> g_timing_failures{0};

struct Frame {
  NodeId node;
  int device;
  int64_t start_ns;             // Deferred / Immediate
  runtime::Event* start_event;  // Event
};

// Finished event pairs whose device work may still be running (asynchronous runtimes).
struct PendingPair {
  NodeId node;
  int device;
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

struct PointerKey {
  NodeId parent;
  int device;
  const char* name;
  bool operator==(const PointerKey& other) const = default;
};

struct PointerKeyHash {
  size_t operator()(const PointerKey& key) const noexcept {
    return (std::hash<const void*>{}(key.name) * 31 + key.parent) * 31 +
           static_cast<size_t>(key.device);
  }
};

// A cached node and the name it was cached for: a pointer can be reused for another name.
struct CachedNode {
  NodeId node;
  std::string name;
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
  std::vector<Frame> stack;
  PendingQueue pending;
  // Op names are mostly the schema's own strings: stable pointers, looked up without hashing
  // text (and checked, since some FUNCTION-scope names are per-call strings).
  std::unordered_map<PointerKey, CachedNode, PointerKeyHash> by_pointer;
  // Everything else (record_function ranges) is looked up by content.
  std::unordered_map<NameKey, NodeId, NameKeyHash, NameKeyEqual> by_name;
  // The innermost open brick, readable by other threads (see on_enter: autograd workers).
  std::atomic<NodeId> published_top{registry::kNoParent};
  EventPool events;
};

// The thread that enabled profiling: backward work that PyTorch's autograd engine runs on its
// device threads is attributed to the brick open on this thread (the one waiting in backward()).
std::atomic<ThreadState*> g_owner{nullptr};

// Every live thread's state, so snapshot() can resolve the pairs each thread still owes.
std::mutex g_states_mutex;
std::vector<ThreadState*> g_states;

void resolve_locked(ThreadState& state, bool by_owner, bool wait_all);

// The calling thread's state: initial-exec, a direct %fs access even inside a dlopen()ed module.
[[gnu::tls_model("initial-exec")]] constinit thread_local ThreadState* tls_state = nullptr;

struct ThreadStateOwner {
  ThreadState state;
  ThreadStateOwner() {
    std::lock_guard<std::mutex> lock(g_states_mutex);
    g_states.push_back(&state);
    tls_state = &state;
  }
  ~ThreadStateOwner() {
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
  return owner.state;
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

NodeId node_for(ThreadState& state, const at::RecordFunction& fn, NodeId parent, int device) {
  const char* name = fn.name();
  if (fn.scope() != at::RecordScope::FUNCTION) {
    return intern_node(state, name, parent, device, registry::Kind::Range);
  }
  const PointerKey key{parent, device, name};
  auto it = state.by_pointer.find(key);
  if (it != state.by_pointer.end() && it->second.name == name) return it->second.node;
  const NodeId node = intern_node(state, name, parent, device, registry::Kind::Op);
  state.by_pointer.insert_or_assign(key, CachedNode{node, name});
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

// Bounds outstanding events however long the run: beyond this, wait for the oldest.
constexpr size_t kMaxPending = 4096;
// Completed pairs are collected every this many queued pairs (a query per pair is not free).
constexpr size_t kResolveEvery = 32;

// Resolves pairs from the front of `state`'s queue: every one when `wait_all`, else those
// complete (and the oldest beyond kMaxPending). Called with state.pending.mutex held; a pair
// that cannot be timed is dropped and counted, never retried forever.
void resolve_locked(ThreadState& state, bool by_owner, bool wait_all) {
  PendingQueue& queue = state.pending;
  auto& rt = runtime::get();
  while (!queue.pairs.empty()) {
    const PendingPair pair = queue.pairs.front();
    try {
      const bool must_wait = wait_all || queue.pairs.size() > kMaxPending;
      if (!must_wait && !rt.query_event(pair.end)) break;
      rt.synchronize_event(pair.end);
      const double ms = rt.elapsed_ms(pair.start, pair.end);
      brick_registry().record(pair.node, static_cast<int64_t>(ms * 1e6));
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
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  try {
    ThreadState& state = thread_state();
    const uint64_t session = g_session.load(std::memory_order_acquire);
    if (state.session != session) {
      drop_open_bricks(state);
      state.session = session;
    }
    NodeId parent = state.stack.empty() ? registry::kNoParent : state.stack.back().node;
    if (parent == registry::kNoParent && is_autograd_engine_work(fn)) {
      // An autograd engine thread starting backward work: its caller's open brick is the parent.
      ThreadState* owner = g_owner.load(std::memory_order_relaxed);
      if (owner != nullptr && owner != &state) {
        parent = owner->published_top.load(std::memory_order_relaxed);
      }
    }
    if (parent == kIgnored || parent == kSkippedInCapture) parent = registry::kNoParent;
    auto& rt = runtime::get();
    const int device = rt.current_device();
    NodeId node = node_for(state, fn, parent, device);
    const SyncMode mode = g_mode.load(std::memory_order_relaxed);
    // The current stream is read once, where it is used: Event mode records on it, and on an
    // asynchronous runtime it must not be being captured.
    const bool needs_stream = node != kIgnored && (mode == SyncMode::Event || async_runtime());
    const runtime::StreamId stream =
        needs_stream ? rt.current_stream(device) : runtime::kDefaultStream;
    if (node != kIgnored && async_runtime() && rt.is_capturing(device, stream)) [[unlikely]] {
      node = kSkippedInCapture;
      g_capture_skipped.fetch_add(1, std::memory_order_relaxed);
    }
    Frame frame{node, device, 0, nullptr};
    if (node != kIgnored && node != kSkippedInCapture) {
      switch (mode) {
        case SyncMode::Immediate:
          rt.synchronize_device(device);
          frame.start_ns = registry::Registry::now_ns();
          break;
        case SyncMode::Deferred:
          frame.start_ns = registry::Registry::now_ns();
          break;
        case SyncMode::Event:
          frame.start_event = acquire_event(state, device);
          try {
            rt.record_event(frame.start_event, device, stream);
          } catch (...) {
            state.events.release(device, frame.start_event);
            throw;
          }
          break;
      }
    }
    state.stack.push_back(frame);
    publish_top(state);
  } catch (...) {
    g_timing_failures.fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

void on_exit(const at::RecordFunction& /*fn*/, at::ObserverContext* /*ctx*/) {
  try {
    ThreadState& state = thread_state();
    if (state.stack.empty() || state.session != g_session.load(std::memory_order_acquire)) {
      g_unbalanced_exits.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const Frame frame = state.stack.back();
    state.stack.pop_back();
    publish_top(state);
    if (frame.node == kIgnored || frame.node == kSkippedInCapture) return;
    auto& rt = runtime::get();
    switch (g_mode.load(std::memory_order_relaxed)) {
      case SyncMode::Immediate: {
        rt.synchronize_device(frame.device);
        const int64_t end = registry::Registry::now_ns();
        brick_registry().record(frame.node, end - frame.start_ns, end);
        break;
      }
      case SyncMode::Deferred: {
        const int64_t end = registry::Registry::now_ns();
        brick_registry().record(frame.node, end - frame.start_ns, end);
        break;
      }
      case SyncMode::Event: {
        runtime::Event* end = acquire_event(state, frame.device);
        try {
          rt.record_event(end, frame.device, rt.current_stream(frame.device));
        } catch (...) {
          state.events.release(frame.device, end);
          state.events.release(frame.device, frame.start_event);
          throw;
        }
        if (!async_runtime()) {
          // The host runtime: the pair has completed; resolve it without queueing.
          const double ms = rt.elapsed_ms(frame.start_event, end);
          state.events.release(frame.device, frame.start_event);
          state.events.release(frame.device, end);
          brick_registry().record(frame.node, static_cast<int64_t>(ms * 1e6));
          break;
        }
        std::lock_guard<std::mutex> lock(state.pending.mutex);
        state.pending.pairs.push_back({frame.node, frame.device, frame.start_event, end});
        state.pending.size.store(state.pending.pairs.size(), std::memory_order_relaxed);
        if (state.pending.pairs.size() % kResolveEvery == 0 ||
            state.pending.pairs.size() > kMaxPending) {
          resolve_locked(state, /*by_owner=*/true, /*wait_all=*/false);
        }
        break;
      }
    }
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
  g_session.fetch_add(1, std::memory_order_acq_rel);
  g_unbalanced_exits.store(0, std::memory_order_relaxed);
  g_timing_failures.store(0, std::memory_order_relaxed);
  g_capture_skipped.store(0, std::memory_order_relaxed);
  ThreadState* state = tls_state;
  // Other threads' states are gone; a lock another thread held at the fork stays held: renew.
  new (&g_states_mutex) std::mutex();
  g_states.clear();
  if (state != nullptr) {
    g_states.push_back(state);
    new (&state->pending.mutex) std::mutex();
    drop_open_bricks(*state);
    state->session = g_session.load(std::memory_order_relaxed);
    state->by_pointer.clear();
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

void enable() {
  std::lock_guard<std::mutex> lock(g_control_mutex);
  TORCH_CHECK(!g_enabled.load(), "brick profiler: enable() called while already enabled");
  (void)runtime::get();  // created (a device initialized) now, not inside the first brick
  g_session.fetch_add(1, std::memory_order_acq_rel);
  ThreadState& owner = thread_state();
  drop_open_bricks(owner);
  owner.session = g_session.load(std::memory_order_relaxed);
  owner.published_top.store(registry::kNoParent, std::memory_order_relaxed);
  g_owner.store(&owner, std::memory_order_release);
  g_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_enter, &on_exit)
          .needsInputs(false)
          .needsOutputs(false)
          .needsIds(false)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE}));
  g_enabled.store(true, std::memory_order_release);
}

void disable() {
  std::lock_guard<std::mutex> lock(g_control_mutex);
  TORCH_CHECK(g_enabled.load(), "brick profiler: disable() called while not enabled");
  at::removeCallback(g_handle);
  g_handle = 0;
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
  h.capture_skipped = g_capture_skipped.load(std::memory_order_relaxed);
  h.live_events = g_live_events.load(std::memory_order_relaxed);
  return h;
}

}  // namespace brick::profiler
