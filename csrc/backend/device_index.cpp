// Device identity, the floor every other backend file stands on: whether brick devices are
// backed by CUDA (decided once), which backing device backs a brick device, and the checks of a
// brick device index. Registration with PyTorch (device.cpp) stands on it, never the reverse.
#include "backend/device_index.h"

#include <ATen/Context.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <atomic>
#include <mutex>
#include <optional>

#include "backend/autocast.h"

namespace brick::backend {

namespace detail {

std::atomic<int8_t> g_cuda_backing{-1};
std::atomic<void (*)(bool)> g_backing_setup{nullptr};

bool decide_cuda_backing() {
  // Two threads' first ops may ask at once: one decides, the other waits for its answer.
  static std::mutex deciding;
  std::lock_guard<std::mutex> lock(deciding);
  const int8_t known = g_cuda_backing.load(std::memory_order_relaxed);
  if (known >= 0) return known != 0;
  const bool is_cuda = rt().backing_kind() == runtime::BackingKind::Cuda;
  // PyTorch's CUDA side (its caching allocator above all) must be initialized before brick
  // allocates through it: c10::GetAllocator(CUDA)->allocate() on an uninitialized device fails
  // ("Allocator not initialized for device N: did you call init?"). torch.cuda does the same
  // lazily (torch.cuda.init, CUDAHooks::init); it runs once per process, before the answer is
  // published, so no brick op can reach CUDA first.
  if (is_cuda) at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  if (auto setup = g_backing_setup.load(std::memory_order_acquire)) setup(is_cuda);
  // Autocast on brick casts as the backing device's autocast does (before any brick tensor
  // exists: the first one is allocated after this answer).
  install_autocast_policy(is_cuda);
  g_cuda_backing.store(is_cuda ? 1 : 0, std::memory_order_relaxed);
  return is_cuda;
}

void set_backing_setup(void (*setup)(bool is_cuda)) {
  g_backing_setup.store(setup, std::memory_order_release);
}

c10::Device backing_cuda_device(c10::DeviceIndex brick_index) {
  return c10::Device(c10::DeviceType::CUDA,
                     static_cast<c10::DeviceIndex>(rt().backing_device_index(brick_index)));
}

}  // namespace detail

void check_device_index(c10::DeviceIndex index, const char* op) {
  const int count = rt().device_count();
  TORCH_CHECK(index >= 0 && index < count, "brick: ", op != nullptr ? op : "",
              op != nullptr ? ": " : "", "device index ", static_cast<int>(index),
              " is out of range: there are ", count, " brick device(s), valid indices are 0..",
              count - 1, " (the host runtime's count is set by BRICK_HOST_DEVICES)");
}

std::vector<int> devices_in_use() {
  std::vector<int> used;
  const auto& hooks = at::detail::getPrivateUse1Hooks();
  for (int index = 0; index < rt().device_count(); ++index) {
    if (hooks.hasPrimaryContext(static_cast<c10::DeviceIndex>(index))) used.push_back(index);
  }
  return used;
}

c10::DeviceIndex resolve_device_index(c10::DeviceIndex index) {
  if (index < 0) return static_cast<c10::DeviceIndex>(rt().current_device());
  check_device_index(index);
  return index;
}

c10::DeviceIndex factory_device_index(std::optional<c10::Device> device, const char* op) {
  if (!device.has_value() || device->index() < 0) {
    return static_cast<c10::DeviceIndex>(rt().current_device());
  }
  TORCH_CHECK(device->type() == kBrick, "brick: ", op, " expected a brick device, got ", *device);
  check_device_index(device->index(), op);
  return device->index();
}

void check_strided_layout(std::optional<c10::Layout> layout, const char* op) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "brick: ", op,
              " supports only the strided layout, got ", *layout);
}

}  // namespace brick::backend
