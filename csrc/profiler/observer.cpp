// The RecordFunction observer that turns every op and range into a brick in the registry.
//
// While enabled, one global RecordFunction callback runs at every op, record_function range and
// autograd node; with OpTiming::Kernels it runs at ranges and autograd nodes only, and ops open
// their bricks at brick's kernel entry (the kernel timer, runtime/launch_observer.h) instead.
// Its state is per thread (a stack of open bricks and a cache of interned nodes), so the hot
// path takes no lock and allocates nothing once a call site has been seen.
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
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "profiler/fork.h"
#include "profiler/observer_callback.h"
#include "profiler/observer_state.h"
#include "profiler/profiler.h"
#include "runtime/launch_observer.h"
#include "runtime/runtime.h"
namespace brick::profiler::detail {

// The calling thread's state: initial-exec, a direct %fs access even inside a dlopen()ed module.
[[gnu::tls_model("initial-exec")]] constinit thread_local ThreadState* tls_state = nullptr;

namespace {

// Owns the calling thread's state. The state lives on the heap: this module's TLS is accessed
// initial-exec, so all of it comes out of the small static TLS block.
struct ThreadStateOwner {
  std::unique_ptr<ThreadState> owned = std::make_unique<ThreadState>();
  ThreadStateOwner() {
    std::lock_guard<std::mutex> lock(g_observer.states_mutex);
    g_observer.states.push_back(owned.get());
    tls_state = owned.get();
  }
  ~ThreadStateOwner() {
    ThreadState& state = *owned;
    tls_state = nullptr;
    ThreadState* self = &state;
    g_observer.owner.compare_exchange_strong(self, nullptr);
    {
      // Once out of the list no snapshot can be resolving this state.
      std::lock_guard<std::mutex> lock(g_observer.states_mutex);
      std::erase(g_observer.states, &state);
      // Its closed traced bricks wait for the next resolution without it.
      std::lock_guard<std::mutex> pending(state.pending.mutex);
      try {
        state.pending.closed.append_to(g_observer.exited_closed);
        if (const uint64_t floor = state.traced_floor.load(std::memory_order_relaxed); floor != 0) {
          g_observer.exited_traced_threads.push_back(static_cast<uint32_t>(floor >> kSegmentBits));
        }
      } catch (...) {  // out of memory: these bricks are lost, and counted
        g_observer.timing_failures.fetch_add(state.pending.closed.size(),
                                             std::memory_order_relaxed);
      }
    }
    std::lock_guard<std::mutex> lock(state.pending.mutex);
    resolve_locked(state, /*by_owner=*/true, /*wait_all=*/true);  // what this thread still owes
    forget_last_op_end(state);
    // Events a snapshot freed for this thread go back to its pool, which destroys them next.
    for (auto [device, event] : state.pending.returned) state.events.release(device, event);
    state.pending.returned.clear();
  }
};

}  // namespace

[[gnu::noinline]] ThreadState& create_thread_state() {
  // The registry's per-thread state must outlive this thread's ThreadStateOwner, whose
  // destructor records the pairs still pending: thread_locals die in reverse order of
  // construction, so it is constructed first.
  registry::Registry::prepare_thread();
  thread_local ThreadStateOwner owner;
  return *owner.owned;
}

namespace {

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
  const char* string_marker = g_observer.string_overload_name.load(std::memory_order_relaxed);
  return string_marker != nullptr && fn.overload_name() != string_marker;
}

// The node of op `name`, whose text lives at that address for as long as its schema is
// registered (a schema's name, a kernel's name): looked up by the address.
NodeId op_node_by_address(ThreadState& state, const char* name, NodeId parent, int device) {
  const uint64_t epoch = g_observer.schema_epoch.load(std::memory_order_relaxed);
  if (state.schema_epoch != epoch) [[unlikely]] {
    state.by_schema_name.clear();
    state.no_work.clear();  // a name may now be another schema's
    state.schema_epoch = epoch;
  }
  NodeId node = state.by_schema_name.find(name, parent, device);
  if (node == SchemaNodeCache::kNoNode) [[unlikely]] {
    node = intern_node(state, name, parent, device, registry::Kind::Op);
    state.by_schema_name.put(name, parent, device, node);
  }
  return node;
}

NodeId node_for(ThreadState& state, const at::RecordFunction& fn, NodeId parent, int device) {
  const char* name = fn.name();
  if (fn.scope() != at::RecordScope::FUNCTION) {
    return intern_node(state, name, parent, device, registry::Kind::Range);
  }
  if (!named_by_schema(fn)) [[unlikely]] {
    return intern_node(state, name, parent, device, registry::Kind::Op);
  }
  return op_node_by_address(state, name, parent, device);
}

// Work the autograd engine runs for a backward() call (on its device threads for brick).
bool is_autograd_engine_work(const at::RecordFunction& fn) {
  return fn.scope() == at::RecordScope::BACKWARD_FUNCTION ||
         std::string_view(fn.name()).starts_with("autograd::engine::");
}

void publish_top(ThreadState& state) {
  if (g_observer.owner.load(std::memory_order_relaxed) != &state) return;
  state.published_top.store(state.stack.empty() ? registry::kNoParent : state.stack.back().node,
                            std::memory_order_relaxed);
  state.published_interval.store(state.stack.empty() ? 0 : state.stack.back().interval,
                                 std::memory_order_relaxed);
}

}  // namespace

// Forgets the calling thread's open bricks (a new profiling session), returning their start
// events to the pool.
void drop_open_bricks(ThreadState& state) {
  for (const Frame& frame : state.stack) {
    if (frame.start_event != nullptr) state.events.release(frame.device, frame.start_event);
  }
  state.stack.clear();
  if (state.marking) publish_traced_floor(state, close_traced_mark(state));
  state.awaiting = 0;
  forget_last_op_end(state);
}

namespace {

// The parent of a brick that opens with no brick open on its thread; `engine_work(state)` says
// whether it is work of PyTorch's autograd engine (asked only where that matters).
template <typename IsEngineWork>
NodeId top_level_parent(ThreadState& state, IsEngineWork&& engine_work) {
  ThreadState* owner = g_observer.owner.load(std::memory_order_relaxed);
  // An autograd engine thread starting backward work: its caller's open brick is the parent.
  if (owner == nullptr || owner == &state || !engine_work(state)) return registry::kNoParent;
  return owner->published_top.load(std::memory_order_relaxed);
}

// Traced timing: the interval a brick opening now with `parent` opens in: the thread's innermost
// open brick's, or, for an autograd engine thread's work, the owner's (a top-level brick with a
// parent, on another thread: `elsewhere`).
uint64_t parent_interval(const ThreadState& state, NodeId parent, bool* elsewhere) {
  *elsewhere = false;
  if (!state.stack.empty()) return state.stack.back().interval;
  if (parent == registry::kNoParent) return 0;
  const ThreadState* owner = g_observer.owner.load(std::memory_order_relaxed);
  if (owner == nullptr) return 0;
  *elsewhere = true;
  return owner->published_interval.load(std::memory_order_relaxed);
}

// Opens a brick on the calling thread: pushes its frame and starts its timing. `name_frame(state,
// parent, frame)` sets the frame's node (and signature) once the session and the parent are
// settled. Never throws: a brick that cannot be timed is dropped and counted, and its frame is
// still pushed, so the close that comes for this call pops this frame, not its parent's (which
// would close the parent early and mis-parent every brick after it).
template <typename IsEngineWork, typename NameFrame>
void open_brick(bool is_op, IsEngineWork&& engine_work, NameFrame&& name_frame) noexcept {
  ThreadState* state = nullptr;
  try {
    state = &thread_state();
  } catch (...) {
    g_observer.timing_failures.fetch_add(1, std::memory_order_relaxed);
    return;  // no thread state: its close finds none either (counted as unbalanced)
  }
  runtime::Runtime& rt = *g_observer.runtime.load(std::memory_order_relaxed);
  Frame frame{};
  frame.node = kIgnored;
  frame.is_op = is_op;
  if (is_op) {
    frame.work_at_open = runtime::device_work_seen();
    if (!state->stack.empty()) {
      const Frame& up = state->stack.back();
      frame.inside_device_work =
          up.inside_device_work || (up.is_op && up.work_at_open != frame.work_at_open);
    }
  }
  try {
    frame.device = rt.current_device();
    const uint64_t session = g_observer.session.load(std::memory_order_acquire);
    if (state->session != session) [[unlikely]] {
      state->session = session;
      state->unpushed = 0;
      drop_open_bricks(*state);
    }
    NodeId parent =
        state->stack.empty() ? top_level_parent(*state, engine_work) : state->stack.back().node;
    if (parent == kIgnored || parent == kSkippedInCapture) parent = registry::kNoParent;
    name_frame(*state, parent, frame);
    if (frame.node != kIgnored) {
      if (g_observer.traced.load(std::memory_order_relaxed)) [[unlikely]] {
        bool elsewhere = false;
        const uint64_t parent_id = parent_interval(*state, parent, &elsewhere);
        start_traced_timing(rt, *state, frame, parent_id, elsewhere);
      } else if (g_observer.async.load(std::memory_order_relaxed)) [[unlikely]] {
        start_async_timing(*state, rt, frame, frame.is_op);
      } else {
        // A synchronous runtime: the brick is the work done before its end's clock read.
        frame.start_ns = registry::Registry::now_ns();
      }
    }
  } catch (...) {  // the brick is dropped (counted), its frame still pushed
    g_observer.timing_failures.fetch_add(1, std::memory_order_relaxed);
    frame.node = kIgnored;
    frame.start_event = nullptr;  // (start_async_timing returned it to the pool)
    frame.awaiting_work = false;
  }
  try {
    state->stack.push_back(frame);
  } catch (...) {  // out of memory: the close for this call is told to pop nothing
    g_observer.timing_failures.fetch_add(1, std::memory_order_relaxed);
    if (frame.start_event != nullptr) state->events.release(frame.device, frame.start_event);
    ++state->unpushed;
    return;
  }
  if (frame.awaiting_work) ++state->awaiting;
  publish_top(*state);
}

// Whether calls of `fn`'s op that ran no brick work only read or aliased their inputs (metadata:
// a view, aten::t, aten::detach, aten::size, aten::contiguous of a contiguous tensor) rather than
// computed on the host. From its schema: it writes no argument (no `Tensor(a!)`), and every
// tensor it returns aliases an input (`Tensor(a)`) or it returns none. Only ops known to compute
// are listed as host work: one that computes a non-tensor result on the CPU (aten::equal) is
// judged metadata.
bool only_reads_metadata(const c10::FunctionSchema& schema) {
  for (const c10::Argument& argument : schema.arguments()) {
    if (argument.alias_info() != nullptr && argument.alias_info()->isWrite()) return false;
  }
  const auto holds_tensor = [](const c10::TypePtr& type) {
    if (type->kind() == c10::TypeKind::TensorType) return true;
    for (const c10::TypePtr& contained : type->containedTypes()) {
      if (contained->kind() == c10::TypeKind::TensorType) return true;
    }
    return false;
  };
  for (const c10::Argument& result : schema.returns()) {
    if (result.alias_info() != nullptr) {
      if (result.alias_info()->isWrite()) return false;
    } else if (holds_tensor(result.type())) {
      return false;  // a new tensor, computed here
    }
  }
  return true;
}

// Records a call of an op that ran no brick work: no kernel, copy, collective or brick
// allocation between its open and close (runtime::device_work_seen() did not move). Its device
// time is none. One that only read or aliased tensors stays an op, with 0; one that computed
// (a CPU op) goes to its node's Kind::Host twin, with its host time, so that reports list it as
// host work and keep it out of device sums. Judged once per node (the first call's overload):
// `fn` is nullptr where no schema is at hand (a kernel timer's op), then judged metadata. A step
// named by text, not by a schema (the autograd engine's evaluate_function, a C++
// RECORD_FUNCTION) is opaque: brick cannot tell what it ran, so it is timed as any brick
// (returns false: not recorded here). (Compiled brick code's kernels never get here: see
// runtime::device_work_seen().)
bool record_without_device_work(ThreadState& state, const Frame& frame,
                                const at::RecordFunction* fn) {
  registry::Registry& registry = *g_observer.registry.load(std::memory_order_relaxed);
  if (state.no_work.size() <= frame.node) [[unlikely]]
    state.no_work.resize(size_t{frame.node} + 1);
  NoWorkInfo& info = state.no_work[frame.node];
  if (info.kind == NoWorkClass::Unknown) [[unlikely]] {
    if (fn == nullptr) {
      info.kind = NoWorkClass::Metadata;
    } else if (const std::optional<c10::FunctionSchema> schema = fn->operator_schema()) {
      info.kind = only_reads_metadata(*schema) ? NoWorkClass::Metadata : NoWorkClass::HostWork;
    } else {
      info.kind = NoWorkClass::Opaque;
    }
  }
  if (info.kind == NoWorkClass::Opaque) return false;
  const int64_t end = registry::Registry::now_ns();
  if (info.kind == NoWorkClass::Metadata) {
    record_brick(registry, frame.node, frame.shape, 0, end);
    return true;
  }
  if (info.host_twin == registry::kNoParent) [[unlikely]]
    info.host_twin = registry.twin(frame.node, registry::Kind::Host);
  record_brick(registry, info.host_twin, frame.shape, end - frame.start_ns, end);
  return true;
}

// Closes the calling thread's innermost brick: pops its frame and records its time. `fn`: the
// RecordFunction closing it, nullptr for the kernel timer's.
void close_brick(const at::RecordFunction* fn) noexcept {
  try {
    ThreadState& state = thread_state();
    if (state.unpushed > 0) [[unlikely]] {  // its enter could not push a frame
      --state.unpushed;
      return;
    }
    if (state.stack.empty() || state.session != g_observer.session.load(std::memory_order_acquire))
        [[unlikely]] {
      g_observer.unbalanced_exits.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const Frame frame = state.stack.back();
    state.stack.pop_back();
    if (frame.awaiting_work) --state.awaiting;
    publish_top(state);
    // Traced timing: the brick's close mark, published as the thread's floor where its
    // outermost brick closed once this brick is queued (on every return below).
    struct FloorOnReturn {
      ThreadState& state;
      WorkMark mark;
      ~FloorOnReturn() {
        if (mark.thread != 0 && state.stack.empty()) publish_traced_floor(state, mark);
      }
    } close{state, state.marking ? close_traced_mark(state) : WorkMark{}};
    if (frame.node == kIgnored || frame.node == kSkippedInCapture) return;
    if (frame.is_op && !frame.inside_device_work &&
        runtime::device_work_seen() == frame.work_at_open &&
        record_without_device_work(state, frame, fn)) {
      return;
    }
    if (frame.interval != 0) [[unlikely]] {
      finish_traced_timing(state, frame, close.mark.segment);
      return;
    }
    if (g_observer.async.load(std::memory_order_relaxed)) [[unlikely]] {
      finish_async_timing(state, *g_observer.runtime.load(std::memory_order_relaxed), frame);
      return;
    }
    const int64_t end = registry::Registry::now_ns();
    record_brick(*g_observer.registry.load(std::memory_order_relaxed), frame.node, frame.shape,
                 end - frame.start_ns, end);
  } catch (...) {
    g_observer.timing_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  const bool is_op = fn.scope() == at::RecordScope::FUNCTION;
  open_brick(
      is_op,
      [&fn](ThreadState& state) {
        if (!is_autograd_engine_work(fn)) return false;
        state.runs_autograd_nodes = true;
        return true;
      },
      [&fn, is_op](ThreadState& state, NodeId parent, Frame& frame) {
        frame.node = node_for(state, fn, parent, frame.device);
        if (is_op && g_observer.shapes_active.load(std::memory_order_relaxed) &&
            frame.node != kIgnored) [[unlikely]] {
          frame.shape = intern_signature(fn);
        }
      });
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* /*ctx*/) { close_brick(&fn); }

// A brick kernel or copy starts (OpTiming::Kernels): its op's brick opens. `name`, the kernel's
// op, keeps its text at that address (a literal, or its registered schema's name).
void on_kernel_begin(const char* name) noexcept {
  open_brick(
      // The gradient sums the engine does between nodes run outside any node's brick.
      /*is_op=*/true, [](const ThreadState& state) { return state.runs_autograd_nodes; },
      [name](ThreadState& state, NodeId parent, Frame& frame) {
        frame.node = op_node_by_address(state, name, parent, frame.device);
      });
}

void on_kernel_end() noexcept { close_brick(nullptr); }

}  // namespace brick::profiler::detail
