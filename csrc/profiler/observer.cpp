// The RecordFunction observer that turns every op and range into a brick in the registry.
//
// While enabled, one global RecordFunction callback runs at every op, record_function range and
// autograd node. Its state is per thread (a stack of open bricks and a cache of interned nodes),
// so the hot path takes no lock and allocates nothing once a call site has been seen.
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/runtime.h"
#include "profiler/event_pool.h"
#include "profiler/profiler.h"

namespace brick::profiler {

namespace {

using registry::NodeId;
using registry::SyncMode;

constexpr NodeId kIgnored = UINT32_MAX - 1;  // profiler-internal ops are not bricks

std::mutex g_control_mutex;  // enable / disable / set_sync_mode / reset
std::atomic<bool> g_enabled{false};
std::atomic<SyncMode> g_mode{SyncMode::Event};
std::atomic<uint64_t> g_session{0};  // bumped by enable: per-thread stacks from older sessions are dropped
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
  std::string name;
  bool operator==(const NameKey& other) const = default;
};

struct NameKeyView {
  NodeId parent;
  std::string_view name;
};

struct NameKeyHash {
  using is_transparent = void;
  size_t operator()(const NameKey& key) const noexcept { return hash(key.parent, key.name); }
  size_t operator()(const NameKeyView& key) const noexcept { return hash(key.parent, key.name); }
  static size_t hash(NodeId parent, std::string_view name) noexcept {
    return std::hash<std::string_view>{}(name) * 31 + parent;
  }
};

struct NameKeyEqual {
  using is_transparent = void;
  bool operator()(const NameKey& a, const NameKey& b) const noexcept { return a == b; }
  bool operator()(const NameKeyView& a, const NameKey& b) const noexcept {
    return a.parent == b.parent && a.name == b.name;
  }
  bool operator()(const NameKey& a, const NameKeyView& b) const noexcept {
    return a.parent == b.parent && a.name == b.name;
  }
};

struct PointerKey {
  NodeId parent;
  const char* name;
  bool operator==(const PointerKey& other) const = default;
};

struct PointerKeyHash {
  size_t operator()(const PointerKey& key) const noexcept {
    return std::hash<const void*>{}(key.name) * 31 + key.parent;
  }
};

struct ThreadState {
  uint64_t session = 0;
  std::vector<Frame> stack;
  std::vector<PendingPair> pending;
  // Op names are the schema's own strings: stable pointers, looked up without hashing text.
  std::unordered_map<PointerKey, NodeId, PointerKeyHash> op_nodes;
  // Range names (record_function) are per-call strings: looked up by content.
  std::unordered_map<NameKey, NodeId, NameKeyHash, NameKeyEqual> range_nodes;
  EventPool events;
};

void resolve(ThreadState& state, bool wait);

struct ThreadStateOwner {
  ThreadState state;
  ~ThreadStateOwner() {
    try {
      resolve(state, /*wait=*/true);  // what this thread still owes, before its state goes
    } catch (...) {
      g_timing_failures.fetch_add(state.pending.size(), std::memory_order_relaxed);
    }
  }
};

ThreadState& thread_state() {
  thread_local ThreadStateOwner owner;
  return owner.state;
}

bool is_profiler_internal(const char* name) {
  return std::string_view(name).starts_with("profiler::");
}

NodeId node_for(ThreadState& state, const at::RecordFunction& fn, NodeId parent, int device) {
  const char* name = fn.name();
  if (fn.scope() == at::RecordScope::FUNCTION) {
    const PointerKey key{parent, name};
    auto it = state.op_nodes.find(key);
    if (it != state.op_nodes.end()) return it->second;
    const NodeId node = is_profiler_internal(name)
                            ? kIgnored
                            : brick_registry().intern(parent, name, registry::Kind::Op, device);
    state.op_nodes.emplace(key, node);
    return node;
  }
  const NameKeyView view{parent, name};
  auto it = state.range_nodes.find(view);
  if (it != state.range_nodes.end()) return it->second;
  const NodeId node = brick_registry().intern(parent, name, registry::Kind::Range, device);
  state.range_nodes.emplace(NameKey{parent, name}, node);
  return node;
}

void resolve(ThreadState& state, bool wait) {
  auto& rt = runtime::get();
  size_t kept = 0;
  for (PendingPair& pair : state.pending) {
    if (!wait && !rt.query_event(pair.end)) {
      state.pending[kept++] = pair;
      continue;
    }
    rt.synchronize_event(pair.end);
    const double ms = rt.elapsed_ms(pair.start, pair.end);
    brick_registry().record(pair.node, static_cast<int64_t>(ms * 1e6));
    state.events.release(pair.device, pair.start);
    state.events.release(pair.device, pair.end);
  }
  state.pending.resize(kept);
}

// Bounds outstanding events however long the run: beyond this, wait for the oldest.
constexpr size_t kMaxPending = 4096;

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  try {
    ThreadState& state = thread_state();
    const uint64_t session = g_session.load(std::memory_order_acquire);
    if (state.session != session) {
      state.stack.clear();
      state.session = session;
    }
    const NodeId parent = state.stack.empty() ? registry::kNoParent : state.stack.back().node;
    auto& rt = runtime::get();
    const int device = rt.current_device();
    const NodeId node = node_for(state, fn, parent == kIgnored ? registry::kNoParent : parent,
                                 device);
    Frame frame{node, device, 0, nullptr};
    if (node != kIgnored) {
      switch (g_mode.load(std::memory_order_relaxed)) {
        case SyncMode::Immediate:
          rt.synchronize_device(device);
          frame.start_ns = registry::Registry::now_ns();
          break;
        case SyncMode::Deferred:
          frame.start_ns = registry::Registry::now_ns();
          break;
        case SyncMode::Event:
          frame.start_event = state.events.acquire(device);
          rt.record_event(frame.start_event, device, rt.current_stream(device));
          break;
      }
    }
    state.stack.push_back(frame);
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
    if (frame.node == kIgnored) return;
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
        runtime::Event* end = state.events.acquire(frame.device);
        try {
          rt.record_event(end, frame.device, rt.current_stream(frame.device));
        } catch (...) {
          state.events.release(frame.device, end);
          state.events.release(frame.device, frame.start_event);
          throw;
        }
        state.pending.push_back({frame.node, frame.device, frame.start_event, end});
        // Completed pairs resolve right away (always, on the host runtime); the rest wait.
        resolve(state, /*wait=*/state.pending.size() > kMaxPending);
        break;
      }
    }
  } catch (...) {
    g_timing_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

registry::Registry& brick_registry() {
  static registry::Registry* instance = new registry::Registry();  // outlives every thread
  return *instance;
}

void enable() {
  std::lock_guard<std::mutex> lock(g_control_mutex);
  TORCH_CHECK(!g_enabled.load(), "brick profiler: enable() called while already enabled");
  g_session.fetch_add(1, std::memory_order_acq_rel);
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

std::vector<registry::BrickStats> snapshot() {
  // The calling thread's outstanding pairs resolve here; other threads resolve theirs as they
  // complete (on the host runtime every pair completes when its op returns).
  resolve(thread_state(), /*wait=*/true);
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
  h.pending_events = thread_state().pending.size();
  return h;
}

}  // namespace brick::profiler
