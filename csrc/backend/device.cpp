// PrivateUse1 registration: the device guard, the generator and the hooks.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

// torch.accelerator.get_device_capability() (PyTorch 2.10+) asks the device guard.
#if __has_include(<c10/core/DeviceCapability.h>)
#include <c10/core/DeviceCapability.h>
#define BRICK_HAS_DEVICE_CAPABILITY 1
#else
#define BRICK_HAS_DEVICE_CAPABILITY 0
#endif

#include "backend/allocator.h"
#include "backend/backing.h"
#include "backend/backing_graph.h"
#include "backend/cpu_stubs.h"
#include "backend/device_index.h"
#include "backend/errors.h"
#include "backend/fallback.h"
#include "backend/generator.h"
#include "backend/pinned_memory.h"
#include "backend/registration.h"

namespace brick::backend {

namespace {

runtime::Event* as_event(void* event) { return static_cast<runtime::Event*>(event); }

c10::Stream make_stream(c10::DeviceIndex device, runtime::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kBrick, device), id);
}

class BrickGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  BrickGuardImpl() = default;
  explicit BrickGuardImpl(c10::DeviceType type) {
    TORCH_CHECK(type == kBrick, "brick: a device guard for ", type, " was requested");
  }

  c10::DeviceType type() const override { return kBrick; }

  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    if (old.index() != device.index()) setDevice(device);
    return old;
  }

  c10::Device getDevice() const override {
    return c10::Device(kBrick, static_cast<c10::DeviceIndex>(rt().current_device()));
  }

  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kBrick, "brick: expected a brick device, got ", device);
    check_device_index(device.index());
    rt().set_current_device(device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    try {
      rt().set_current_device(device.index());
    } catch (...) {
      // Restoring a device that was valid when saved cannot fail; nothing else to do here.
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    const auto index = resolve_device_index(device.index());
    return make_stream(index, runtime_call([&] { return rt().current_stream(index); }));
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return make_stream(resolve_device_index(device.index()), runtime::kDefaultStream);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool is_high_priority) const override {
    const auto index = resolve_device_index(device.index());
    return make_stream(index, pooled_brick_stream(index, is_high_priority));
  }

  c10::Stream getNewStream(c10::Device device, int priority) const override {
    const auto index = resolve_device_index(device.index());
    return make_stream(index, new_brick_stream(index, priority));
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    const auto index = resolve_device_index(stream.device_index());
    const c10::Stream old = make_stream(index, rt().current_stream(index));
    BRICK_RUNTIME_CALL(rt().set_current_stream(index, stream.id()));
    return old;
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    if (event != nullptr) rt().destroy_event(as_event(event));
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "brick: event device index ", static_cast<int>(device_index),
                " does not match the recording stream's device ", stream.device());
    if (*event == nullptr) {
      *event = runtime_call([&] {
        return rt().create_event(stream.device_index(), flag == c10::EventFlag::BACKEND_DEFAULT);
      });
    }
    BRICK_RUNTIME_CALL(rt().record_event(as_event(*event), stream.device_index(), stream.id()));
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;  // waiting on an event never recorded is a no-op, as in CUDA
    BRICK_RUNTIME_CALL(rt().stream_wait_event(stream.device_index(), stream.id(), as_event(event)));
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    return runtime_call([&] { return rt().query_event(as_event(event)); });
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(rt().device_count());
    } catch (...) {
      return 0;  // a misconfigured runtime has no usable device; import reports why
    }
  }

  bool queryStream(const c10::Stream& stream) const override {
    return runtime_call([&] { return rt().query_stream(stream.device_index(), stream.id()); });
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    BRICK_RUNTIME_CALL(rt().synchronize_stream(stream.device_index(), stream.id()));
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    BRICK_RUNTIME_CALL(rt().synchronize_event(as_event(event)));
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    BRICK_RUNTIME_CALL(rt().synchronize_device(resolve_device_index(device_index)));
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const c10::Stream& stream) const override {
    record_stream_use(data_ptr, stream.device_index(), stream.id());
  }

#if BRICK_HAS_DEVICE_CAPABILITY
  // The backing device's: every dtype on the host (the CPU's kernels take them all), CUDA's
  // answer for the GPU on CUDA backing.
  c10::DeviceCapability getDeviceCapability(c10::Device device) const override {
    const auto index = resolve_device_index(device.index());
    if (!cuda_backing()) return c10::DeviceCapability();
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
        ->getDeviceCapability(backing_device(index));
  }
#endif

  double elapsedTime(void* start, void* end,
                     const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "brick: elapsed_time needs both events to be recorded first");
    return runtime_call([&] { return rt().elapsed_ms(as_event(start), as_event(end)); });
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, BrickGuardImpl);

struct BrickHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return rt().device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    if (!cuda_backing()) return true;
    return at::detail::getCUDAHooks().hasPrimaryContext(
        static_cast<c10::DeviceIndex>(rt().backing_device_index(device_index)));
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return brick_default_generator(device_index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return at::make_generator<BrickGenerator>(resolve_device_index(device_index),
                                              c10::default_rng_seed_val);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    TORCH_CHECK(cuda_backing(),
                "brick: cannot infer the device of a raw pointer on the host runtime; pass "
                "device= explicitly");
    const c10::Device cuda = at::detail::getCUDAHooks().getDeviceFromPtr(data);
    for (int index = 0; index < rt().device_count(); ++index) {
      if (rt().backing_device_index(index) == cuda.index()) {
        return c10::Device(kBrick, static_cast<c10::DeviceIndex>(index));
      }
    }
    TORCH_CHECK(false, "brick: pointer ", data, " is on ", cuda, ", which backs no brick device");
  }

  bool isPinnedPtr(const void* data) const override {
    if (cuda_backing()) return at::detail::getCUDAHooks().isPinnedPtr(data);
    return is_host_pinned(data);
  }

  c10::Allocator* getPinnedMemoryAllocator() const override {
    // On CUDA, page-locked host memory comes from PyTorch's CUDA host allocator, as for
    // torch.cuda; on the host runtime, from brick's pinned host allocator (pinned_memory.cpp).
    if (cuda_backing()) return at::detail::getCUDAHooks().getPinnedMemoryAllocator();
    return host_pinned_allocator();
  }

  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(rt().device_count());
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_device_index(device);
    rt().set_current_device(device);
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return static_cast<c10::DeviceIndex>(rt().current_device());
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = getCurrentDevice();
    if (device != old) setCurrentDevice(device);
    return old;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_nbytes) const override {
    resize_brick_storage_bytes(storage, new_nbytes);
  }
};

}  // namespace

void ensure_registered() {
  static const bool registered = [] {
    configure_runtime_backing();  // before the runtime's first use, which picks its backing
    // A bad setting fails at import with the runtime's own message; the runtime itself is
    // created on first use, so importing brick initializes no device.
    BRICK_RUNTIME_CALL(runtime::validate_runtime_environment());
    // Hooks must outlive every user: intentionally never freed.
    at::RegisterPrivateUse1HooksInterface(new BrickHooks());
    c10::SetAllocator(kBrick, brick_allocator());
    register_direct_fallback_kernels();
    register_layout_fallback_kernels();
    detail::set_backing_setup([](bool is_cuda) {
      if (is_cuda) {
        register_cuda_backing_kernels();
      } else {
        register_host_backing_kernels();
        use_the_cpus_stubs();
      }
    });
    return true;
  }();
  (void)registered;
}

}  // namespace brick::backend
