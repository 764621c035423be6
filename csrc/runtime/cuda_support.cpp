// The CUDA runtime's helpers: error text, and primary contexts through the driver's entry points.
#include "runtime/cuda_support.h"

#include <cuda.h>  // driver types for the primary-context query, looked up through cudart
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "runtime/runtime.h"

namespace brick::runtime::cuda_detail {

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

namespace {

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

}  // namespace

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

}  // namespace brick::runtime::cuda_detail
