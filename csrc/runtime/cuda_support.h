// The CUDA runtime's helpers over the CUDA runtime API: error text and checks, whether a device
// has a primary context, a guard that makes a device current for one call, and relaxed capture
// mode. Private to the runtime layer (cuda_runtime*.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <new>
#include <string>

#include "runtime/runtime.h"

namespace brick::runtime::cuda_detail {

// "cudaErrorX: its description".
std::string cuda_error_text(cudaError_t error);

// "brick:N (cuda:N)".
std::string device_label(DeviceIndex device);

std::string pointer_text(const void* ptr);

// Throws Error naming `what`, the device and the CUDA error (and clears CUDA's last error).
[[noreturn]] void throw_cuda(cudaError_t error, const std::string& what, DeviceIndex device);

inline void check(cudaError_t error, const char* what, DeviceIndex device) {
  if (error != cudaSuccess) [[unlikely]]
    throw_cuda(error, what, device);
}

// Whether CUDA device `device` has an initialized primary context. Unknown counts as yes.
bool primary_context_active(int device) noexcept;

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

}  // namespace brick::runtime::cuda_detail
