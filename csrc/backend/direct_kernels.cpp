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
// an in-place op sharing memory, an in-place op with more tensors than its check holds) goes to
// the boxed fallback, which handles every case and names every error. Only ops whose result is
// always a fresh tensor (or, in place, self with its geometry unchanged) are listed.
#include <ATen/EmptyTensor.h>
#include <ATen/Operators.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Copy.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/addmm_native.h>
#include <ATen/ops/bitwise_and_native.h>
#include <ATen/ops/bitwise_not_native.h>
#include <ATen/ops/bitwise_or_native.h>
#include <ATen/ops/cat_native.h>
#include <ATen/ops/clamp_min_native.h>
#include <ATen/ops/cos_native.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/eq_native.h>
#include <ATen/ops/exp_native.h>
#include <ATen/ops/fill_native.h>
#include <ATen/ops/ge_native.h>
#include <ATen/ops/gt_native.h>
#include <ATen/ops/le_native.h>
#include <ATen/ops/log_native.h>
#include <ATen/ops/lt_native.h>
#include <ATen/ops/maximum_native.h>
#include <ATen/ops/minimum_native.h>
#include <ATen/ops/mm_native.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/ne_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/pow_native.h>
#include <ATen/ops/result_type_native.h>
#include <ATen/ops/rsqrt_native.h>
#include <ATen/ops/sigmoid_native.h>
#include <ATen/ops/silu_native.h>
#include <ATen/ops/sin_native.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/tanh_native.h>
#include <torch/library.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/allocator.h"
#include "backend/backing_call.h"
#include "backend/cpu_stubs.h"
#include "backend/device_index.h"
#include "backend/fallback.h"
#include "common/hot_path.h"

// Structured kernels' output setters take the outputs' names before PyTorch 2.13, which has no
// named tensors.
#define BRICK_OUTPUTS_TAKE_NAMES (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13)
#if BRICK_OUTPUTS_TAKE_NAMES
#include <ATen/NamedTensorUtils.h>
#endif

namespace brick::backend {

namespace {

template <typename T>
using Bare = std::remove_cv_t<std::remove_reference_t<T>>;

// Tensor arguments the direct kernels do not convert (none of the listed ops has one).
template <typename T>
constexpr bool kIsUnsupportedTensorArgument =
    std::is_same_v<Bare<T>, at::TensorList> ||
    std::is_same_v<Bare<T>, c10::List<std::optional<at::Tensor>>>;

// What the arguments of one call hold: the brick device they are all on, their dtypes and, for an
// in-place op, their storages. A functional op's check keeps no storages: each op's check is
// code that runs cold between ops, so it runs only what its op needs.
template <bool kInPlace>
class ArgumentCheck {
 public:
  static constexpr size_t kMaxTensors = 8;

  BRICK_HOT_PATH void see(const at::Tensor& tensor) {
    if (!tensor.defined()) return;
    const c10::Device tensor_device = tensor.device();
    if (tensor_device.type() != kBrick) {
      // A CPU scalar (a Python number, a 0-dim tensor) mixes with device tensors, as on CUDA.
      if (tensor_device.type() != c10::DeviceType::CPU || tensor.dim() != 0) usual_ = false;
      return;
    }
    if constexpr (kInPlace) {
      if (count_ == kMaxTensors) {
        usual_ = false;
        return;
      }
    }
    const c10::DeviceIndex index = tensor_device.index();
    if (device_ < 0) {
      device_ = index;
      dtype_ = tensor.scalar_type();
    } else {
      usual_ = usual_ && index == device_;
      one_dtype_ = one_dtype_ && tensor.scalar_type() == dtype_;
    }
    if constexpr (kInPlace) {
      c10::StorageImpl* storage =
          tensor.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
      for (size_t i = 0; i < count_; ++i)
        shared_storage_ = shared_storage_ || storages_[i] == storage;
      storages_[count_++] = storage;
    }
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
  bool usual() const { return usual_ && device_ >= 0 && !shared_storage_; }
  c10::DeviceIndex device() const { return device_; }
  // Whether every brick tensor has one dtype (CPU scalars aside).
  bool one_dtype() const { return one_dtype_; }

 private:
  struct NoStorages {};

  c10::DeviceIndex device_ = -1;
  c10::ScalarType dtype_ = c10::ScalarType::Undefined;
  bool usual_ = true;
  bool one_dtype_ = true;
  bool shared_storage_ = false;
  size_t count_ = 0;  // (in place) the storages seen
  [[no_unique_address]] std::conditional_t<kInPlace, std::array<c10::StorageImpl*, kMaxTensors>,
                                           NoStorages>
      storages_{};
};

// Backing-device aliases of a tensor list's brick tensors, passed on as a list.
struct BackingList {
  std::vector<at::Tensor> tensors;
  operator at::ITensorListRef() const { return at::ITensorListRef(tensors); }
};

// The backing-device argument for a brick argument: an alias lent for the call.
const at::Tensor& backing(BackingCall<>& call, const at::Tensor& tensor) {
  return call.alias(tensor);  // a CPU scalar goes as it is
}
std::optional<at::Tensor> backing(BackingCall<>& call, const std::optional<at::Tensor>& tensor) {
  if (!tensor.has_value()) return std::nullopt;
  return call.alias(*tensor);
}
BackingList backing(BackingCall<>& call, const at::ITensorListRef& tensors) {
  BackingList list;
  list.tensors.reserve(tensors.size());
  for (const at::Tensor& tensor : tensors) {
    list.tensors.push_back(call.alias(tensor));
  }
  return list;
}
template <typename T>
const T& backing(BackingCall<>& /*call*/, const T& value) {
  return value;
}

// An op's results, taken from the end of the stack the boxed fallback leaves.
template <typename Return>
struct BoxedResults {
  static Return take(torch::jit::Stack& stack) { return std::move(stack.back()).toTensor(); }
};
template <>
struct BoxedResults<c10::Scalar> {
  static c10::Scalar take(torch::jit::Stack& stack) { return stack.back().toScalar(); }
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

// The boxed fallback for `Op`'s arguments, for the unusual calls: out of line, apart from the
// kernels' hot code.
template <typename Op, typename Return, typename... Args>
[[gnu::noinline, gnu::cold]] Return call_boxed(Args... args) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  torch::jit::Stack stack = c10::impl::boxArgs<Args...>(args...);
  run_boxed_fallback(op, &stack);
  return BoxedResults<Return>::take(stack);
}

// Whether a structured kernel's class is its TensorIterator (elementwise ops), which learns of its
// output as it is set and casts its inputs; other kernels' (mm, addmm, cat) take the result as
// their impl's argument.
template <typename Native>
constexpr bool kIterates = std::is_base_of_v<at::TensorIteratorBase, Native>;

// On the host runtime, an op whose CPU kernel is structured (a TensorIterator and a stub) runs
// the CPU's structured kernel on the brick tensors themselves, into a brick tensor allocated as
// the CPU's functional kernel allocates its result: no aliases of the arguments, no result to
// adopt. The iterator dispatches its stub by device type, and brick's entries of those stubs
// are the CPU's own kernels (cpu_stubs.h). The iterator is the CPU's but for the casts its CPU
// build makes to the common dtype: CPU scalars (Python numbers) are cast here as the CPU casts
// them; an op that would cast a brick tensor runs with aliases instead.
template <typename Native>
class HostStructured final : public Native {
 public:
#if BRICK_OUTPUTS_TAKE_NAMES
  // PyTorch before 2.13 passes the outputs' names with them: they go on the result as the CPU's
  // functional kernel puts them.
  BRICK_HOT_PATH void set_output_strided(int64_t index, c10::IntArrayRef sizes,
                                         c10::IntArrayRef strides, c10::TensorOptions options,
                                         at::DimnameList names) override {
    allocate(sizes, strides, options);
    if (!names.empty()) at::namedinference::propagate_names(output_, names);
    if constexpr (kIterates<Native>)
      Native::set_output_raw_strided(index, sizes, strides, options, names);
  }
  BRICK_HOT_PATH void set_output_raw_strided(int64_t index, c10::IntArrayRef sizes,
                                             c10::IntArrayRef strides, c10::TensorOptions options,
                                             at::DimnameList names) override {
    allocate(sizes, strides, options);
    if (!names.empty()) at::namedinference::propagate_names(output_, names);
    if constexpr (kIterates<Native>)
      Native::set_output_raw_strided(index, sizes, strides, options, names);
  }
#else
  BRICK_HOT_PATH void set_output_strided(int64_t index, c10::IntArrayRef sizes,
                                         c10::IntArrayRef strides,
                                         c10::TensorOptions options) override {
    allocate(sizes, strides, options);
    if constexpr (kIterates<Native>) Native::set_output_raw_strided(index, sizes, strides, options);
  }
  BRICK_HOT_PATH void set_output_raw_strided(int64_t index, c10::IntArrayRef sizes,
                                             c10::IntArrayRef strides,
                                             c10::TensorOptions options) override {
    allocate(sizes, strides, options);
    if constexpr (kIterates<Native>) Native::set_output_raw_strided(index, sizes, strides, options);
  }
#endif
  const at::Tensor& maybe_get_output(int64_t /*index*/) override { return output_; }

  // After meta(): casts the CPU scalars whose dtype is not the common one, as the CPU's iterator
  // does while it builds; false if a brick tensor would need a cast.
  bool casts_as_the_cpu() {
    const c10::ScalarType common = this->common_dtype_;
    if (common == c10::ScalarType::Undefined) return true;
    for (int64_t i = this->num_outputs_; i < this->ntensors(); ++i) {
      at::OperandInfo& operand = this->operands_[i];
      if (operand.current_dtype == common) continue;
      if (!this->is_cpu_scalar(i)) return false;
      operand.exchange_tensor(c10::MaybeOwned<at::TensorBase>::owned(operand.tensor().to(common)));
      operand.current_dtype = common;
      operand.target_dtype = common;
      operand.data = const_cast<void*>(operand.tensor_base().const_data_ptr());
    }
    return true;
  }

  at::Tensor& output() { return output_; }

 private:
  void allocate(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::TensorOptions options) {
    constexpr auto kKeys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
    const c10::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
    output_ = strides.empty() ? at::detail::empty_generic(sizes, brick_allocator(), kKeys, dtype,
                                                          options.memory_format_opt())
                              : at::detail::empty_strided_generic(sizes, strides, brick_allocator(),
                                                                  kKeys, dtype);
  }

  at::Tensor output_;
};

// Whether brick runs structured CPU kernels on brick tensors: the host runtime, where brick's
// stub entries are the CPU's.
inline bool host_structured_kernels() { return cpu_stubs_in_use(); }

// Whether a call of `Op` runs as HostStructured: every call, but where the CPU's kernel would
// call another op on brick tensors (which would run as a brick kernel inside this one).
template <typename Op>
struct RunsStructured {
  template <typename... Args>
  static bool call(const Args&... /*args*/) {
    return true;
  }
};
// A tensor and a number whose result type is another dtype: the op's meta converts the tensor
// with `.to()`, an op of its own.
inline bool keeps_the_dtype(const at::Tensor& self, const c10::Scalar& other) {
  return at::native::result_type(self, other) == self.scalar_type();  // (no op dispatched)
}
// pow(x, 0) fills the result and pow(x, 1) copies x into it, with ops of their own.
template <>
struct RunsStructured<at::_ops::pow_Tensor_Scalar> {
  static bool call(const at::Tensor& base, const c10::Scalar& exponent) {
    return !(exponent.equal(0.0) || exponent.equal(false) || exponent.equal(1.0) ||
             exponent.equal(true)) &&
           keeps_the_dtype(base, exponent);
  }
};
template <>
struct RunsStructured<at::_ops::clamp_min> {
  static bool call(const at::Tensor& self, const c10::Scalar& min) {
    return keeps_the_dtype(self, min);
  }
};

// A matrix the CPU's gemm reads where it is: unit stride in one dimension, a leading dimension
// BLAS accepts in the other (else addmm_impl_cpu_ clones it, an op of its own).
inline bool gemm_reads_in_place(const at::Tensor& matrix) {
  if (matrix.dim() != 2) return false;  // the alias path raises the CPU's error
  const c10::IntArrayRef sizes = matrix.sizes();
  const c10::IntArrayRef strides = matrix.strides();
  return (strides[1] == 1 && strides[0] >= std::max<int64_t>(1, sizes[1])) ||
         (strides[0] == 1 && strides[1] >= std::max<int64_t>(1, sizes[0]));
}
// mm: a float or double gemm on matrices it reads in place, with a nonempty inner dimension
// (an empty one zero-fills the result with zero_()). Other dtypes may take oneDNN paths that
// read tensors, not pointers, and require CPU tensors.
template <>
struct RunsStructured<at::_ops::mm> {
  static bool call(const at::Tensor& self, const at::Tensor& mat2) {
    const c10::ScalarType dtype = self.scalar_type();
    return (dtype == c10::ScalarType::Float || dtype == c10::ScalarType::Double) &&
           gemm_reads_in_place(self) && gemm_reads_in_place(mat2) && self.size(1) != 0;
  }
};

// addmm: as mm, the bias a brick tensor of the matrices' dtype (one_dtype() holds for the call).
template <>
struct RunsStructured<at::_ops::addmm> {
  static bool call(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                   const c10::Scalar& /*beta*/, const c10::Scalar& /*alpha*/) {
    return self.device().type() == kBrick && RunsStructured<at::_ops::mm>::call(mat1, mat2);
  }
};

// How HostStructured runs `Native` on a call's arguments: its meta, then its impl into the
// result. False where the CPU's kernel would call another op on a brick tensor after all (the
// call then aliases).
template <typename Native>
struct StructuredRun {
  template <typename... Args>
  BRICK_HOT_PATH static bool run(HostStructured<Native>& op, const Args&... args) {
    op.meta(args...);
    if constexpr (kIterates<Native>) {
      if (!op.casts_as_the_cpu()) return false;
    }
    op.impl(args..., op.output());
    return true;
  }
};
// cat: where its inputs share one dtype (else the CPU's iterator casts them into the result,
// with ops of their own off the CPU) and none is a conjugate or negative view. Its copies go
// through copy_stub, whose brick entry is the CPU's.
template <>
struct StructuredRun<at::native::structured_cat_out_cpu> {
  static bool run(HostStructured<at::native::structured_cat_out_cpu>& op,
                  const at::ITensorListRef& tensors, int64_t dim) {
    for (const at::Tensor& tensor : tensors) {
      if (tensor.is_conj() || tensor.is_neg()) return false;
    }
    const auto precomputed = op.meta(tensors, dim);
    if (!precomputed.all_same_dtype) return false;
    op.impl(tensors, precomputed.dim, precomputed.valid, precomputed.all_contiguous,
            precomputed.all_same_dtype, precomputed.all_same_sizes_and_stride,
            precomputed.memory_format, op.output());
    return true;
  }
};

// addmm: the CPU's kernel copies the bias into the result with copy_ (an op of its own), then
// runs gemm with beta on it. Here the bias is copied by the CPU's copy kernel (copy_stub, whose
// brick entry is the CPU's), and the kernel runs with the result as its bias, which it then
// neither copies nor broadcasts: the same bytes into the same gemm.
template <>
struct StructuredRun<at::native::structured_addmm_out_cpu> {
  static bool run(HostStructured<at::native::structured_addmm_out_cpu>& op, const at::Tensor& self,
                  const at::Tensor& mat1, const at::Tensor& mat2, const c10::Scalar& beta,
                  const c10::Scalar& alpha) {
    op.meta(self, mat1, mat2, beta, alpha);
    at::Tensor& result = op.output();
    // The CPU's broadcast of the bias (expand_size, whatever beta is): a view, or its error.
    const at::Tensor bias = self.sizes() == result.sizes() ? self : self.expand(result.sizes());
    if (result.numel() != 0 && beta.toComplexDouble() != 0.0) {
      at::native::copy_ignoring_overlaps(result, bias);
    }
    op.impl(result, mat1, mat2, beta, alpha, result);
    return true;
  }
};

template <typename Op, typename Native = void, typename Schema = typename Op::schema>
struct Direct;

// What a functional op may return: a fresh tensor, or a tuple of them (attention's output and
// log-sum-exp, its gradients), or a number read from the device (`.item()`).
template <typename T>
constexpr bool kIsFreshResults = std::is_same_v<T, at::Tensor> || std::is_same_v<T, c10::Scalar>;
template <typename... Tensors>
constexpr bool kIsFreshResults<std::tuple<Tensors...>> = (std::is_same_v<Tensors, at::Tensor> &&
                                                          ...);

// A functional op: fresh results; with `Native`, its CPU kernel's structured class, run as
// HostStructured on the host runtime.
template <typename Op, typename Native, typename Return, typename... Args>
struct Direct<Op, Native, Return(Args...)> {
  static_assert(kIsFreshResults<Return>, "a result that is not a fresh tensor");
  static_assert(!(kIsUnsupportedTensorArgument<Args> || ...), "an argument kind not converted");

  BRICK_HOT_PATH static Return call(Args... args) {
    ArgumentCheck</*kInPlace=*/false> check;
    (check.see(args), ...);
    if (!check.usual()) [[unlikely]] {
      return call_boxed<Op, Return, Args...>(args...);
    }
    BackingCall call(Op::name, Op::overload_name, check.device());
    if constexpr (!std::is_void_v<Native>) {
      if (check.one_dtype() && host_structured_kernels() && RunsStructured<Op>::call(args...))
          [[likely]] {
        std::optional<at::Tensor> result = call.run([&]() -> std::optional<at::Tensor> {
          HostStructured<Native> op;
          if (!StructuredRun<Native>::run(op, args...)) [[unlikely]]
            return std::nullopt;
          return std::move(op.output());
        });
        if (result.has_value()) [[likely]]
          return *std::move(result);
      }
    }
    return aliased(call, args...);
  }

 private:
  // The backing kernel on aliases of the arguments, its result adopted. Out of line: for an op
  // that runs a structured kernel it is the rare path, kept apart from the hot code.
  [[gnu::noinline]] static Return aliased(BackingCall<>& call, Args... args) {
    return call.adopt(
        call.run([&] { return Op::redispatch(call.keys(), backing(call, args)...); }));
  }
};

// An in-place op: self, changed in place (its geometry untouched: these ops do not resize).
template <typename Op, typename... Rest>
struct Direct<Op, void, at::Tensor&(at::Tensor&, Rest...)> {
  static_assert(!(kIsUnsupportedTensorArgument<Rest> || ...), "an argument kind not converted");

  BRICK_HOT_PATH static at::Tensor& call(at::Tensor& self, Rest... rest) {
    ArgumentCheck</*kInPlace=*/true> check;
    check.see(self);
    (check.see(rest), ...);
    if (!check.usual()) [[unlikely]] {
      at::Tensor result = call_boxed<Op, at::Tensor, at::Tensor&, Rest...>(self, rest...);
      (void)result;  // self, changed by the fallback
      return self;
    }
    BackingCall call(Op::name, Op::overload_name, check.device());
    call.run(
        [&] { Op::redispatch(call.keys(), call.mutable_alias(self), backing(call, rest)...); });
    return self;
  }
};

// A factory op (arange, scalar_tensor): the backing device's factory makes the tensor, which
// becomes brick memory. Cheaper than PyTorch's composite path on brick (an empty brick tensor,
// then an out= or fill kernel on an alias of it). The op's `Device?` argument names the brick
// device; its `bool?` argument is pin_memory, which brick memory ignores (as brick's empty does).
template <typename Op, typename Schema = typename Op::schema>
struct Factory;

template <typename Op, typename... Args>
struct Factory<Op, at::Tensor(Args...)> {
  static_assert((std::is_same_v<Bare<Args>, std::optional<c10::Device>> || ...),
                "a factory without a device argument");

  static at::Tensor call(Args... args) {
    c10::DeviceIndex device = -1;
    (find_device(args, &device), ...);
    // no brick argument: nothing to alias
    BackingCall<BackingOps::kRedispatched, BackingArguments::kNotAliased> call(
        Op::name, Op::overload_name, device);
    return call.adopt(
        call.run([&] { return Op::redispatch(call.keys(), on_backing(args, device)...); }));
  }

 private:
  static void find_device(const std::optional<c10::Device>& device, c10::DeviceIndex* index) {
    *index = factory_device_index(device, Op::name);
  }
  static void find_device(const std::optional<c10::Layout>& layout, c10::DeviceIndex* /*index*/) {
    check_strided_layout(layout, Op::name);
  }
  template <typename T>
  static void find_device(const T& /*not the device*/, c10::DeviceIndex* /*index*/) {}

  static std::optional<c10::Device> on_backing(const std::optional<c10::Device>& /*brick*/,
                                               c10::DeviceIndex device) {
    return backing_device(device);
  }
  static std::optional<bool> on_backing(const std::optional<bool>& /*pin_memory*/,
                                        c10::DeviceIndex /*device*/) {
    return std::nullopt;
  }
  template <typename T>
  static const T& on_backing(const T& value, c10::DeviceIndex /*device*/) {
    return value;
  }
};

bool has_names(const at::Tensor& self) {
#if BRICK_OUTPUTS_TAKE_NAMES
  return self.has_names();
#else
  return false;  // no named tensors
#endif
}

// On the host runtime, a copy into a fresh tensor (clone, `.to(dtype)`) runs the CPU's copy
// kernel (copy_stub's, cpu_stubs.h) from the brick tensor into a brick tensor laid out as the
// CPU's clone and _to_copy lay out their result: the source's strides for
// memory_format=preserve on a dense source, contiguous for memory_format=contiguous. No
// aliases, no result to adopt. Where the CPU's copy_ would take another kernel or do more
// (fbgemm's half <-> float conversion, a conjugate or negative view, complex to real, which
// warns) or would choose another layout, the copy aliases.
enum class CopyLayout : uint8_t { kAliased, kSourceStrides, kContiguous };

CopyLayout host_copy_layout(const at::Tensor& self, c10::ScalarType dtype,
                            std::optional<c10::MemoryFormat> memory_format) {
  if (!host_structured_kernels()) return CopyLayout::kAliased;
  const c10::ScalarType from = self.scalar_type();
  const bool half_and_float = (from == c10::ScalarType::Half && dtype == c10::ScalarType::Float) ||
                              (from == c10::ScalarType::Float && dtype == c10::ScalarType::Half);
  if (half_and_float || (c10::isComplexType(from) && !c10::isComplexType(dtype)) ||
      self.is_conj() || self.is_neg() || self._is_zerotensor() || has_names(self)) {
    return CopyLayout::kAliased;
  }
  switch (memory_format.value_or(c10::MemoryFormat::Preserve)) {
    case c10::MemoryFormat::Preserve:
      return self.is_non_overlapping_and_dense() ? CopyLayout::kSourceStrides
                                                 : CopyLayout::kAliased;
    case c10::MemoryFormat::Contiguous:
      return CopyLayout::kContiguous;
    default:
      return CopyLayout::kAliased;
  }
}

// The copy host_copy_layout() admits, inside the op's BackingCall.
at::Tensor host_copy(const at::Tensor& self, c10::ScalarType dtype, CopyLayout layout) {
  constexpr auto kKeys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  at::Tensor result = layout == CopyLayout::kSourceStrides
                          ? at::detail::empty_strided_generic(self.sizes(), self.strides(),
                                                              brick_allocator(), kKeys, dtype)
                          : at::detail::empty_generic(self.sizes(), brick_allocator(), kKeys, dtype,
                                                      c10::MemoryFormat::Contiguous);
  if (result.numel() == 0) return result;
  // The iterator the CPU's copy_ builds. (Where the CPU's copy_ copies a transposed matrix into
  // a contiguous one by blocks instead, the bytes are the same.)
  at::TensorIterator iter = at::TensorIteratorConfig()
                                .add_output(result)
                                .add_const_input(self)
                                .resize_outputs(false)
                                .check_all_same_dtype(false)
                                .check_all_same_device(false)
                                .build();
  cpu_copy_kernel()(iter, /*non_blocking=*/false);
  return result;
}

// clone: the host copy, or the backing device's clone on an alias.
at::Tensor clone(const at::Tensor& self, std::optional<c10::MemoryFormat> memory_format) {
  using Op = at::_ops::clone;
  BackingCall call(Op::name, Op::overload_name, self.device().index());
  const CopyLayout copy_layout = host_copy_layout(self, self.scalar_type(), memory_format);
  if (copy_layout != CopyLayout::kAliased) {
    return call.run([&] { return host_copy(self, self.scalar_type(), copy_layout); });
  }
  return call.adopt(
      call.run([&] { return Op::redispatch(call.keys(), call.alias(self), memory_format); }));
}

// A copy on one brick device, converting dtype or memory format (`.to(dtype)`, `.float()`):
// the host copy, or the backing device's copy on an alias, its result adopted. Copies between
// devices, into pinned memory or another layout take PyTorch's own path (an empty tensor
// there, then copy_).
at::Tensor to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                   std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                   std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<c10::MemoryFormat> memory_format) {
  const bool same_brick_device =
      self.device().type() == kBrick &&
      (!device.has_value() ||
       (device->type() == kBrick && (!device->has_index() || *device == self.device())));
  // A device without an index means the current one, which need not be self's.
  const bool current_is_self =
      !device.has_value() || device->has_index() || self.device().index() == rt().current_device();
  if (!same_brick_device || !current_is_self || (layout.has_value() && *layout != c10::kStrided) ||
      pin_memory.value_or(false)) {
    return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking,
                                memory_format);
  }
  using Op = at::_ops::_to_copy;
  BackingCall call(Op::name, Op::overload_name, self.device().index());
  const c10::ScalarType target = dtype.value_or(self.scalar_type());
  const CopyLayout copy_layout = host_copy_layout(self, target, memory_format);
  if (copy_layout != CopyLayout::kAliased) {
    return call.run([&] { return host_copy(self, target, copy_layout); });
  }
  return call.adopt(call.run([&] {
    return Op::redispatch(call.keys(), call.alias(self), dtype, layout, std::nullopt, std::nullopt,
                          non_blocking, memory_format);
  }));
}

// fill_ with a number: on the host runtime, the CPU's own fill_ on the brick tensor in place (its
// iterator and fill_stub, whose brick entry is the CPU's kernel; it calls no op), else the
// aliasing kernel.
at::Tensor& fill_scalar(at::Tensor& self, const c10::Scalar& value) {
  using Op = at::_ops::fill__Scalar;
  // One element: the CPU's fill_ writes it itself (a number out of the dtype's range becomes inf
  // there, where the kernel refuses it), which libtorch does not export; it aliases.
  if (!host_structured_kernels() || self.numel() == 1) {
    return Direct<Op>::call(self, value);
  }
  BackingCall call(Op::name, Op::overload_name, self.device().index());
  return call.run([&]() -> at::Tensor& { return at::native::fill_(self, value); });
}

// `Op`'s name as TORCH_LIBRARY_IMPL(aten, ...) registers it: "add.Tensor" for aten::add.Tensor.
template <typename Op>
std::string registration_name() {
  const std::string overload = Op::overload_name;
  return std::string(Op::name).substr(6) + (overload.empty() ? "" : "." + overload);
}

template <typename Op, typename Native = void>
void register_direct(torch::Library& library) {
  library.impl(registration_name<Op>().c_str(), TORCH_FN((Direct<Op, Native>::call)));
}

template <typename Op>
void register_factory(torch::Library& library) {
  library.impl(registration_name<Op>().c_str(), TORCH_FN(Factory<Op>::call));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Elementwise arithmetic and activations of transformer blocks.
  register_direct<at::_ops::add_Tensor, at::native::structured_ufunc_add_CPU>(m);
  register_direct<at::_ops::sub_Tensor, at::native::structured_sub_out>(m);
  register_direct<at::_ops::mul_Tensor, at::native::structured_mul_out>(m);
  register_direct<at::_ops::div_Tensor, at::native::structured_div_out>(m);
  register_direct<at::_ops::neg, at::native::structured_neg_out>(m);
  register_direct<at::_ops::rsqrt, at::native::structured_rsqrt_out>(m);
  register_direct<at::_ops::pow_Tensor_Scalar, at::native::structured_pow_Tensor_Scalar_out>(m);
  register_direct<at::_ops::silu, at::native::structured_silu_out>(m);
  register_direct<at::_ops::relu>(m);
  register_direct<at::_ops::sigmoid, at::native::structured_sigmoid_out>(m);
  register_direct<at::_ops::tanh, at::native::structured_tanh_out>(m);
  register_direct<at::_ops::exp, at::native::structured_exp_out>(m);
  register_direct<at::_ops::where_self>(m);
  register_direct<at::_ops::bitwise_or_Tensor, at::native::structured_bitwise_or_out>(m);
  register_direct<at::_ops::abs>(m);
  register_direct<at::_ops::sqrt, at::native::structured_sqrt_out>(m);
  register_direct<at::_ops::log, at::native::structured_log_out>(m);
  register_direct<at::_ops::sin, at::native::structured_sin_out>(m);
  register_direct<at::_ops::cos, at::native::structured_cos_out>(m);
  register_direct<at::_ops::gelu>(m);
  register_direct<at::_ops::clamp_min, at::native::structured_clamp_min_out>(m);
  register_direct<at::_ops::maximum, at::native::structured_maximum_out>(m);
  register_direct<at::_ops::minimum, at::native::structured_minimum_out>(m);
  register_direct<at::_ops::masked_fill_Scalar>(m);
  // Comparisons (masks).
  register_direct<at::_ops::eq_Scalar, at::native::structured_eq_Scalar_out>(m);
  register_direct<at::_ops::ne_Scalar, at::native::structured_ne_Scalar_out>(m);
  register_direct<at::_ops::gt_Scalar, at::native::structured_gt_Scalar_out>(m);
  register_direct<at::_ops::ge_Scalar, at::native::structured_ge_Scalar_out>(m);
  register_direct<at::_ops::lt_Scalar, at::native::structured_lt_Scalar_out>(m);
  register_direct<at::_ops::le_Scalar, at::native::structured_le_Scalar_out>(m);
  register_direct<at::_ops::eq_Tensor, at::native::structured_eq_Tensor_out>(m);
  register_direct<at::_ops::ne_Tensor, at::native::structured_ne_Tensor_out>(m);
  register_direct<at::_ops::gt_Tensor, at::native::structured_gt_Tensor_out>(m);
  register_direct<at::_ops::ge_Tensor, at::native::structured_ge_Tensor_out>(m);
  register_direct<at::_ops::lt_Tensor, at::native::structured_lt_Tensor_out>(m);
  register_direct<at::_ops::le_Tensor, at::native::structured_le_Tensor_out>(m);
  // Reductions, matrix products, concatenation.
  register_direct<at::_ops::sum_dim_IntList>(m);
  register_direct<at::_ops::mean_dim>(m);
  register_direct<at::_ops::_softmax>(m);
  register_direct<at::_ops::mm, at::native::structured_mm_out_cpu>(m);
  register_direct<at::_ops::bmm>(m);
  register_direct<at::_ops::addmm, at::native::structured_addmm_out_cpu>(m);
  register_direct<at::_ops::cat, at::native::structured_cat_out_cpu>(m);
  // Decoding loops (generate(): token lookup, stopping criteria, greedy choice).
  register_direct<at::_ops::index_select>(m);
  register_direct<at::_ops::isin_Tensor_Tensor>(m);
  register_direct<at::_ops::argmax>(m);
  register_direct<at::_ops::max>(m);
  register_direct<at::_ops::any>(m);
  register_direct<at::_ops::all>(m);
  register_direct<at::_ops::bitwise_and_Tensor, at::native::structured_bitwise_and_out>(m);
  register_direct<at::_ops::bitwise_not, at::native::structured_bitwise_not_out>(m);
  // Copies and factories (clone, .to(dtype), positions, scalars for where()).
  m.impl("clone", TORCH_FN(clone));
  m.impl("_to_copy", TORCH_FN(to_copy));
  register_factory<at::_ops::arange>(m);
  register_factory<at::_ops::arange_start>(m);
  register_factory<at::_ops::arange_start_step>(m);
  register_factory<at::_ops::scalar_tensor>(m);
  register_direct<at::_ops::_local_scalar_dense>(m);  // .item()
  // The CPU's fused attention, which brick's SDPA choice picks on the host runtime.
  register_direct<at::_ops::_scaled_dot_product_flash_attention_for_cpu>(m);
  register_direct<at::_ops::_scaled_dot_product_flash_attention_for_cpu_backward>(m);
  // In place.
  register_direct<at::_ops::add__Tensor>(m);
  register_direct<at::_ops::mul__Tensor>(m);
  register_direct<at::_ops::div__Tensor>(m);
  register_direct<at::_ops::sub__Tensor>(m);
  m.impl("fill_.Scalar", TORCH_FN(fill_scalar));
  register_direct<at::_ops::zero_>(m);
}

}  // namespace brick::backend
