// Device identity, the floor every other backend file stands on: whether brick devices are
// backed by CUDA (decided once), which backing device backs a brick device, the checks of a brick
// device index, and the current brick device for a scope.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/Layout.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/runtime.h"

namespace brick::backend {

constexpr c10::DeviceType kBrick = c10::DeviceType::PrivateUse1;

inline runtime::Runtime& rt() { return runtime::get(); }

namespace detail {
// 1 when brick devices are backed by CUDA devices, 0 when by the host, -1 until first asked.
extern std::atomic<int8_t> g_cuda_backing;
bool decide_cuda_backing();
// What the backing decision adds to brick's kernels once it is made, before the answer is
// published (installed by registration, so that this floor calls nothing above it).
void set_backing_setup(void (*setup)(bool is_cuda));
c10::Device backing_cuda_device(c10::DeviceIndex brick_index);
}  // namespace detail

// True when brick devices are backed by CUDA devices (decided once, when the runtime starts).
// Inline, like the three below: every op asks, several times.
inline bool cuda_backing() {
  const int8_t known = detail::g_cuda_backing.load(std::memory_order_relaxed);
  if (known >= 0) [[likely]]
    return known != 0;
  return detail::decide_cuda_backing();
}

// The device type whose kernels execute brick ops (CPU for the host runtime, CUDA for the CUDA
// runtime).
inline c10::DeviceType backing_device_type() {
  return cuda_backing() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
}
inline c10::Device backing_device(c10::DeviceIndex brick_index) {
  if (!cuda_backing()) return c10::Device(c10::DeviceType::CPU);
  return detail::backing_cuda_device(brick_index);
}
// The dispatch key of the backing device's kernels (CPU or CUDA), as a key set.
inline c10::DispatchKeySet backing_dispatch_key_set() {
  return c10::DispatchKeySet(cuda_backing() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU);
}

// Throws a c10::Error naming the device (and `op`, when given) when `index` is not a brick
// device.
void check_device_index(c10::DeviceIndex index, const char* op = nullptr);
// -1 means the calling thread's current brick device.
c10::DeviceIndex resolve_device_index(c10::DeviceIndex index);

// The brick devices this process has used: every one on the host; on CUDA backing those whose
// GPU has a context. Code that visits every device (synchronizing around a profile, draining
// autograd threads) visits these, so it creates no CUDA context on another GPU.
std::vector<int> devices_in_use();

// The brick device a factory op (`op`, for errors) makes its tensor on: its `device=` argument,
// which must be a brick device, or the current brick device for none or one without an index.
c10::DeviceIndex factory_device_index(std::optional<c10::Device> device, const char* op);
// Throws unless `layout` is none or strided: brick's dense kernels make strided tensors (a sparse
// layout asked for reaches brick's sparse keys instead, layouts.h).
void check_strided_layout(std::optional<c10::Layout> layout, const char* op);

// Makes `device` the calling thread's current brick device for a scope; restores the previous
// one on exit, also when an exception leaves the scope. A negative device changes nothing.
class DeviceScope {
 public:
  [[gnu::always_inline]] explicit DeviceScope(int device) : previous_(rt().current_device()) {
    if (device >= 0 && device != previous_) [[unlikely]]
      rt().set_current_device(device);
  }
  [[gnu::always_inline]] ~DeviceScope() {
    if (rt().current_device() != previous_) [[unlikely]]
      rt().set_current_device(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_;
};

}  // namespace brick::backend
