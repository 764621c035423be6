// Helpers shared by the runtime suites, and the runtime kinds the contract suite runs against.
//
// A kind knows how to make its runtime and how the layer above gets what that runtime does not
// make itself, the way the backend gets it: the host runtime creates streams and allocates
// memory; on CUDA both come from elsewhere (PyTorch's stream pool and caching allocator, here
// cudaStreamCreate and cudaMalloc), streams registered with stream_from_native.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/runtime.h"
#include "test_util.h"

#if BRICK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace brick::test {

using runtime::BackingKind;
using runtime::DeviceIndex;
using runtime::Error;
using runtime::Event;
using runtime::kDefaultStream;
using runtime::kMaxDevices;
using runtime::Runtime;
using runtime::StreamId;

// A fixture's tear-down: leaves the calling thread as a fresh runtime would find it (default
// streams, device 0, no work pending; see the thread-state tests), then releases what the kind
// made for the runtime and the runtime itself.
template <typename RuntimeKind>
void tear_down_runtime(std::unique_ptr<Runtime>& rt, RuntimeKind& kind) {
  if (rt == nullptr) return;
  for (int d = 0; d < rt->device_count(); ++d) rt->set_current_stream(d, kDefaultStream);
  rt->set_current_device(0);
  for (int d = 0; d < rt->device_count(); ++d) rt->synchronize_device(d);
  kind.release();
  rt.reset();
}

// Runs `fn`, expects it to throw brick::runtime::Error, and returns the message.
template <typename Fn>
std::string error_message(Fn&& fn) {
  return thrown_message<Error>(fn, "brick::runtime::Error");
}

// Runs `fn` on a fresh std::thread and waits for it.
template <typename Fn>
void on_other_thread(Fn&& fn) {
  std::thread thread(std::forward<Fn>(fn));
  thread.join();
}

struct EventDeleter {
  Runtime* runtime;
  void operator()(Event* event) const { runtime->destroy_event(event); }
};
using EventPtr = std::unique_ptr<Event, EventDeleter>;

inline EventPtr make_event(Runtime& rt, DeviceIndex device, bool timing) {
  return EventPtr(rt.create_event(device, timing), EventDeleter{&rt});
}

// ---- the host runtime ----

class HostRuntimeKind {
 public:
  static constexpr const char* kName = "host";
  static constexpr BackingKind kKind = BackingKind::Host;
  static constexpr bool kAsynchronous = false;
  static constexpr int kDevices = 3;
  // How far a measured interval may exceed the host's wall time around its events (their
  // records to the end one's completion), and the reversed interval may differ from the negated
  // one (host: every timestamp comes from the one steady clock).
  static constexpr double kElapsedOverWallMs = 0.0;
  static constexpr double kReversedElapsedToleranceMs = 0.0;
  static constexpr int kStreamsPerThread = 500;

  static bool usable(std::string* /*why*/) { return true; }
  static std::unique_ptr<Runtime> make() { return runtime::make_host_runtime(kDevices); }
  static int expected_device_count() { return kDevices; }
  static int expected_backing_index(DeviceIndex /*device*/) { return -1; }

  StreamId new_stream(Runtime& rt, DeviceIndex device, int priority = 0) {
    return rt.create_stream(device, priority);
  }

  // Brick memory of `device`, freed by release().
  void* device_memory(Runtime& rt, DeviceIndex device, size_t nbytes) {
    void* ptr = rt.allocate(device, nbytes);
    memory_.emplace_back(&rt, ptr);
    return ptr;
  }

  std::vector<unsigned char> read(Runtime& /*rt*/, DeviceIndex /*device*/, const void* ptr,
                                  size_t nbytes) {
    std::vector<unsigned char> bytes(nbytes);
    std::memcpy(bytes.data(), ptr, nbytes);
    return bytes;
  }

  // Work taking `ms` on `stream`: host work runs on the calling thread.
  void run_work(Runtime& /*rt*/, DeviceIndex /*device*/, StreamId /*stream*/, int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }

  // Frees what this kind made; the runtimes it was made with must still be alive.
  void release() {
    for (auto& [rt, ptr] : memory_) rt->deallocate(ptr);
    memory_.clear();
  }

 private:
  std::vector<std::pair<Runtime*, void*>> memory_;
};

// ---- the CUDA runtime ----

#if BRICK_WITH_CUDA

// Fails the calling test, naming the call and CUDA's error, when a CUDA call in it fails.
#define ASSERT_CUDA(expr)                                                \
  do {                                                                   \
    const cudaError_t assert_cuda_status = (expr);                       \
    ASSERT_EQ(assert_cuda_status, cudaSuccess)                           \
        << #expr << ": " << cudaGetErrorName(assert_cuda_status) << ": " \
        << cudaGetErrorString(assert_cuda_status);                       \
  } while (0)

// Throws (failing the test) when a CUDA call of a test helper fails.
inline void cuda_or_throw(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(status) + ": " +
                             cudaGetErrorString(status));
  }
}

// Makes a CUDA device current for a scope, then restores the previous one.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device) {
    cuda_or_throw(cudaGetDevice(&previous_), "cudaGetDevice");
    cuda_or_throw(cudaSetDevice(device), "cudaSetDevice");
  }
  ~CudaDeviceScope() { (void)cudaSetDevice(previous_); }
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  int previous_ = 0;
};

inline void CUDART_CB sleep_host_fn(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::intptr_t>(ms)));
}

// Queues a host-side sleep of `ms` on `stream`: work queued after it starts `ms` later.
inline cudaError_t enqueue_sleep(cudaStream_t stream, int ms) {
  return cudaLaunchHostFunc(stream, sleep_host_fn,
                            reinterpret_cast<void*>(static_cast<std::intptr_t>(ms)));
}

class CudaRuntimeKind {
 public:
  static constexpr const char* kName = "cuda";
  static constexpr BackingKind kKind = BackingKind::Cuda;
  static constexpr bool kAsynchronous = true;
  // (the GPU's timer against the host's clock: microseconds over a test's milliseconds)
  static constexpr double kElapsedOverWallMs = 1.0;
  // cudaEventElapsedTime measures each direction on its own, in float milliseconds.
  static constexpr double kReversedElapsedToleranceMs = 0.01;
  static constexpr int kStreamsPerThread = 50;

  static bool usable(std::string* why) { return runtime::cuda_runtime_usable(why); }
  static std::unique_ptr<Runtime> make() { return runtime::make_cuda_runtime(); }
  static int expected_device_count() {
    int count = 0;
    cuda_or_throw(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    return std::min(count, kMaxDevices);
  }
  static int expected_backing_index(DeviceIndex device) { return device; }

  CudaRuntimeKind() = default;
  CudaRuntimeKind(const CudaRuntimeKind&) = delete;
  CudaRuntimeKind& operator=(const CudaRuntimeKind&) = delete;
  ~CudaRuntimeKind() { release(); }

  // A CUDA stream of `device` made as PyTorch's pool makes them (non-blocking), registered.
  StreamId new_stream(Runtime& rt, DeviceIndex device, int priority = 0) {
    return register_stream(rt, device,
                           create_native_stream(device, cudaStreamNonBlocking, priority));
  }

  // A CUDA stream of `device`, destroyed by release().
  cudaStream_t create_native_stream(DeviceIndex device, unsigned flags, int priority = 0) {
    CudaDeviceScope scope(device);
    cudaStream_t handle = nullptr;
    cuda_or_throw(cudaStreamCreateWithPriority(&handle, flags, priority),
                  "cudaStreamCreateWithPriority");
    std::lock_guard<std::mutex> lock(mutex_);
    streams_.push_back({device, handle});
    return handle;
  }

  StreamId register_stream(Runtime& rt, DeviceIndex device, cudaStream_t handle) {
    const StreamId id = rt.stream_from_native(device, handle);
    std::lock_guard<std::mutex> lock(mutex_);
    handles_[{&rt, device, id}] = handle;
    return id;
  }

  // The CUDA stream behind brick stream `stream` (the default one, or one registered here).
  cudaStream_t native(Runtime& rt, DeviceIndex device, StreamId stream) {
    if (stream == kDefaultStream) return cudaStreamLegacy;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = handles_.find({&rt, device, stream});
    if (it == handles_.end()) throw std::runtime_error("stream not registered by the test kind");
    return it->second;
  }

  // Device memory of `device`, freed by release().
  void* device_memory(Runtime& /*rt*/, DeviceIndex device, size_t nbytes) {
    CudaDeviceScope scope(device);
    void* ptr = nullptr;
    cuda_or_throw(cudaMalloc(&ptr, nbytes), "cudaMalloc");
    std::lock_guard<std::mutex> lock(mutex_);
    memory_.push_back({device, ptr});
    return ptr;
  }

  // Reads device memory back once every stream of `device` is done with it.
  std::vector<unsigned char> read(Runtime& /*rt*/, DeviceIndex device, const void* ptr,
                                  size_t nbytes) {
    CudaDeviceScope scope(device);
    cuda_or_throw(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<unsigned char> bytes(nbytes);
    cuda_or_throw(cudaMemcpy(bytes.data(), ptr, nbytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return bytes;
  }

  // Work taking `ms` on `stream`: a host function holding the stream. (The legacy stream handle
  // names the current device's, so `device` is made current.)
  void run_work(Runtime& rt, DeviceIndex device, StreamId stream, int ms) {
    const cudaStream_t handle = native(rt, device, stream);
    CudaDeviceScope scope(device);
    cuda_or_throw(enqueue_sleep(handle, ms), "cudaLaunchHostFunc");
  }

  // Frees what this kind made (never throws: it runs in the destructor too).
  void release() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    int previous = 0;
    (void)cudaGetDevice(&previous);
    for (auto& [device, ptr] : memory_) {
      if (cudaSetDevice(device) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess) {
        (void)cudaFree(ptr);
      }
    }
    for (auto& [device, handle] : streams_) {
      if (cudaSetDevice(device) == cudaSuccess) {
        (void)cudaStreamSynchronize(handle);
        (void)cudaStreamDestroy(handle);
      }
    }
    (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
    memory_.clear();
    streams_.clear();
    handles_.clear();
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<DeviceIndex, void*>> memory_;
  std::vector<std::pair<DeviceIndex, cudaStream_t>> streams_;
  std::map<std::tuple<const Runtime*, DeviceIndex, StreamId>, cudaStream_t> handles_;
};

#endif  // BRICK_WITH_CUDA

// Work taking at least `work` on the default stream of `device`, whichever runtime the process
// has: on CUDA a host function holding the stream (queued: it runs after the call returns); on
// the host runtime, whose device work runs on the calling thread, a spin.
inline void device_work(Runtime& rt, DeviceIndex device, std::chrono::microseconds work) {
  if (work.count() <= 0) return;
#if BRICK_WITH_CUDA
  if (rt.backing_kind() == BackingKind::Cuda) {
    if (rt.current_stream(device) != kDefaultStream) {
      throw std::runtime_error("device_work queues on the default stream only");
    }
    CudaDeviceScope scope(device);
    const int ms = static_cast<int>((work.count() + 999) / 1000);
    cuda_or_throw(enqueue_sleep(cudaStreamLegacy, ms), "cudaLaunchHostFunc");
    return;
  }
#endif
  (void)rt;
  (void)device;
  const auto until = std::chrono::steady_clock::now() + work;
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace brick::test
