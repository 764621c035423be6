// The brick runtime: devices, streams, events and memory behind one small interface.
//
// Plain C++ with no torch dependency. The backend layer talks only to `Runtime`; two
// implementations sit behind it: the host runtime (host memory, work runs on the calling thread)
// and the CUDA runtime (brick device N is CUDA device N; brick memory and streams other than the
// default one come from the layer above, PyTorch's). Builds with the CUDA toolkit define
// BRICK_WITH_CUDA=1.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace brick::runtime {

using DeviceIndex = int;
using StreamId = int64_t;

// Upper bound on brick devices in one process (PyTorch's DeviceIndex is int8).
constexpr int kMaxDevices = 64;
constexpr StreamId kDefaultStream = 0;

// What actually executes a brick device's work.
enum class BackingKind { Host, Cuda };

// Every runtime failure is reported as this, with a message naming the device and the problem.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MemoryStats {
  int64_t allocated_bytes = 0;       // live bytes, including adopted ones
  int64_t peak_allocated_bytes = 0;  // high-water mark since the last reset
  int64_t allocations = 0;           // live allocations
  int64_t peak_allocations = 0;
  int64_t total_allocations = 0;  // allocations ever made (monotonic)
  int64_t total_frees = 0;
  int64_t allocated_bytes_total = 0;  // bytes ever allocated (monotonic)
  int64_t freed_bytes_total = 0;
  int64_t adopted_bytes = 0;  // live bytes allocated by the backing device and adopted by brick
};

// Lock-free per-device memory accounting shared by every runtime implementation.
class MemoryTracker {
 public:
  // Inline: the host runtime counts every op result's allocation and free. Live figures are
  // derived from the monotonic ones (live = made - freed), so each is two atomic additions; a
  // free is counted after its allocation, so reading the freed figures first never shows more
  // freed than made.
  void on_alloc(int64_t nbytes) noexcept {
    const int64_t made = allocations_made_.fetch_add(1, std::memory_order_acq_rel) + 1;
    const int64_t bytes_made =
        allocated_bytes_made_.fetch_add(nbytes, std::memory_order_acq_rel) + nbytes;
    // Peaks: what this allocation reached (a free racing it can only make the figure lower).
    raise_max(peak_allocated_bytes_, bytes_made - freed_bytes_.load(std::memory_order_acquire));
    raise_max(peak_allocations_, made - frees_.load(std::memory_order_acquire));
  }
  void on_free(int64_t nbytes) noexcept {
    frees_.fetch_add(1, std::memory_order_acq_rel);
    freed_bytes_.fetch_add(nbytes, std::memory_order_acq_rel);
  }
  void on_adopt(int64_t nbytes) noexcept;
  void on_release_adopted(int64_t nbytes) noexcept;
  MemoryStats snapshot() const noexcept;
  void reset_peak() noexcept;
  // Zeroes the monotonic totals (allocations and frees made, bytes allocated and freed).
  void reset_accumulated() noexcept;

 private:
  struct Live {
    int64_t bytes;
    int64_t allocations;
  };
  Live live() const noexcept;
  static void raise_max(std::atomic<int64_t>& peak, int64_t value) noexcept {
    int64_t seen = peak.load(std::memory_order_relaxed);
    while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
    }
  }
  // Monotonic since the tracker was made: an allocation or a free is two atomic additions.
  std::atomic<int64_t> allocations_made_{0};
  std::atomic<int64_t> allocated_bytes_made_{0};
  std::atomic<int64_t> frees_{0};
  std::atomic<int64_t> freed_bytes_{0};
  // Their values at the last reset_accumulated(): the totals reported count from there.
  std::atomic<int64_t> allocations_base_{0};
  std::atomic<int64_t> allocated_bytes_base_{0};
  std::atomic<int64_t> frees_base_{0};
  std::atomic<int64_t> freed_bytes_base_{0};
  std::atomic<int64_t> peak_allocated_bytes_{0};
  std::atomic<int64_t> peak_allocations_{0};
  // Live bytes adopted from the backing device's allocator. The runtime's own allocations (op
  // results on the host runtime, the common case) are the rest of the live bytes: they cost no
  // third atomic addition.
  std::atomic<int64_t> adopted_bytes_{0};
};

// An event owned by a runtime. Opaque to callers: each runtime derives its own event type from
// this base (one definition per runtime, so two runtimes can live in one program).
struct Event {
  // The references its holder keeps beyond the first (the profiler's timing events, one of
  // which may mark the end of several nested intervals); runtimes never read it.
  uint32_t extra_refs = 0;

 protected:
  Event() = default;
  ~Event() = default;
};

namespace detail {

// The calling thread's current device and its current stream on every device, for one runtime
// instance (`owner`: runtimes are told apart by a process-unique id, never by address, so a new
// runtime at a dead one's address inherits no thread state). Managed in thread_state.h; here
// because Runtime::current_device() reads it inline.
struct ThreadState {
  uint64_t owner = 0;
  DeviceIndex device = 0;
  StreamId streams[kMaxDevices] = {};
};

// The most recently used state of the calling thread: one compare on the hot path.
// initial-exec: a direct %fs access even inside a dlopen()ed module (8 bytes of static TLS).
extern constinit thread_local ThreadState* tls_last_thread_state [[gnu::tls_model("initial-exec")]];

// A process-unique id for a new runtime instance.
uint64_t next_runtime_id() noexcept;

}  // namespace detail

class Runtime {
 public:
  virtual ~Runtime() = default;

  virtual BackingKind backing_kind() const noexcept = 0;
  // True when work (and so an event) may complete after the call that issued it returns, as on
  // a GPU: timing events must then be resolved later rather than read at once.
  virtual bool asynchronous() const noexcept = 0;
  virtual const char* name() const noexcept = 0;
  virtual int device_count() const noexcept = 0;
  // Index of the backing device that runs brick device `device` (-1 for the host).
  virtual int backing_device_index(DeviceIndex device) const noexcept = 0;

  // Current device of the calling thread. Inline, not virtual: every op asks, several times.
  DeviceIndex current_device() const noexcept {
    const detail::ThreadState* last = detail::tls_last_thread_state;
    if (last != nullptr && last->owner == id_) [[likely]]
      return last->device;
    return current_device_slow();
  }
  virtual void set_current_device(DeviceIndex device) = 0;

  // Memory. The host runtime serves brick memory: `allocate(device, 0)` returns nullptr, and
  // `deallocate` takes any pointer `allocate` returned (from any thread) and says what it
  // released. The CUDA runtime allocates none (on CUDA backing brick memory is PyTorch's CUDA
  // caching allocator's, counted through record_adopted): there `allocate` throws Error,
  // `deallocate` aborts on any pointer but nullptr and `record_stream` throws Error on any.
  struct Released {
    size_t nbytes;
    DeviceIndex device;
  };
  virtual void* allocate(DeviceIndex device, size_t nbytes) = 0;
  virtual Released deallocate(void* ptr) noexcept = 0;
  // `ptr` (from `allocate`) is used by work on `stream` of `device`: its deallocation waits for
  // the work queued there until then, not only for its allocation stream's work.
  virtual void record_stream(void* ptr, DeviceIndex device, StreamId stream) = 0;
  // Copies `nbytes` into brick memory of `dst_device`, from brick memory of the same device or,
  // with `src_device` -1, from plain host memory, ordered on the current stream of `dst_device`.
  // A copy from host memory has read it when the call returns. The ranges must not overlap.
  virtual void copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
                    size_t nbytes) = 0;

  // Streams. Stream 0 is each device's default stream; the current stream is per thread. Streams
  // live until exit.
  // The host runtime creates streams; `priority` (0 normal, negative higher) orders nothing there.
  // The CUDA runtime creates none: brick streams on CUDA backing are PyTorch's CUDA streams,
  // registered with `stream_from_native`, and there `create_stream` throws Error.
  virtual StreamId create_stream(DeviceIndex device, int priority) = 0;
  virtual StreamId current_stream(DeviceIndex device) const = 0;
  virtual void set_current_stream(DeviceIndex device, StreamId stream) = 0;
  virtual bool query_stream(DeviceIndex device, StreamId stream) = 0;
  virtual void synchronize_stream(DeviceIndex device, StreamId stream) = 0;
  virtual void synchronize_device(DeviceIndex device) = 0;
  // The brick stream of a backing stream handle (a cudaStream_t; nullptr is the legacy default
  // stream, brick's stream 0), registering an external one on first sight (it is never
  // destroyed by brick). The host runtime has no native streams and throws Error.
  virtual StreamId stream_from_native(DeviceIndex device, void* handle) = 0;
  // True while `stream` is being captured into a CUDA graph. Recording an event on it,
  // querying or synchronizing it is then illegal, so callers check this first.
  virtual bool is_capturing(DeviceIndex device, StreamId stream) = 0;

  // Events.
  virtual Event* create_event(DeviceIndex device, bool enable_timing) = 0;
  virtual void destroy_event(Event* event) noexcept = 0;
  virtual void record_event(Event* event, DeviceIndex device, StreamId stream) = 0;
  virtual bool query_event(Event* event) = 0;
  virtual void synchronize_event(Event* event) = 0;
  virtual void stream_wait_event(DeviceIndex device, StreamId stream, Event* event) = 0;
  // Milliseconds from `start` to `end`; both must be timing events that were recorded.
  virtual double elapsed_ms(Event* start, Event* end) = 0;
  // When a recorded timing event completed, in steady_clock nanoseconds of the host (so device
  // timelines can be placed beside CPU ones); -1 if it was not recorded or has not completed.
  virtual int64_t event_host_time_ns(Event* event) = 0;

  // Memory statistics (allocations made through `allocate` plus adopted bytes).
  MemoryStats memory_stats(DeviceIndex device) const;
  void reset_peak_memory_stats(DeviceIndex device);
  void reset_accumulated_memory_stats(DeviceIndex device);
  // Bytes the backing device allocated that brick took over (zero-copy op results).
  void record_adopted(DeviceIndex device, size_t nbytes) noexcept;
  void release_adopted(DeviceIndex device, size_t nbytes) noexcept;

  // Throws Error naming the device and the valid range when `device` is not a brick device.
  // Inline: every stream and event call checks its device, the profiler's per-op ones included.
  void check_device(DeviceIndex device) const {
    if (device < 0 || device >= device_count()) [[unlikely]]
      throw_device_out_of_range(device);
  }

 protected:
  Runtime() : id_(detail::next_runtime_id()) {}

  MemoryTracker& tracker(DeviceIndex device) noexcept { return trackers_[device]; }
  // Throws Error unless copy()'s arguments are what it takes (see there).
  void check_copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
                  size_t nbytes) const;

  const uint64_t id_;  // keys this runtime's per-thread state

 private:
  [[noreturn, gnu::cold]] void throw_device_out_of_range(DeviceIndex device) const;
  DeviceIndex current_device_slow() const noexcept;

  MemoryTracker trackers_[kMaxDevices];
};

// The process-wide runtime, created on first use. The implementation is chosen by the
// BRICK_RUNTIME environment variable:
//   auto (the default)  the CUDA runtime when CUDA backing is allowed and a GPU is usable,
//                       the host runtime otherwise (runtime_choice_note() says why);
//   host                the host runtime;
//   cuda                the CUDA runtime, or Error saying why it cannot be had.
// Once created, a load and a compare: every brick op asks for it several times.
namespace detail {
extern std::atomic<Runtime*> g_runtime;
Runtime& create_runtime();
}  // namespace detail
inline Runtime& get() {
  Runtime* runtime = detail::g_runtime.load(std::memory_order_acquire);
  if (runtime != nullptr) [[likely]]
    return *runtime;
  return detail::create_runtime();
}

// Whether the layer above can run CUDA kernels on brick memory (a CPU-only PyTorch cannot):
// nothing when it can, else the reason, shown to users. Asked when the runtime is chosen, not
// when set: asking may initialize CUDA, which a process that forks before using brick must not
// have done. Without a check (or with nullptr) CUDA backing is allowed. Set before the first
// get(); later settings do not change the runtime already chosen.
using CudaBackingCheck = std::optional<std::string> (*)();
void set_cuda_backing_check(CudaBackingCheck check);

// The process id in which get() created the runtime, or -1 while it has not been created (the
// runtime is created on first use, so importing brick initializes no device).
int runtime_created_in_pid() noexcept;

// Throws Error when BRICK_RUNTIME, BRICK_HOST_DEVICES or BRICK_HOST_COMPLETION is invalid,
// without creating the runtime (so a bad setting fails at import, not at first use).
void validate_runtime_environment();

// One sentence saying which runtime get() chose and why (e.g. why auto chose the host runtime).
// Creates the runtime if needed, so it throws what get() throws.
const std::string& runtime_choice_note();

// What get() does, without keeping the result: reads BRICK_RUNTIME (and BRICK_HOST_DEVICES) and
// the CUDA backing check now. For tests and tools; the backend uses get().
struct RuntimeChoice {
  std::unique_ptr<Runtime> runtime;
  std::string note;  // as runtime_choice_note()
};
RuntimeChoice make_runtime_from_env();

// Number of virtual host devices: BRICK_HOST_DEVICES (1..kMaxDevices, default 2).
int host_device_count_from_env();

// How the host runtime's events complete (BRICK_HOST_COMPLETION):
//   immediate (the default)  when recorded: work has run by then, on the calling thread;
//   deferred                 kDeferredCompletionNs after being recorded, as if a device were
//                            still running the work: query_event() is false until then,
//                            synchronize waits, elapsed_ms() refuses an incomplete event. It
//                            exercises, on any machine, the code paths an asynchronous device
//                            takes (the profiler's pending event queues, lazy trace times).
enum class HostCompletion { Immediate, Deferred };
constexpr int64_t kDeferredCompletionNs = 20'000;
HostCompletion host_completion_from_env();

std::unique_ptr<Runtime> make_host_runtime(int device_count,
                                           HostCompletion completion = HostCompletion::Immediate);

// The CUDA runtime over every visible CUDA device (at most kMaxDevices). Throws Error saying why
// when no GPU is usable or this build has no CUDA support.
std::unique_ptr<Runtime> make_cuda_runtime();

// What a child process forked after a CUDA runtime was created gets instead of it (installed
// by a fork handler): the same device count and names, and every device call refused with an
// Error that says why and what to do (CUDA cannot be used after fork(), as for torch.cuda).
std::unique_ptr<Runtime> make_forked_child_runtime(const Runtime& parent);

// Whether make_cuda_runtime() can succeed: this build has CUDA support and cudaGetDeviceCount
// reports at least one device. When not, and `why` is given, stores the reason in it.
bool cuda_runtime_usable(std::string* why);

}  // namespace brick::runtime
