// The CUDA runtime (cuda_runtime_impl.h): construction, memory (none: refused, saying why),
// copies and streams; and choosing it (make_cuda_runtime, cuda_runtime_usable).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "runtime/cuda_runtime_impl.h"
#include "runtime/cuda_support.h"
#include "runtime/runtime.h"

namespace brick::runtime::cuda_detail {

CudaRuntime::CudaRuntime() {
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

CudaRuntime::~CudaRuntime() {
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

void CudaRuntime::set_current_device(DeviceIndex device) {
  check_device(device);
  state().device = device;  // brick's own: CUDA's current device is set per call
}

// ---- memory: none (see cuda_runtime_impl.h); what the host runtime serves fails clearly ----

void* CudaRuntime::allocate(DeviceIndex device, size_t nbytes) {
  check_device(device);
  throw Error("brick: the CUDA runtime allocates no memory (asked for " + std::to_string(nbytes) +
              " bytes on " + device_label(device) +
              "): on CUDA backing, brick memory comes from PyTorch's CUDA caching allocator");
}

Runtime::Released CudaRuntime::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return {0, -1};
  // Nothing can be this runtime's: continuing could free memory someone else owns.
  std::fprintf(stderr,
               "brick: fatal: deallocate(%p): the CUDA runtime allocates no memory, so this "
               "pointer is not its to free\n",
               ptr);
  std::abort();
}

void CudaRuntime::record_stream(void* ptr, DeviceIndex device, StreamId stream) {
  check_device(device);
  (void)stream_handle(device, stream);  // validates
  if (ptr == nullptr) return;           // a zero-byte allocation: nothing to keep alive
  throw Error("brick: record_stream: " + pointer_text(ptr) +
              " is not memory of the CUDA runtime, which allocates none (PyTorch's CUDA "
              "caching allocator has its own record_stream)");
}

void CudaRuntime::copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
                       size_t nbytes) {
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

StreamId CudaRuntime::create_stream(DeviceIndex device, int priority) {
  check_device(device);
  throw Error("brick: the CUDA runtime creates no streams (asked for one of priority " +
              std::to_string(priority) + " on " + device_label(device) +
              "): brick streams on CUDA backing are PyTorch's CUDA streams, registered with "
              "stream_from_native");
}

StreamId CudaRuntime::current_stream(DeviceIndex device) const {
  check_device(device);
  return state().streams[device];
}

void CudaRuntime::set_current_stream(DeviceIndex device, StreamId stream) {
  check_device(device);
  (void)stream_handle(device, stream);  // validates
  state().streams[device] = stream;
}

bool CudaRuntime::query_stream(DeviceIndex device, StreamId stream) {
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

void CudaRuntime::synchronize_stream(DeviceIndex device, StreamId stream) {
  check_device(device);
  const cudaStream_t handle = stream_handle(device, stream);
  DeviceGuard guard(device);
  refuse_if_capturing(handle, device, stream, "synchronize");
  const cudaError_t status = cudaStreamSynchronize(handle);
  if (status != cudaSuccess) {
    throw_cuda(status, "synchronizing stream " + std::to_string(stream), device);
  }
}

void CudaRuntime::synchronize_device(DeviceIndex device) {
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

StreamId CudaRuntime::stream_from_native(DeviceIndex device, void* native) {
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

bool CudaRuntime::is_capturing(DeviceIndex device, StreamId stream) {
  check_device(device);
  const cudaStream_t handle = stream_handle(device, stream);
  DeviceGuard guard(device);
  return capture_active(handle, device);
}

cudaStream_t CudaRuntime::stream_handle(DeviceIndex device, StreamId stream) const {
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

cudaStream_t CudaRuntime::current_stream_handle(DeviceIndex device) const {
  return stream_handle(device, state().streams[device]);
}

StreamId CudaRuntime::register_stream(DeviceIndex device, cudaStream_t handle) {
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

bool CudaRuntime::capture_active(cudaStream_t handle, DeviceIndex device) {
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

std::vector<cudaStream_t> CudaRuntime::capturing_streams(DeviceIndex device) const {
  std::vector<cudaStream_t> capturing;
  const StreamId count = devices_[device].stream_count.load(std::memory_order_acquire);
  for (StreamId id = 0; id < count; ++id) {
    const cudaStream_t handle = stream_handle(device, id);
    if (capture_active(handle, device)) capturing.push_back(handle);
  }
  return capturing;
}

void CudaRuntime::refuse_if_capturing(cudaStream_t handle, DeviceIndex device, StreamId stream,
                                      const char* verb) {
  if (capture_active(handle, device)) {
    throw Error(std::string("brick: cannot ") + verb + " stream " + std::to_string(stream) +
                " of " + device_label(device) +
                " while it is being captured into a CUDA graph (that would invalidate the "
                "capture)");
  }
}

}  // namespace brick::runtime::cuda_detail

namespace brick::runtime {

std::unique_ptr<Runtime> make_cuda_runtime() {
  return std::make_unique<cuda_detail::CudaRuntime>();
}

bool cuda_runtime_usable(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    if (why != nullptr) *why = "cudaGetDeviceCount failed: " + cuda_detail::cuda_error_text(status);
    return false;
  }
  if (count <= 0) {
    if (why != nullptr) *why = "cudaGetDeviceCount found no CUDA device";
    return false;
  }
  return true;
}

}  // namespace brick::runtime
