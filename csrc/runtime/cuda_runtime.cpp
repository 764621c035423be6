// The CUDA runtime: brick device N is CUDA device N.
//
// Plain C++ over the CUDA runtime API (no kernels). What it maps to CUDA:
// - Stream 0 of every device is the CUDA legacy default stream, the stream PyTorch's default
//   CUDA stream is, so brick work on it orders with plain `cuda` work. Created streams are
//   cudaStreamNonBlocking (like PyTorch's pool streams) and live as long as the process.
// - Priorities keep the brick meaning: 0 is normal, negative is higher, exactly CUDA's numbers,
//   clamped into the device's cudaDeviceGetStreamPriorityRange (H100: 0 down to -5).
// - Memory comes from the device's default stream-ordered pool (cudaMallocFromPoolAsync on the
//   calling thread's current stream); freed memory stays cached in the pool.
// - The current device and streams are brick's own per-thread state. CUDA's current device is
//   changed only inside a call that needs it and restored before the call returns.
#include <cuda.h>  // driver types for the primary-context query, looked up through cudart
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/runtime.h"
#include "runtime/thread_state.h"

namespace brick::runtime {
namespace {

int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string cuda_error_text(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

std::string device_label(DeviceIndex device) {
  return "brick:" + std::to_string(device) + " (cuda:" + std::to_string(device) + ")";
}

std::string pointer_text(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", ptr);
  return text;
}

[[noreturn]] void throw_cuda(cudaError_t error, const std::string& what, DeviceIndex device) {
  // A non-sticky error stays the thread's "last error" until read: clear it so it does not
  // resurface in an unrelated later call (of brick or of PyTorch, which shares the driver).
  (void)cudaGetLastError();
  throw Error("brick: " + what + " on " + device_label(device) +
              " failed: " + cuda_error_text(error));
}

inline void check(cudaError_t error, const char* what, DeviceIndex device) {
  if (error != cudaSuccess) [[unlikely]]
    throw_cuda(error, what, device);
}

// Errors CUDA returns once the process is tearing it down (or the device was reset): memory is
// gone with the context, so a late free has nothing left to do.
bool is_teardown(cudaError_t error) noexcept {
  return error == cudaErrorCudartUnloading || error == cudaErrorContextIsDestroyed;
}

// ---- primary contexts ------------------------------------------------------------------------

using DeviceGetFn = CUresult(CUDAAPI*)(CUdevice*, int);
using PrimaryCtxGetStateFn = CUresult(CUDAAPI*)(CUdevice, unsigned int*, int*);

struct DriverFunctions {
  DeviceGetFn device_get = nullptr;
  PrimaryCtxGetStateFn primary_ctx_get_state = nullptr;
};

// Driver entry points through cudart, so nothing links against libcuda directly.
const DriverFunctions& driver_functions() noexcept {
  static const DriverFunctions functions = [] {
    DriverFunctions found;
    void* device_get = nullptr;
    void* get_state = nullptr;
    cudaDriverEntryPointQueryResult status_a = cudaDriverEntryPointSymbolNotFound;
    cudaDriverEntryPointQueryResult status_b = cudaDriverEntryPointSymbolNotFound;
    const bool ok =
        cudaGetDriverEntryPointByVersion("cuDeviceGet", &device_get, 12000, cudaEnableDefault,
                                         &status_a) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &get_state, 12000,
                                         cudaEnableDefault, &status_b) == cudaSuccess &&
        status_a == cudaDriverEntryPointSuccess && status_b == cudaDriverEntryPointSuccess &&
        device_get != nullptr && get_state != nullptr;
    if (ok) {
      found.device_get = reinterpret_cast<DeviceGetFn>(device_get);
      found.primary_ctx_get_state = reinterpret_cast<PrimaryCtxGetStateFn>(get_state);
    } else {
      (void)cudaGetLastError();
    }
    return found;
  }();
  return functions;
}

std::atomic<bool> primary_context_seen_active[kMaxDevices];

// Whether CUDA device `device` has an initialized primary context. Unknown counts as yes.
bool primary_context_active(int device) noexcept {
  if (device < 0 || device >= kMaxDevices) return true;
  if (primary_context_seen_active[device].load(std::memory_order_relaxed)) return true;
  const DriverFunctions& driver = driver_functions();
  if (driver.primary_ctx_get_state == nullptr) return true;
  CUdevice handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (driver.device_get(&handle, device) != CUDA_SUCCESS ||
      driver.primary_ctx_get_state(handle, &flags, &active) != CUDA_SUCCESS) {
    return true;
  }
  // A primary context stays active until a device reset, so "yes" can be remembered.
  if (active != 0) primary_context_seen_active[device].store(true, std::memory_order_relaxed);
  return active != 0;
}

// Makes a CUDA device current for the scope of one runtime call and restores the previous one.
// The current device lives in the driver's per-thread current context, shared with PyTorch's
// copy of cudart, so leaving it changed would move PyTorch's current device too.
class DeviceGuard {
 public:
  explicit DeviceGuard(DeviceIndex device) : DeviceGuard(device, std::nothrow) {
    if (status_ != cudaSuccess) throw_cuda(status_, "making the device current", device);
  }

  DeviceGuard(DeviceIndex device, std::nothrow_t) noexcept {
    int current = -1;
    status_ = cudaGetDevice(&current);
    if (status_ != cudaSuccess || current == device) return;
    status_ = cudaSetDevice(device);
    if (status_ == cudaSuccess) previous_ = current;
  }

  ~DeviceGuard() {
    // Restoring a device without a primary context would create one, hundreds of MB on a GPU
    // the thread never used (a thread with nothing current reports device 0). PyTorch's guard
    // makes the same exception.
    if (previous_ >= 0 && primary_context_active(previous_)) (void)cudaSetDevice(previous_);
  }

  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  bool ok() const noexcept { return status_ == cudaSuccess; }
  cudaError_t status() const noexcept { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// Lets the calling thread query and wait for events while another thread captures a CUDA graph
// in the default (global) mode, which otherwise makes those calls fail and invalidates the
// capture. The profiler reads events from any thread; the events it reads are never captured.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() noexcept {
    if (cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) {
      (void)cudaGetLastError();
      active_ = false;
    }
  }
  ~RelaxedCaptureMode() {
    if (active_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool active_ = true;
};

// ---- events ----------------------------------------------------------------------------------

struct CudaEvent final : Event {
  cudaEvent_t handle = nullptr;
  DeviceIndex device = 0;
  bool timing = false;
  std::atomic<bool> recorded{false};
};

CudaEvent* as_cuda(Event* event) noexcept { return static_cast<CudaEvent*>(event); }
const CudaEvent* as_cuda(const Event* event) noexcept {
  return static_cast<const CudaEvent*>(event);
}

// ---- per-device state ------------------------------------------------------------------------

// Stream handles live in fixed chunks that are never moved, so the hot-path lookup of a handle
// is two loads with no lock: entries are written before the count that publishes them.
constexpr StreamId kStreamsPerChunk = 256;
constexpr StreamId kStreamChunks = 256;
constexpr StreamId kMaxStreamsPerDevice = kStreamsPerChunk * kStreamChunks;

struct StreamChunk {
  cudaStream_t handles[kStreamsPerChunk] = {};
};

// A pair (reference event, host steady_clock time at which it completed).
struct ClockReference {
  cudaEvent_t event = nullptr;
  int64_t host_ns = 0;
  bool valid = false;
};

// cudaEventElapsedTime returns float milliseconds, whose resolution coarsens with distance
// (0.5 us at 4 s), so references are renewed every second and several are kept: an event is
// measured from the nearest one.
constexpr int kClockReferences = 16;
constexpr int64_t kClockReferenceMaxAgeNs = 1'000'000'000;
constexpr int64_t kClockReferenceTightSpanNs = 50'000;

struct DeviceState {
  // Streams. `stream_count` publishes entries; registration happens under `streams_mutex`.
  std::atomic<StreamId> stream_count{0};
  std::atomic<StreamChunk*> stream_chunks[kStreamChunks] = {};
  std::mutex streams_mutex;
  std::unordered_map<cudaStream_t, StreamId> ids_by_handle;  // non-default streams
  std::vector<cudaStream_t> owned_streams;                   // created by brick

  // The default memory pool, set up on first allocation.
  std::atomic<cudaMemPool_t> pool{nullptr};
  std::mutex pool_mutex;

  // Timing-disabled events for ordering one stream after another.
  std::mutex spare_events_mutex;
  std::vector<cudaEvent_t> spare_events;

  // Calibration of device event times against the host clock.
  std::mutex clock_mutex;
  cudaStream_t clock_stream = nullptr;  // idle, so a reference completes as soon as it is queued
  std::array<ClockReference, kClockReferences> clock_references;
  int newest_clock_reference = -1;
};

// ---- allocations -----------------------------------------------------------------------------

struct StreamUse {
  DeviceIndex device;
  cudaStream_t stream;
};

struct Allocation {
  size_t nbytes = 0;
  DeviceIndex device = 0;
  cudaStream_t stream = nullptr;   // the stream the allocation (and its free) is ordered on
  std::vector<StreamUse> used_on;  // other streams given to record_stream
};

constexpr size_t kAllocationShards = 16;

struct AllocationShard {
  std::mutex mutex;
  std::unordered_map<void*, Allocation> live;
};

std::atomic<bool> free_failure_reported{false};

// Reported once: after a sticky error (an illegal memory access, say) every free fails.
void report_free_failure(const void* ptr, const Allocation& allocation, const char* step,
                         cudaError_t error, bool leaked) noexcept {
  (void)cudaGetLastError();
  if (free_failure_reported.exchange(true)) return;
  std::fprintf(stderr,
               "brick: warning: freeing %zu bytes at %p on brick:%d (cuda:%d) failed while %s: "
               "%s: %s%s (further failures to free are not reported)\n",
               allocation.nbytes, ptr, allocation.device, allocation.device, step,
               cudaGetErrorName(error), cudaGetErrorString(error),
               leaked ? "; the memory is left allocated" : "");
}

bool ranges_overlap(const void* a, const void* b, size_t nbytes) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + nbytes && y < x + nbytes;
}

// ---- the runtime -----------------------------------------------------------------------------

class CudaRuntime final : public Runtime {
 public:
  CudaRuntime() : id_(detail::next_runtime_id()) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error("brick: cannot create the CUDA runtime: cudaGetDeviceCount failed: " +
                  cuda_error_text(status));
    }
    if (count <= 0) throw Error("brick: cannot create the CUDA runtime: no CUDA device is visible");
    device_count_ = std::min(count, kMaxDevices);
    devices_ = std::make_unique<DeviceState[]>(device_count_);
    for (int device = 0; device < device_count_; ++device) {
      DeviceState& state = devices_[device];
      auto* first = new StreamChunk;
      // Stream 0: the legacy default stream, named explicitly so it stays the legacy one even
      // in code built with per-thread default streams.
      first->handles[kDefaultStream] = cudaStreamLegacy;
      state.stream_chunks[0].store(first, std::memory_order_relaxed);
      state.stream_count.store(1, std::memory_order_release);
    }
  }

  ~CudaRuntime() override {
    for (int device = 0; device < device_count_; ++device) {
      DeviceState& state = devices_[device];
      const bool has_cuda_objects = !state.owned_streams.empty() || !state.spare_events.empty() ||
                                    state.clock_stream != nullptr;
      // Only then: making a device current would create a context on a GPU never used.
      if (has_cuda_objects) {
        DeviceGuard guard(device, std::nothrow);
        if (guard.ok()) {
          for (cudaStream_t stream : state.owned_streams) (void)cudaStreamDestroy(stream);
          for (cudaEvent_t event : state.spare_events) (void)cudaEventDestroy(event);
          for (const ClockReference& reference : state.clock_references) {
            if (reference.event != nullptr) (void)cudaEventDestroy(reference.event);
          }
          if (state.clock_stream != nullptr) (void)cudaStreamDestroy(state.clock_stream);
        }
        (void)cudaGetLastError();
      }
      for (auto& chunk : state.stream_chunks) delete chunk.load(std::memory_order_relaxed);
    }
  }

  BackingKind backing_kind() const noexcept override { return BackingKind::Cuda; }
  bool asynchronous() const noexcept override { return true; }
  const char* name() const noexcept override { return "cuda"; }
  int device_count() const noexcept override { return device_count_; }
  int backing_device_index(DeviceIndex device) const noexcept override { return device; }

  DeviceIndex current_device() const noexcept override { return detail::current_device_of(id_); }

  void set_current_device(DeviceIndex device) override {
    check_device(device);
    state().device = device;  // brick's own: CUDA's current device is set per call
  }

  // ---- memory ----

  void* allocate(DeviceIndex device, size_t nbytes) override {
    check_device(device);
    if (nbytes == 0) return nullptr;
    const cudaStream_t stream = current_stream_handle(device);
    DeviceGuard guard(device);
    if (capture_active(stream, device)) {
      // Memory allocated inside a capture belongs to the graph, and brick would free it as its
      // own: refuse clearly instead.
      throw Error("brick: allocating " + std::to_string(nbytes) + " bytes of brick memory on " +
                  device_label(device) +
                  " while its stream is being captured into a CUDA graph is not supported; "
                  "allocate before the capture");
    }
    const cudaMemPool_t pool = memory_pool(device);
    void* ptr = nullptr;
    cudaError_t status = cudaMallocFromPoolAsync(&ptr, nbytes, pool, stream);
    if (status == cudaErrorMemoryAllocation && !capture_active(stream, device)) {
      // Once pending frees have completed and the pool's unused memory went back to the
      // driver (so it can be mapped afresh, unfragmented), the request may fit.
      (void)cudaGetLastError();
      if (cudaDeviceSynchronize() == cudaSuccess && cudaMemPoolTrimTo(pool, 0) == cudaSuccess) {
        status = cudaMallocFromPoolAsync(&ptr, nbytes, pool, stream);
      }
    }
    if (status != cudaSuccess) {
      throw_cuda(status, "allocating " + std::to_string(nbytes) + " bytes", device);
    }
    try {
      AllocationShard& shard = shard_of(ptr);
      std::lock_guard<std::mutex> lock(shard.mutex);
      shard.live.emplace(ptr, Allocation{nbytes, device, stream, {}});
    } catch (...) {
      (void)cudaFreeAsync(ptr, stream);
      throw;
    }
    tracker(device).on_alloc(static_cast<int64_t>(nbytes));
    return ptr;
  }

  Released deallocate(void* ptr) noexcept override {
    if (ptr == nullptr) return {0, -1};
    Allocation allocation;
    {
      AllocationShard& shard = shard_of(ptr);
      std::lock_guard<std::mutex> lock(shard.mutex);
      const auto it = shard.live.find(ptr);
      if (it == shard.live.end()) {
        // Not ours, or freed twice: continuing could hand the same memory out twice.
        std::fprintf(stderr,
                     "brick: fatal: deallocate(%p): not memory of this CUDA runtime, or already "
                     "freed\n",
                     ptr);
        std::abort();
      }
      allocation = std::move(it->second);
      shard.live.erase(it);
    }
    tracker(allocation.device).on_free(static_cast<int64_t>(allocation.nbytes));
    free_in_stream_order(ptr, allocation);
    return {allocation.nbytes, allocation.device};
  }

  void record_stream(void* ptr, DeviceIndex device, StreamId stream) override {
    check_device(device);
    const cudaStream_t handle = stream_handle(device, stream);
    if (ptr == nullptr) return;  // a zero-byte allocation: nothing to keep alive
    AllocationShard& shard = shard_of(ptr);
    std::lock_guard<std::mutex> lock(shard.mutex);
    const auto it = shard.live.find(ptr);
    if (it == shard.live.end()) {
      throw Error("brick: record_stream: " + pointer_text(ptr) +
                  " is not the start of memory allocated by this CUDA runtime (or it was "
                  "already freed)");
    }
    Allocation& allocation = it->second;
    if (allocation.device == device && allocation.stream == handle) return;
    for (const StreamUse& use : allocation.used_on) {
      if (use.device == device && use.stream == handle) return;
    }
    allocation.used_on.push_back({device, handle});
  }

  void copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
            size_t nbytes) override {
    if (dst_device >= 0) check_device(dst_device);
    if (src_device >= 0) check_device(src_device);
    if (nbytes == 0 || dst == src) return;
    if (dst_device < 0 && src_device < 0) {
      std::memmove(dst, src, nbytes);
      return;
    }
    if (dst_device >= 0 && src_device >= 0 && dst_device != src_device) {
      copy_between_devices(dst, dst_device, src, src_device, nbytes);
      return;
    }
    const DeviceIndex device = dst_device >= 0 ? dst_device : src_device;
    const cudaStream_t stream = current_stream_handle(device);
    DeviceGuard guard(device);
    if (dst_device >= 0 && src_device >= 0) {
      copy_within_device(dst, src, nbytes, device, stream);
      return;
    }
    const std::string what = std::string(dst_device < 0 ? "a device-to-host" : "a host-to-device") +
                             " copy of " + std::to_string(nbytes) + " bytes";
    if (capture_active(stream, device)) {
      throw Error("brick: " + what + " on " + device_label(device) +
                  " cannot run while the current stream is being captured into a CUDA graph (it "
                  "must synchronize with the host)");
    }
    cudaError_t status = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream);
    if (status != cudaSuccess) throw_cuda(status, what, device);
    // Host memory may be pageable and is the caller's again once copy() returns.
    status = cudaStreamSynchronize(stream);
    if (status != cudaSuccess) throw_cuda(status, "waiting for " + what, device);
  }

  // ---- streams ----

  StreamId create_stream(DeviceIndex device, int priority) override {
    check_device(device);
    DeviceGuard guard(device);
    const int cuda_priority = clamp_priority(priority, device);
    cudaStream_t handle = nullptr;
    check(cudaStreamCreateWithPriority(&handle, cudaStreamNonBlocking, cuda_priority),
          "creating a stream", device);
    DeviceState& state = devices_[device];
    std::lock_guard<std::mutex> lock(state.streams_mutex);
    try {
      state.owned_streams.push_back(handle);
    } catch (...) {
      (void)cudaStreamDestroy(handle);
      throw;
    }
    try {
      return register_stream(device, handle);
    } catch (...) {
      state.owned_streams.pop_back();
      (void)cudaStreamDestroy(handle);
      throw;
    }
  }

  StreamId current_stream(DeviceIndex device) const override {
    check_device(device);
    return state().streams[device];
  }

  void set_current_stream(DeviceIndex device, StreamId stream) override {
    check_device(device);
    (void)stream_handle(device, stream);  // validates
    state().streams[device] = stream;
  }

  bool query_stream(DeviceIndex device, StreamId stream) override {
    check_device(device);
    const cudaStream_t handle = stream_handle(device, stream);
    DeviceGuard guard(device);
    refuse_if_capturing(handle, device, stream, "query");
    const cudaError_t status = cudaStreamQuery(handle);
    if (status == cudaSuccess) return true;
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    throw_cuda(status, "querying stream " + std::to_string(stream), device);
  }

  void synchronize_stream(DeviceIndex device, StreamId stream) override {
    check_device(device);
    const cudaStream_t handle = stream_handle(device, stream);
    DeviceGuard guard(device);
    refuse_if_capturing(handle, device, stream, "synchronize");
    const cudaError_t status = cudaStreamSynchronize(handle);
    if (status != cudaSuccess) {
      throw_cuda(status, "synchronizing stream " + std::to_string(stream), device);
    }
  }

  void synchronize_device(DeviceIndex device) override {
    check_device(device);
    DeviceGuard guard(device);
    check(cudaDeviceSynchronize(), "synchronizing the device", device);
  }

  void* native_stream(DeviceIndex device, StreamId stream) const override {
    check_device(device);
    const cudaStream_t handle = stream_handle(device, stream);
    return handle == cudaStreamLegacy ? nullptr : handle;  // PyTorch's name for it
  }

  StreamId stream_from_native(DeviceIndex device, void* native) override {
    check_device(device);
    const auto handle = static_cast<cudaStream_t>(native);
    if (handle == nullptr || handle == cudaStreamLegacy) return kDefaultStream;
    if (handle == cudaStreamPerThread) {
      throw Error(
          "brick: stream_from_native: the per-thread default stream (cudaStreamPerThread) "
          "cannot become a brick stream: it names a different stream on every thread");
    }
    DeviceState& state = devices_[device];
    {
      std::lock_guard<std::mutex> lock(state.streams_mutex);
      const auto it = state.ids_by_handle.find(handle);
      if (it != state.ids_by_handle.end()) return it->second;
    }
    int owner = -1;
    check(cudaStreamGetDevice(handle, &owner), "asking which device a stream belongs to", device);
    if (owner != device) {
      throw Error("brick: stream_from_native: stream " + pointer_text(handle) +
                  " belongs to cuda:" + std::to_string(owner) + ", not to " + device_label(device));
    }
    std::lock_guard<std::mutex> lock(state.streams_mutex);
    const auto it = state.ids_by_handle.find(handle);
    if (it != state.ids_by_handle.end()) return it->second;  // registered meanwhile
    return register_stream(device, handle);                  // external: never destroyed
  }

  bool is_capturing(DeviceIndex device, StreamId stream) override {
    check_device(device);
    const cudaStream_t handle = stream_handle(device, stream);
    DeviceGuard guard(device);
    return capture_active(handle, device);
  }

  // ---- events ----

  Event* create_event(DeviceIndex device, bool enable_timing) override {
    check_device(device);
    auto event = std::make_unique<CudaEvent>();
    event->device = device;
    event->timing = enable_timing;
    DeviceGuard guard(device);  // an event belongs to the context current at creation
    check(cudaEventCreateWithFlags(&event->handle,
                                   enable_timing ? cudaEventDefault : cudaEventDisableTiming),
          "creating an event", device);
    return event.release();
  }

  void destroy_event(Event* base) noexcept override {
    if (base == nullptr) return;
    CudaEvent* event = as_cuda(base);
    {
      DeviceGuard guard(event->device, std::nothrow);
      const cudaError_t status = guard.ok() ? cudaEventDestroy(event->handle) : guard.status();
      if (status != cudaSuccess) (void)cudaGetLastError();  // nothing useful to do at a destroy
    }
    delete event;
  }

  void record_event(Event* base, DeviceIndex device, StreamId stream) override {
    CudaEvent* event = as_cuda(base);
    check_device(device);
    const cudaStream_t handle = stream_handle(device, stream);
    if (event->device != device) {
      throw Error("brick: event was created on brick:" + std::to_string(event->device) +
                  " but is being recorded on a stream of brick:" + std::to_string(device));
    }
    DeviceGuard guard(device);
    if (capture_active(handle, device)) {
      throw Error("brick: cannot record an event on stream " + std::to_string(stream) + " of " +
                  device_label(device) +
                  " while the stream is being captured into a CUDA graph: an event recorded in "
                  "a capture cannot be queried, synchronized or timed");
    }
    check(cudaEventRecord(event->handle, handle), "recording an event", device);
    event->recorded.store(true, std::memory_order_release);
  }

  bool query_event(Event* base) override {
    CudaEvent* event = as_cuda(base);
    if (!event->recorded.load(std::memory_order_acquire)) return true;  // as CUDA
    // The guard keeps a thread with no context current from creating one on device 0.
    DeviceGuard guard(event->device);
    RelaxedCaptureMode relaxed;
    const cudaError_t status = cudaEventQuery(event->handle);
    if (status == cudaSuccess) return true;
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    throw_cuda(status, "querying an event", event->device);
  }

  void synchronize_event(Event* base) override {
    CudaEvent* event = as_cuda(base);
    if (!event->recorded.load(std::memory_order_acquire)) return;  // as CUDA
    DeviceGuard guard(event->device);
    RelaxedCaptureMode relaxed;
    check(cudaEventSynchronize(event->handle), "synchronizing an event", event->device);
  }

  void stream_wait_event(DeviceIndex device, StreamId stream, Event* base) override {
    CudaEvent* event = as_cuda(base);
    check_device(device);
    const cudaStream_t handle = stream_handle(device, stream);
    if (!event->recorded.load(std::memory_order_acquire)) return;  // waits for nothing
    DeviceGuard guard(device);
    check(cudaStreamWaitEvent(handle, event->handle, 0), "making a stream wait for an event",
          device);
  }

  double elapsed_ms(Event* start_base, Event* end_base) override {
    CudaEvent* start = as_cuda(start_base);
    CudaEvent* end = as_cuda(end_base);
    if (!start->timing || !end->timing) {
      throw Error("brick: elapsed time needs both events created with enable_timing=True");
    }
    if (!start->recorded.load(std::memory_order_acquire) ||
        !end->recorded.load(std::memory_order_acquire)) {
      throw Error("brick: elapsed time needs both events to be recorded first");
    }
    if (start->device != end->device) {
      throw Error("brick: elapsed time needs both events on the same device, got brick:" +
                  std::to_string(start->device) + " and brick:" + std::to_string(end->device));
    }
    // Without the guard, a thread whose current device has no context would create one.
    DeviceGuard guard(start->device);
    RelaxedCaptureMode relaxed;
    float ms = 0.0f;
    const cudaError_t status = cudaEventElapsedTime(&ms, start->handle, end->handle);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      const bool start_done = cudaEventQuery(start->handle) != cudaErrorNotReady;
      const bool end_done = cudaEventQuery(end->handle) != cudaErrorNotReady;
      (void)cudaGetLastError();
      const char* which = !start_done && !end_done ? "neither event has"
                          : !start_done            ? "the start event has not"
                                                   : "the end event has not";
      throw Error(std::string("brick: elapsed time needs both events to have completed, but ") +
                  which + " completed yet on " + device_label(start->device) +
                  " (synchronize the end event first)");
    }
    check(status, "measuring the time between two events", start->device);
    return static_cast<double>(ms);
  }

  DeviceIndex event_device(const Event* event) const noexcept override {
    return as_cuda(event)->device;
  }

  int64_t event_host_time_ns(Event* base) override {
    CudaEvent* event = as_cuda(base);
    if (!event->timing || !event->recorded.load(std::memory_order_acquire)) return -1;
    const DeviceIndex device = event->device;
    DeviceGuard guard(device);
    RelaxedCaptureMode relaxed;
    const cudaError_t status = cudaEventQuery(event->handle);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return -1;
    }
    check(status, "querying an event", device);

    DeviceState& state = devices_[device];
    std::lock_guard<std::mutex> lock(state.clock_mutex);
    if (state.newest_clock_reference < 0 ||
        now_ns() - state.clock_references[state.newest_clock_reference].host_ns >
            kClockReferenceMaxAgeNs) {
      add_clock_reference(state, device);
    }
    // Estimate from the newest reference, then measure again from the nearest one.
    const ClockReference& newest = state.clock_references[state.newest_clock_reference];
    const int64_t estimate = newest.host_ns + ns_between(newest.event, event->handle, device);
    const ClockReference* nearest = &newest;
    for (const ClockReference& reference : state.clock_references) {
      if (reference.valid &&
          std::llabs(reference.host_ns - estimate) < std::llabs(nearest->host_ns - estimate)) {
        nearest = &reference;
      }
    }
    if (nearest == &newest) return estimate;
    return nearest->host_ns + ns_between(nearest->event, event->handle, device);
  }

 private:
  detail::ThreadState& state() const { return detail::thread_state(id_); }

  // The handle of a stream of a valid device; throws Error when the stream does not exist.
  cudaStream_t stream_handle(DeviceIndex device, StreamId stream) const {
    const DeviceState& state = devices_[device];
    const StreamId count = state.stream_count.load(std::memory_order_acquire);
    if (stream < 0 || stream >= count) [[unlikely]] {
      throw Error("brick: stream " + std::to_string(stream) + " does not exist on brick:" +
                  std::to_string(device) + " (" + std::to_string(count) + " stream(s) created)");
    }
    const StreamChunk* chunk =
        state.stream_chunks[stream / kStreamsPerChunk].load(std::memory_order_relaxed);
    return chunk->handles[stream % kStreamsPerChunk];
  }

  cudaStream_t current_stream_handle(DeviceIndex device) const {
    return stream_handle(device, state().streams[device]);
  }

  // Gives `handle` the next id of `device`. Caller holds streams_mutex.
  StreamId register_stream(DeviceIndex device, cudaStream_t handle) {
    DeviceState& state = devices_[device];
    const StreamId id = state.stream_count.load(std::memory_order_relaxed);
    if (id >= kMaxStreamsPerDevice) {
      throw Error("brick: " + device_label(device) + " already has " +
                  std::to_string(kMaxStreamsPerDevice) +
                  " streams, the most one device can have; streams live as long as the "
                  "process, so reuse them (e.g. from a pool)");
    }
    std::atomic<StreamChunk*>& slot = state.stream_chunks[id / kStreamsPerChunk];
    StreamChunk* chunk = slot.load(std::memory_order_relaxed);
    if (chunk == nullptr) {
      chunk = new StreamChunk;
      slot.store(chunk, std::memory_order_relaxed);
    }
    state.ids_by_handle.emplace(handle, id);
    chunk->handles[id % kStreamsPerChunk] = handle;
    state.stream_count.store(id + 1, std::memory_order_release);  // publishes the entry
    return id;
  }

  // Brick priority (0 normal, negative higher) to a CUDA priority of `device`, which is current.
  static int clamp_priority(int priority, DeviceIndex device) {
    int least = 0;
    int greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "querying the stream priority range",
          device);
    return std::clamp(priority, std::min(least, greatest), std::max(least, greatest));
  }

  // Whether `handle` is in a stream capture (active or invalidated). Caller made the device
  // current: the legacy stream handle means the current device's.
  static bool capture_active(cudaStream_t handle, DeviceIndex device) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t error = cudaStreamIsCapturing(handle, &status);
    if (error == cudaErrorStreamCaptureImplicit) {
      // The legacy stream while a blocking stream of the device captures: unusable until that
      // capture ends, so it counts as capturing.
      (void)cudaGetLastError();
      return true;
    }
    check(error, "querying whether a stream is being captured", device);
    return status != cudaStreamCaptureStatusNone;
  }

  static void refuse_if_capturing(cudaStream_t handle, DeviceIndex device, StreamId stream,
                                  const char* verb) {
    if (capture_active(handle, device)) {
      throw Error(std::string("brick: cannot ") + verb + " stream " + std::to_string(stream) +
                  " of " + device_label(device) +
                  " while it is being captured into a CUDA graph (that would invalidate the "
                  "capture)");
    }
  }

  // Caller made `device` current.
  cudaMemPool_t memory_pool(DeviceIndex device) {
    DeviceState& state = devices_[device];
    cudaMemPool_t pool = state.pool.load(std::memory_order_acquire);
    if (pool != nullptr) [[likely]]
      return pool;
    std::lock_guard<std::mutex> lock(state.pool_mutex);
    pool = state.pool.load(std::memory_order_relaxed);
    if (pool != nullptr) return pool;
    int supported = 0;
    check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device),
          "asking whether the device has memory pools", device);
    if (supported == 0) {
      throw Error("brick: " + device_label(device) +
                  " does not support stream-ordered memory pools (cudaMallocAsync), which the "
                  "brick CUDA runtime allocates from");
    }
    // Brick's own pool, so the device's default pool (other libraries') keeps its settings.
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check(cudaMemPoolCreate(&pool, &props), "creating brick's memory pool", device);
    // Keep freed memory cached in the pool: a threshold of 0 hands it back to the driver at
    // every synchronization, which makes the next allocation slow. (allocate() trims it when
    // an allocation fails.)
    cuuint64_t threshold = std::numeric_limits<cuuint64_t>::max();
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
          "setting the release threshold of brick's memory pool", device);
    // Pool memory is reachable from other devices only when granted (peer access enabled
    // with cudaDeviceEnablePeerAccess does not cover pools): grant every peer that can reach it,
    // so copies and kernels across brick devices can read it.
    for (int peer = 0; peer < device_count(); ++peer) {
      int can_access = 0;
      if (peer == device || cudaDeviceCanAccessPeer(&can_access, peer, device) != cudaSuccess ||
          can_access == 0) {
        (void)cudaGetLastError();
        continue;
      }
      cudaMemAccessDesc access = {};
      access.location.type = cudaMemLocationTypeDevice;
      access.location.id = peer;
      access.flags = cudaMemAccessFlagsProtReadWrite;
      check(cudaMemPoolSetAccess(pool, &access, 1), "granting a peer device access to the pool",
            device);
    }
    state.pool.store(pool, std::memory_order_release);
    return pool;
  }

  AllocationShard& shard_of(const void* ptr) noexcept {
    // Pool allocations are at least 256-byte aligned: hash the bits above.
    const auto bits = reinterpret_cast<std::uintptr_t>(ptr) >> 8;
    return shards_[(bits * 0x9E3779B97F4A7C15ULL) >> 60 & (kAllocationShards - 1)];
  }

  // A timing-disabled event of `device` (current) for ordering streams.
  cudaError_t acquire_sync_event(DeviceIndex device, cudaEvent_t* event) noexcept {
    DeviceState& state = devices_[device];
    {
      std::lock_guard<std::mutex> lock(state.spare_events_mutex);
      if (!state.spare_events.empty()) {
        *event = state.spare_events.back();
        state.spare_events.pop_back();
        return cudaSuccess;
      }
    }
    return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
  }

  void release_sync_event(DeviceIndex device, cudaEvent_t event) noexcept {
    DeviceState& state = devices_[device];
    try {
      std::lock_guard<std::mutex> lock(state.spare_events_mutex);
      state.spare_events.push_back(event);
      return;
    } catch (...) {
    }
    DeviceGuard guard(device, std::nothrow);
    if (guard.ok()) (void)cudaEventDestroy(event);
  }

  // Makes `waiter` (a stream of `waiter_device`) wait for the work queued so far on `stream`
  // (of `device`). A wait uses the event's state at the time of the call, so the event can go
  // back to the spares at once.
  cudaError_t wait_for_stream(DeviceIndex waiter_device, cudaStream_t waiter, DeviceIndex device,
                              cudaStream_t stream) noexcept {
    cudaEvent_t event = nullptr;
    {
      DeviceGuard guard(device, std::nothrow);
      if (!guard.ok()) return guard.status();
      const cudaError_t status = acquire_sync_event(device, &event);
      if (status != cudaSuccess) return status;
      const cudaError_t recorded = cudaEventRecord(event, stream);
      if (recorded != cudaSuccess) {
        release_sync_event(device, event);
        return recorded;
      }
    }
    cudaError_t status;
    {
      DeviceGuard guard(waiter_device, std::nothrow);
      status = guard.ok() ? cudaStreamWaitEvent(waiter, event, 0) : guard.status();
    }
    release_sync_event(device, event);
    return status;
  }

  // Frees after the work queued on the allocation stream and on every recorded stream. When a
  // recorded stream cannot be waited for, the memory is leaked rather than freed under work that
  // may still use it.
  void free_in_stream_order(void* ptr, const Allocation& allocation) noexcept {
    for (const StreamUse& use : allocation.used_on) {
      cudaError_t status =
          wait_for_stream(allocation.device, allocation.stream, use.device, use.stream);
      if (status == cudaSuccess) continue;
      if (is_teardown(status)) {
        (void)cudaGetLastError();
        return;
      }
      (void)cudaGetLastError();
      DeviceGuard guard(use.device, std::nothrow);  // fall back to waiting here
      status = guard.ok() ? cudaStreamSynchronize(use.stream) : guard.status();
      if (status != cudaSuccess) {
        if (!is_teardown(status)) {
          report_free_failure(ptr, allocation, "waiting for a stream given to record_stream",
                              status, /*leaked=*/true);
        }
        (void)cudaGetLastError();
        return;
      }
    }
    DeviceGuard guard(allocation.device, std::nothrow);
    const cudaError_t status = guard.ok() ? cudaFreeAsync(ptr, allocation.stream) : guard.status();
    if (status != cudaSuccess) {
      if (!is_teardown(status)) {
        report_free_failure(ptr, allocation, "queuing the free", status, /*leaked=*/false);
      }
      (void)cudaGetLastError();
    }
  }

  // Same-device copy on `stream`; `device` is current. CUDA copies need disjoint ranges, so
  // overlapping ones (allowed, like memmove) go through scratch memory.
  void copy_within_device(void* dst, const void* src, size_t nbytes, DeviceIndex device,
                          cudaStream_t stream) {
    const std::string what = "a device-to-device copy of " + std::to_string(nbytes) + " bytes";
    if (!ranges_overlap(dst, src, nbytes)) {
      const cudaError_t status = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream);
      if (status != cudaSuccess) throw_cuda(status, what, device);
      return;
    }
    void* scratch = nullptr;
    cudaError_t status = cudaMallocFromPoolAsync(&scratch, nbytes, memory_pool(device), stream);
    if (status != cudaSuccess) throw_cuda(status, "allocating scratch memory for " + what, device);
    status = cudaMemcpyAsync(scratch, src, nbytes, cudaMemcpyDefault, stream);
    if (status == cudaSuccess)
      status = cudaMemcpyAsync(dst, scratch, nbytes, cudaMemcpyDefault, stream);
    const cudaError_t freed = cudaFreeAsync(scratch, stream);
    if (status != cudaSuccess) throw_cuda(status, what, device);
    if (freed != cudaSuccess) throw_cuda(freed, "freeing scratch memory of " + what, device);
  }

  // Runs on the source device's current stream, after the work queued on the destination's
  // current stream (which may still use `dst`), and the destination's stream waits for it, so
  // the copy is ordered on both current streams (as PyTorch orders a cross-device copy).
  void copy_between_devices(void* dst, DeviceIndex dst_device, const void* src,
                            DeviceIndex src_device, size_t nbytes) {
    const cudaStream_t src_stream = current_stream_handle(src_device);
    const cudaStream_t dst_stream = current_stream_handle(dst_device);
    const std::string what = "a peer copy of " + std::to_string(nbytes) +
                             " bytes to brick:" + std::to_string(dst_device);
    cudaError_t status = wait_for_stream(src_device, src_stream, dst_device, dst_stream);
    if (status != cudaSuccess) throw_cuda(status, "ordering " + what, src_device);
    {
      DeviceGuard guard(src_device);
      status = cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, src_stream);
      if (status != cudaSuccess) throw_cuda(status, what, src_device);
    }
    status = wait_for_stream(dst_device, dst_stream, src_device, src_stream);
    if (status != cudaSuccess) throw_cuda(status, "ordering " + what, src_device);
  }

  // Records a clock reference: an event on an idle stream, synchronized, stamped with the
  // midpoint of the host times around it (tried again when that span is wide, e.g. preempted).
  // Caller holds clock_mutex and made `device` current.
  void add_clock_reference(DeviceState& state, DeviceIndex device) {
    if (state.clock_stream == nullptr) {
      int least = 0;
      int greatest = 0;
      check(cudaDeviceGetStreamPriorityRange(&least, &greatest),
            "querying the stream priority range", device);
      check(cudaStreamCreateWithPriority(&state.clock_stream, cudaStreamNonBlocking, greatest),
            "creating the clock calibration stream", device);
    }
    const int slot = (state.newest_clock_reference + 1) % kClockReferences;
    ClockReference& reference = state.clock_references[slot];
    reference.valid = false;  // about to be re-recorded
    if (reference.event == nullptr) {
      check(cudaEventCreateWithFlags(&reference.event, cudaEventDefault),
            "creating a clock calibration event", device);
    }
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int64_t before = now_ns();
      check(cudaEventRecord(reference.event, state.clock_stream),
            "recording a clock calibration event", device);
      check(cudaEventSynchronize(reference.event), "synchronizing a clock calibration event",
            device);
      const int64_t after = now_ns();
      reference.host_ns = before + (after - before) / 2;
      if (after - before <= kClockReferenceTightSpanNs) break;
    }
    reference.valid = true;
    state.newest_clock_reference = slot;
  }

  // Nanoseconds from completed event `from` to completed event `to` (negative if `to` came
  // first). Caller made `device` current.
  static int64_t ns_between(cudaEvent_t from, cudaEvent_t to, DeviceIndex device) {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, from, to), "measuring an event against the host clock", device);
    return std::llround(static_cast<double>(ms) * 1e6);
  }

  const uint64_t id_;
  int device_count_ = 0;
  std::unique_ptr<DeviceState[]> devices_;
  AllocationShard shards_[kAllocationShards];
};

}  // namespace

std::unique_ptr<Runtime> make_cuda_runtime() { return std::make_unique<CudaRuntime>(); }

bool cuda_runtime_usable(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    if (why != nullptr) *why = "cudaGetDeviceCount failed: " + cuda_error_text(status);
    return false;
  }
  if (count <= 0) {
    if (why != nullptr) *why = "cudaGetDeviceCount found no CUDA device";
    return false;
  }
  return true;
}

}  // namespace brick::runtime
