// The CUDA runtime: brick device N is CUDA device N.
//
// Plain C++ over the CUDA runtime API (no kernels). What it maps to CUDA:
// - Stream 0 of every device is the CUDA legacy default stream, the stream PyTorch's default
//   CUDA stream is, so brick work on it orders with plain `cuda` work. Every other brick stream
//   is a CUDA stream made elsewhere (PyTorch's, on CUDA backing) and registered on first sight
//   by stream_from_native; the runtime creates none.
// - Memory: none. Brick memory on CUDA backing is PyTorch's CUDA caching allocator's, which the
//   backend adopts (Runtime::record_adopted); the runtime copies into it on brick's streams.
// - Events are CUDA events; their completion times are placed on the host clock through
//   per-device reference events.
// - The current device and streams are brick's own per-thread state. CUDA's current device is
//   changed only inside a call that needs it and restored before the call returns.
#include <cuda.h>  // driver types for the primary-context query, looked up through cudart
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/steady_clock.h"
#include "runtime/runtime.h"
#include "runtime/thread_state.h"

namespace brick::runtime {
namespace {

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
  // Last recorded on a stream that was being captured into a CUDA graph: legal (it orders the
  // capture's streams, as a side stream's fork and join do), but such an event cannot be
  // queried, synchronized or timed until it is recorded again outside a capture.
  std::atomic<bool> recorded_in_capture{false};
};

CudaEvent* as_cuda(Event* event) noexcept { return static_cast<CudaEvent*>(event); }

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
constexpr int64_t kClockReferenceTightSpanNs = 10'000;
constexpr int kClockReferenceAttempts = 5;

struct DeviceState {
  // Streams. `stream_count` publishes entries; registration happens under `streams_mutex`.
  std::atomic<StreamId> stream_count{0};
  std::atomic<StreamChunk*> stream_chunks[kStreamChunks] = {};
  std::mutex streams_mutex;
  std::unordered_map<cudaStream_t, StreamId> ids_by_handle;  // non-default streams
  // Calibration of device event times against the host clock.
  std::mutex clock_mutex;
  cudaStream_t clock_stream = nullptr;  // idle, so a reference completes as soon as it is queued
  std::array<ClockReference, kClockReferences> clock_references;
  int newest_clock_reference = -1;
};

// ---- the runtime -----------------------------------------------------------------------------

class CudaRuntime final : public Runtime {
 public:
  CudaRuntime() {
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
      // Only then: making a device current would create a context on a GPU never used.
      if (state.clock_stream != nullptr) {
        DeviceGuard guard(device, std::nothrow);
        if (guard.ok()) {
          for (const ClockReference& reference : state.clock_references) {
            if (reference.event != nullptr) (void)cudaEventDestroy(reference.event);
          }
          (void)cudaStreamDestroy(state.clock_stream);
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

  void set_current_device(DeviceIndex device) override {
    check_device(device);
    state().device = device;  // brick's own: CUDA's current device is set per call
  }

  // ---- memory: none (see the top of the file); what the host runtime serves fails clearly ----

  void* allocate(DeviceIndex device, size_t nbytes) override {
    check_device(device);
    throw Error("brick: the CUDA runtime allocates no memory (asked for " + std::to_string(nbytes) +
                " bytes on " + device_label(device) +
                "): on CUDA backing, brick memory comes from PyTorch's CUDA caching allocator");
  }

  Released deallocate(void* ptr) noexcept override {
    if (ptr == nullptr) return {0, -1};
    // Nothing can be this runtime's: continuing could free memory someone else owns.
    std::fprintf(stderr,
                 "brick: fatal: deallocate(%p): the CUDA runtime allocates no memory, so this "
                 "pointer is not its to free\n",
                 ptr);
    std::abort();
  }

  void record_stream(void* ptr, DeviceIndex device, StreamId stream) override {
    check_device(device);
    (void)stream_handle(device, stream);  // validates
    if (ptr == nullptr) return;           // a zero-byte allocation: nothing to keep alive
    throw Error("brick: record_stream: " + pointer_text(ptr) +
                " is not memory of the CUDA runtime, which allocates none (PyTorch's CUDA "
                "caching allocator has its own record_stream)");
  }

  void copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
            size_t nbytes) override {
    check_copy(dst, dst_device, src, src_device, nbytes);
    if (nbytes == 0) return;
    const DeviceIndex device = dst_device;
    const cudaStream_t stream = current_stream_handle(device);
    DeviceGuard guard(device);
    const bool from_host = src_device < 0;
    const std::string what = std::string(from_host ? "a host-to-device" : "a device-to-device") +
                             " copy of " + std::to_string(nbytes) + " bytes";
    if (from_host && capture_active(stream, device)) {
      throw Error("brick: " + what + " on " + device_label(device) +
                  " cannot run while the current stream is being captured into a CUDA graph (it "
                  "must synchronize with the host)");
    }
    cudaError_t status = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream);
    if (status != cudaSuccess) throw_cuda(status, what, device);
    if (!from_host) return;
    // Host memory may be pageable and is the caller's again once copy() returns.
    status = cudaStreamSynchronize(stream);
    if (status != cudaSuccess) throw_cuda(status, "waiting for " + what, device);
  }

  // ---- streams ----

  StreamId create_stream(DeviceIndex device, int priority) override {
    check_device(device);
    throw Error("brick: the CUDA runtime creates no streams (asked for one of priority " +
                std::to_string(priority) + " on " + device_label(device) +
                "): brick streams on CUDA backing are PyTorch's CUDA streams, registered with "
                "stream_from_native");
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
    const std::vector<cudaStream_t> capturing = capturing_streams(device);
    if (capturing.empty()) {
      check(cudaDeviceSynchronize(), "synchronizing the device", device);
      return;
    }
    // A CUDA graph is being captured on the device (perhaps by another thread): a device-wide
    // synchronize would invalidate that capture. Every other stream brick knows is drained
    // instead; the capturing ones run nothing until their graph is launched.
    RelaxedCaptureMode relaxed;
    const StreamId count = devices_[device].stream_count.load(std::memory_order_acquire);
    for (StreamId id = 0; id < count; ++id) {
      const cudaStream_t handle = stream_handle(device, id);
      if (std::find(capturing.begin(), capturing.end(), handle) != capturing.end()) continue;
      const cudaError_t status = cudaStreamSynchronize(handle);
      if (status != cudaSuccess) {
        throw_cuda(status, "synchronizing stream " + std::to_string(id), device);
      }
    }
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
    // Recording inside a capture is legal and orders the capture's streams; what such an event
    // cannot do (be queried, synchronized, timed) is refused when asked.
    const bool in_capture = capture_active(handle, device);
    check(cudaEventRecord(event->handle, handle), "recording an event", device);
    event->recorded_in_capture.store(in_capture, std::memory_order_release);
    event->recorded.store(true, std::memory_order_release);
  }

  bool query_event(Event* base) override {
    CudaEvent* event = as_cuda(base);
    if (!event->recorded.load(std::memory_order_acquire)) return true;  // as CUDA
    refuse_if_recorded_in_capture(*event, "queried");
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
    refuse_if_recorded_in_capture(*event, "synchronized");
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
    refuse_if_recorded_in_capture(*start, "timed");
    refuse_if_recorded_in_capture(*end, "timed");
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

  int64_t event_host_time_ns(Event* base) override {
    CudaEvent* event = as_cuda(base);
    if (!event->timing || !event->recorded.load(std::memory_order_acquire)) return -1;
    refuse_if_recorded_in_capture(*event, "timed");
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
        steady_ns() - state.clock_references[state.newest_clock_reference].host_ns >
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
                  std::to_string(device) + " (" + std::to_string(count) + " stream(s) registered)");
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
                  " streams, the most one device can have; registered streams stay for the "
                  "life of the process, so reuse them (e.g. from a pool)");
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

  // The streams of `device` brick knows (its registered ones, the legacy default stream
  // included) that are being captured into a CUDA graph now. Caller made the device current.
  std::vector<cudaStream_t> capturing_streams(DeviceIndex device) const {
    std::vector<cudaStream_t> capturing;
    const StreamId count = devices_[device].stream_count.load(std::memory_order_acquire);
    for (StreamId id = 0; id < count; ++id) {
      const cudaStream_t handle = stream_handle(device, id);
      if (capture_active(handle, device)) capturing.push_back(handle);
    }
    return capturing;
  }

  static void refuse_if_recorded_in_capture(const CudaEvent& event, const char* what) {
    if (event.recorded_in_capture.load(std::memory_order_acquire)) {
      throw Error(std::string("brick: an event recorded while its stream was being captured "
                              "into a CUDA graph cannot be ") +
                  what + " (record it again outside the capture); on " +
                  device_label(event.device));
    }
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
    // The event's timestamp lies between the host times just before its record and just after
    // it is seen complete; the reference is that window's midpoint, so its error is at most half
    // the window. Polling (not a blocking synchronize, whose wake-up can take tens of µs) keeps
    // the window short; a wide one (the thread was preempted) is measured again.
    for (int attempt = 0; attempt < kClockReferenceAttempts; ++attempt) {
      const int64_t before = steady_ns();
      check(cudaEventRecord(reference.event, state.clock_stream),
            "recording a clock calibration event", device);
      cudaError_t status = cudaErrorNotReady;
      while ((status = cudaEventQuery(reference.event)) == cudaErrorNotReady) {
      }
      (void)cudaGetLastError();  // the polls' "not ready" must not reach PyTorch's next check
      check(status, "waiting for a clock calibration event", device);
      const int64_t after = steady_ns();
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

  int device_count_ = 0;
  std::unique_ptr<DeviceState[]> devices_;
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
