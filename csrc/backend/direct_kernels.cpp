// Unboxed kernels for the ops that dominate real models' op counts.
//
// The boxed fallback (fallback.cpp) serves every op, but boxing costs: the arguments are copied
// into an IValue stack and back out, and each copy of a brick tensor that Python owns takes the
// GIL twice (PyTorch keeps the Python object alive while C++ holds a second reference). For the
// hottest ops of transformer decoders (measured with the registry on Qwen2 generate(): mul, add,
// cat, mm, addmm, div_, fill_, ...), a kernel per op takes its arguments as they come, aliases
// the brick tensors on the backing device, redispatches there and adopts the result: the same
// work as the fallback without the stack.
//
// CPU scalars (Python numbers, 0-dim CPU tensors) pass through as the fallback passes them.
// Anything out of the ordinary (a tensor that is not on this op's brick device, two tensors of
// an in-place op sharing memory, more tensors than the check holds) goes to the boxed fallback,
// which handles every case and names every error. Only ops whose result is always a fresh
// tensor (or, in place, self with its geometry unchanged) are listed.
#include <ATen/Operators.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/backing.h"
#include "backend/launch.h"

namespace brick::backend {

namespace {

template <typename T>
using Bare = std::remove_cv_t<std::remove_reference_t<T>>;

// Tensor arguments the direct kernels do not convert (none of the listed ops has one).
template <typename T>
constexpr bool kIsUnsupportedTensorArgument =
    std::is_same_v<Bare<T>, at::TensorList> ||
    std::is_same_v<Bare<T>, c10::List<std::optional<at::Tensor>>>;

// What the arguments of one call hold: the brick device they are all on, and their storages.
class ArgumentCheck {
 public:
  static constexpr size_t kMaxTensors = 8;

  void see(const at::Tensor& tensor) {
    if (!tensor.defined()) return;
    if (tensor.device().type() != kBrick) {
      // A CPU scalar (a Python number, a 0-dim tensor) mixes with device tensors, as on CUDA.
      if (tensor.device().type() != c10::DeviceType::CPU || tensor.dim() != 0) usual_ = false;
      return;
    }
    if (count_ == kMaxTensors) {
      usual_ = false;
      return;
    }
    const c10::DeviceIndex index = tensor.device().index();
    if (device_ < 0) {
      device_ = index;
    } else if (index != device_) {
      usual_ = false;
    }
    c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
    for (size_t i = 0; i < count_; ++i)
      shared_storage_ = shared_storage_ || storages_[i] == storage;
    storages_[count_++] = storage;
  }
  void see(const at::ITensorListRef& tensors) {
    for (const at::Tensor& tensor : tensors) see(tensor);
  }
  void see(const std::optional<at::Tensor>& tensor) {
    if (tensor.has_value()) see(*tensor);
  }
  template <typename T>
  void see(const T& /*not a tensor*/) {}

  // True when every tensor is a brick tensor on one device; an in-place op also needs its
  // tensors to have storages of their own (the fallback makes them share a backing storage).
  bool usual(bool in_place) const {
    return usual_ && device_ >= 0 && !(in_place && shared_storage_);
  }
  c10::DeviceIndex device() const { return device_; }

 private:
  c10::DeviceIndex device_ = -1;
  bool usual_ = true;
  bool shared_storage_ = false;
  size_t count_ = 0;
  std::array<c10::StorageImpl*, kMaxTensors> storages_{};
};

// Backing-device aliases of a tensor list's brick tensors, passed on as a list.
struct BackingList {
  std::vector<at::Tensor> tensors;
  operator at::ITensorListRef() const { return at::ITensorListRef(tensors); }
};

// The backing-device argument for a brick argument.
at::Tensor backing(const at::Tensor& tensor) {
  // A CPU scalar goes as it is.
  return tensor.defined() && tensor.device().type() == kBrick ? make_reused_backing_alias(tensor)
                                                              : tensor;
}
std::optional<at::Tensor> backing(const std::optional<at::Tensor>& tensor) {
  if (!tensor.has_value()) return std::nullopt;
  return backing(*tensor);
}
BackingList backing(const at::ITensorListRef& tensors) {
  BackingList list;
  list.tensors.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) {
    list.tensors.push_back(make_reused_backing_alias(tensor));
  }
  return list;
}
template <typename T>
const T& backing(const T& value) {
  return value;
}

// An op's results, taken from the end of the stack the boxed fallback leaves.
template <typename Return>
struct BoxedResults {
  static Return take(torch::jit::Stack& stack) { return std::move(stack.back()).toTensor(); }
};
template <typename... Tensors>
struct BoxedResults<std::tuple<Tensors...>> {
  static std::tuple<Tensors...> take(torch::jit::Stack& stack) {
    return take(stack, std::index_sequence_for<Tensors...>());
  }
  template <size_t... I>
  static std::tuple<Tensors...> take(torch::jit::Stack& stack, std::index_sequence<I...>) {
    const size_t first = stack.size() - sizeof...(Tensors);
    return {std::move(stack[first + I]).toTensor()...};
  }
};

// The boxed fallback for `Op`'s arguments, for the unusual calls.
template <typename Op, typename Return, typename... Args>
Return call_boxed(Args... args) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  torch::jit::Stack stack = c10::impl::boxArgs<Args...>(args...);
  run_boxed_fallback(op, &stack);
  return BoxedResults<Return>::take(stack);
}

template <typename Op, typename Schema = typename Op::schema>
struct Direct;

// What a functional op may return: a fresh tensor, or a tuple of them (attention's output and
// log-sum-exp, its gradients).
template <typename T>
constexpr bool kIsFreshResults = std::is_same_v<T, at::Tensor>;
template <typename... Tensors>
constexpr bool kIsFreshResults<std::tuple<Tensors...>> = (std::is_same_v<Tensors, at::Tensor> &&
                                                          ...);

// The backing kernel's results, made brick tensors of `device`.
at::Tensor adopt_results(at::Tensor result, c10::DeviceIndex device) {
  return adopt_result(std::move(result), device);
}
template <typename... Tensors>
std::tuple<Tensors...> adopt_results(std::tuple<Tensors...> results, c10::DeviceIndex device) {
  std::apply([&](auto&... result) { ((result = adopt_result(std::move(result), device)), ...); },
             results);
  return results;
}

// A functional op: fresh results.
template <typename Op, typename Return, typename... Args>
struct Direct<Op, Return(Args...)> {
  static_assert(kIsFreshResults<Return>, "a result that is not a fresh tensor");
  static_assert(!(kIsUnsupportedTensorArgument<Args> || ...), "an argument kind not converted");

  static Return call(Args... args) {
    ArgumentCheck check;
    (check.see(args), ...);
    if (!check.usual(/*in_place=*/false)) [[unlikely]] {
      return call_boxed<Op, Return, Args...>(args...);
    }
    const c10::DeviceIndex device = check.device();
    LaunchScope launch(Op::name, runtime::LaunchKind::Kernel);
    BackingScope scope(device);
    launch.queue(device);
    Return results;
    try {
      results = Op::redispatch(backing_dispatch_key_set(), backing(args)...);
    } catch (c10::Error& error) {
      add_backing_failure_context(error, Op::name, Op::overload_name, device);
      throw;
    }
    return adopt_results(std::move(results), device);
  }
};

// An in-place op: self, changed in place (its geometry untouched: these ops do not resize).
template <typename Op, typename... Rest>
struct Direct<Op, at::Tensor&(at::Tensor&, Rest...)> {
  static_assert(!(kIsUnsupportedTensorArgument<Rest> || ...), "an argument kind not converted");

  static at::Tensor& call(at::Tensor& self, Rest... rest) {
    ArgumentCheck check;
    check.see(self);
    (check.see(rest), ...);
    if (!check.usual(/*in_place=*/true)) [[unlikely]] {
      at::Tensor result = call_boxed<Op, at::Tensor, at::Tensor&, Rest...>(self, rest...);
      (void)result;  // self, changed by the fallback
      return self;
    }
    const c10::DeviceIndex device = check.device();
    LaunchScope launch(Op::name, runtime::LaunchKind::Kernel);
    BackingScope scope(device);
    launch.queue(device);
    at::Tensor self_backing = backing(self);
    try {
      Op::redispatch(backing_dispatch_key_set(), self_backing, backing(rest)...);
    } catch (c10::Error& error) {
      add_backing_failure_context(error, Op::name, Op::overload_name, device);
      throw;
    }
    return self;
  }
};

template <typename Op>
void register_direct(torch::Library& library) {
  const std::string overload = Op::overload_name;
  const std::string name =
      std::string(Op::name).substr(6) + (overload.empty() ? "" : "." + overload);
  library.impl(name.c_str(), TORCH_FN(Direct<Op>::call));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Elementwise arithmetic and activations of transformer blocks.
  register_direct<at::_ops::add_Tensor>(m);
  register_direct<at::_ops::sub_Tensor>(m);
  register_direct<at::_ops::mul_Tensor>(m);
  register_direct<at::_ops::div_Tensor>(m);
  register_direct<at::_ops::neg>(m);
  register_direct<at::_ops::rsqrt>(m);
  register_direct<at::_ops::pow_Tensor_Scalar>(m);
  register_direct<at::_ops::silu>(m);
  register_direct<at::_ops::relu>(m);
  register_direct<at::_ops::sigmoid>(m);
  register_direct<at::_ops::tanh>(m);
  register_direct<at::_ops::exp>(m);
  register_direct<at::_ops::where_self>(m);
  register_direct<at::_ops::bitwise_or_Tensor>(m);
  register_direct<at::_ops::abs>(m);
  register_direct<at::_ops::sqrt>(m);
  register_direct<at::_ops::log>(m);
  register_direct<at::_ops::sin>(m);
  register_direct<at::_ops::cos>(m);
  register_direct<at::_ops::gelu>(m);
  register_direct<at::_ops::clamp_min>(m);
  register_direct<at::_ops::maximum>(m);
  register_direct<at::_ops::minimum>(m);
  register_direct<at::_ops::masked_fill_Scalar>(m);
  // Comparisons (masks).
  register_direct<at::_ops::eq_Scalar>(m);
  register_direct<at::_ops::ne_Scalar>(m);
  register_direct<at::_ops::gt_Scalar>(m);
  register_direct<at::_ops::ge_Scalar>(m);
  register_direct<at::_ops::lt_Scalar>(m);
  register_direct<at::_ops::le_Scalar>(m);
  register_direct<at::_ops::eq_Tensor>(m);
  register_direct<at::_ops::ne_Tensor>(m);
  register_direct<at::_ops::gt_Tensor>(m);
  register_direct<at::_ops::ge_Tensor>(m);
  register_direct<at::_ops::lt_Tensor>(m);
  register_direct<at::_ops::le_Tensor>(m);
  // Reductions, matrix products, concatenation.
  register_direct<at::_ops::sum_dim_IntList>(m);
  register_direct<at::_ops::mean_dim>(m);
  register_direct<at::_ops::_softmax>(m);
  register_direct<at::_ops::mm>(m);
  register_direct<at::_ops::bmm>(m);
  register_direct<at::_ops::addmm>(m);
  register_direct<at::_ops::cat>(m);
  // Decoding loops (generate(): token lookup, stopping criteria, greedy choice).
  register_direct<at::_ops::index_select>(m);
  register_direct<at::_ops::isin_Tensor_Tensor>(m);
  register_direct<at::_ops::argmax>(m);
  register_direct<at::_ops::max>(m);
  register_direct<at::_ops::any>(m);
  register_direct<at::_ops::all>(m);
  register_direct<at::_ops::bitwise_and_Tensor>(m);
  // The CPU's fused attention, which brick's SDPA choice picks on the host runtime.
  register_direct<at::_ops::_scaled_dot_product_flash_attention_for_cpu>(m);
  register_direct<at::_ops::_scaled_dot_product_flash_attention_for_cpu_backward>(m);
  // In place.
  register_direct<at::_ops::add__Tensor>(m);
  register_direct<at::_ops::mul__Tensor>(m);
  register_direct<at::_ops::div__Tensor>(m);
  register_direct<at::_ops::sub__Tensor>(m);
  register_direct<at::_ops::fill__Scalar>(m);
}

}  // namespace brick::backend
