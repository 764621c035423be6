// One call of the backing device's kernel as a brick op's device work: the one way every brick
// kernel (direct kernels, the boxed fallback, copies, convolution, attention, the RNN cells) runs
// on the backing device.
//
// A call announces its launch (launch.h), settles the brick device and enters it on the backing
// device (BackingScope: brick's current device, and on CUDA backing PyTorch's current CUDA device
// and stream), lends backing aliases of brick arguments for its duration (alias_pool.h), runs the
// kernel with failures named (which brick op on which device failed, and on what), and adopts
// fresh results as brick tensors. What it runs is the brick op's device work, never another
// recorded call of an op: kernels redispatch to the backing device's kernel, and kernels that
// compute with ATen ops through full dispatch (`BackingOps::kDispatched`) record no op while they
// run (UnrecordedBackingOps).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backend/adoption.h"
#include "backend/alias_pool.h"
#include "backend/backing.h"
#include "backend/device_index.h"
#include "backend/launch.h"

namespace brick::backend {

// How a kernel reaches the backing device's ops.
enum class BackingOps : uint8_t {
  kRedispatched,  // straight to the backing kernel (`Op::redispatch(call.keys(), ...)`)
  kDispatched,    // `at::` calls through full dispatch, unrecorded for the call's duration
};

// Whether the call lends backing aliases of brick arguments (`call.alias`). A factory has no
// brick argument, and the boxed fallback shares storages its own way: neither pays for the pool.
enum class BackingArguments : uint8_t { kAliased, kNotAliased };

// Adds to `error`, raised by the backing device's kernel of brick op `name` (`overload_name` may
// be empty), which op on which brick device failed, and on what.
void add_backing_failure_context(c10::Error& error, const char* name, const char* overload_name,
                                 c10::DeviceIndex device);

namespace detail {
struct NothingSilenced {};
struct NoAliases {};
}  // namespace detail

template <BackingOps ops = BackingOps::kRedispatched,
          BackingArguments arguments = BackingArguments::kAliased>
class BackingCall {
  static constexpr bool kAliases = arguments == BackingArguments::kAliased;

 public:
  // A call of op `name` (with `overload_name`, "" for none; both must outlive the call) on brick
  // device `device`, a resolved index (a kernel's checked arguments, or factory_device_index()).
  // Inlined into each kernel: on the host runtime with no hook installed, entering and leaving
  // are a few loads and compares, which an out-of-line call would spread over more code.
  [[gnu::always_inline]] BackingCall(const char* name, const char* overload_name,
                                     c10::DeviceIndex device,
                                     runtime::LaunchKind kind = runtime::LaunchKind::Kernel)
      : name_(name),
        overload_name_(overload_name),
        launch_(name, kind),
        device_(device),
        scope_(device) {
    launch_.queue(device);
  }

  // A call that settles its device while it prepares its arguments (the boxed fallback):
  // `prepare()` runs inside the launch, before the device is entered, and returns the device.
  template <typename Prepare,
            typename = std::enable_if_t<std::is_invocable_r_v<c10::DeviceIndex, Prepare&>>>
  BackingCall(const char* name, const char* overload_name, runtime::LaunchKind kind,
              Prepare&& prepare)
      : name_(name),
        overload_name_(overload_name),
        launch_(name, kind),
        device_(prepare()),
        scope_(device_) {
    launch_.queue(device_);
  }

  [[gnu::always_inline]] ~BackingCall() = default;
  BackingCall(const BackingCall&) = delete;
  BackingCall& operator=(const BackingCall&) = delete;

  c10::DeviceIndex device() const noexcept { return device_; }

  // The dispatch keys of the backing device's kernels, for `Op::redispatch`.
  static c10::DispatchKeySet keys() noexcept { return backing_dispatch_key_set(); }

  // The backing alias of brick tensor `brick_tensor`, lent until the call ends (copy it to keep
  // it). Any other tensor (a CPU scalar, an undefined tensor) goes as it is.
  const at::Tensor& alias(const at::Tensor& brick_tensor) requires kAliases {
    return brick_tensor.defined() && brick_tensor.is_privateuseone() ? aliases_(brick_tensor)
                                                                     : brick_tensor;
  }
  // Mutable, for in-place kernels' `Tensor& self`.
  at::Tensor& mutable_alias(at::Tensor& brick_tensor) requires kAliases {
    return brick_tensor.is_privateuseone() ? aliases_(brick_tensor) : brick_tensor;
  }
  // The alias of an optional argument: undefined for none.
  at::Tensor alias(const std::optional<at::Tensor>& brick_tensor) requires kAliases {
    return brick_tensor.has_value() ? alias(*brick_tensor) : at::Tensor();
  }

  // Runs the backing kernel; a failure names the brick op, its device and the backing device.
  template <typename Kernel>
  decltype(auto) run(Kernel&& kernel) {
    try {
      return kernel();
    } catch (c10::Error& error) {
      add_backing_failure_context(error, name_, overload_name_, device_);
      throw;
    }
  }

  // A fresh result of the backing kernel (or a tuple of them) as brick tensors of this call's
  // device; undefined tensors and numbers stay as they are.
  at::Tensor adopt(at::Tensor result) const { return adopt_result(std::move(result), device_); }
  c10::Scalar adopt(c10::Scalar value) const { return value; }
  template <typename... Tensors>
  std::tuple<Tensors...> adopt(std::tuple<Tensors...> results) const {
    std::apply([&](auto&... result) { ((result = adopt(std::move(result))), ...); }, results);
    return results;
  }

 private:
  using Silence = std::conditional_t<ops == BackingOps::kDispatched, UnrecordedBackingOps,
                                     detail::NothingSilenced>;

  const char* name_;
  const char* overload_name_;
  LaunchScope launch_;
  c10::DeviceIndex device_;
  BackingScope scope_;
  [[no_unique_address]] std::conditional_t<kAliases, LentAliases, detail::NoAliases> aliases_;
  [[no_unique_address]] Silence silence_;
};

// A call whose kernel computes with `at::` ops through full dispatch.
using DispatchingBackingCall = BackingCall<BackingOps::kDispatched>;

}  // namespace brick::backend
