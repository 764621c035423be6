// The boxed fallback: every aten op without a brick kernel of its own runs here, as the backing
// device's kernel on the same memory.
//
// Brick arguments become backing-device tensors that alias their bytes (no copy), the op is
// redispatched to the backing device, and each result comes back as a brick tensor:
//   - the very tensor passed in, for in-place and out= results (its metadata synced back);
//   - a brick view of the argument's storage, for view results;
//   - an adopted brick storage, for fresh results (the backing allocation is relabelled).
#include "backend/fallback.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>

#include "backend/adoption.h"
#include "backend/allocator.h"
#include "backend/backing_alias.h"
#include "backend/backing_call.h"
#include "backend/device_index.h"
#include "backend/errors.h"
#include "backend/generator.h"

namespace brick::backend {

namespace {

class FallbackCall {
 public:
  explicit FallbackCall(const c10::OperatorHandle& op) : op_(op), schema_(op.schema()) {}

  void run(torch::jit::Stack* stack) {
    const auto& arguments = schema_.arguments();
    const size_t first = stack->size() - arguments.size();
    // Its arguments share backing storages their own way (one per brick storage), not lent.
    BackingCall<BackingOps::kRedispatched, BackingArguments::kNotAliased> call(
        schema_.name().c_str(), schema_.overload_name().c_str(), runtime::LaunchKind::Kernel,
        [&] { return prepare(*stack, first); });
    call.run([&] { op_.redispatchBoxed(call.keys(), stack); });

    for (Alias& alias : aliases_) {
      if (alias.is_write) sync_back(alias);
    }
    const size_t num_returns = schema_.returns().size();
    for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
      convert_result((*stack)[i]);
    }
  }

 private:
  struct Alias {
    at::Tensor brick;
    at::Tensor backing;
    bool is_write;
  };
  struct StoragePair {
    c10::Storage backing;
    c10::Storage brick;
  };

  // Converts the arguments on `stack` from `first` on; returns the device the op runs on.
  c10::DeviceIndex prepare(torch::jit::Stack& stack, size_t first) {
    const auto& arguments = schema_.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      convert_argument(arguments[i], stack[first + i]);
    }
    if (device_ < 0) device_ = static_cast<c10::DeviceIndex>(rt().current_device());
    if (mismatch_argument_ != nullptr) device_mismatch(*mismatch_argument_, mismatch_tensor_);
    TORCH_CHECK(generator_device_ < 0 || generator_device_ == device_, "Generator device index ",
                static_cast<int>(generator_device_), " does not match the device of ",
                schema_.name(), ", ", c10::Device(kBrick, device_),
                ": use a generator of that device (torch.Generator(\"",
                c10::Device(kBrick, device_), "\"))");
    for (size_t i : pending_generators_) {
      stack[first + i] = c10::IValue(generator_backing(brick_default_generator(device_)));
    }
    return device_;
  }

  [[noreturn]] void device_mismatch(const c10::Argument& argument, const at::Tensor& other) const {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two ",
                "devices, ", c10::Device(kBrick, device_), " and ", other.device(),
                "! (when checking argument '", argument.name(), "' of ", schema_.name(),
                schema_.overload_name().empty() ? "" : "." + schema_.overload_name(), ")");
  }

  at::Tensor to_backing(const c10::Argument& argument, const at::Tensor& tensor, bool is_write,
                        bool allow_backing_tensors) {
    if (!tensor.defined()) return tensor;
    if (tensor.device().type() != kBrick) {
      // Like CUDA: CPU scalars (0-dim, Python numbers among them) mix with device tensors;
      // index lists may be on the CPU (or on the backing device).
      const auto type = tensor.device().type();
      const bool allowed = (type == c10::DeviceType::CPU || type == backing_device_type()) &&
                           (allow_backing_tensors || tensor.dim() == 0);
      if (!allowed) {
        // Reported once every argument is seen, so the message names the brick tensors' device.
        if (mismatch_argument_ == nullptr) {
          mismatch_argument_ = &argument;
          mismatch_tensor_ = tensor;
        }
        return tensor;
      }
      foreign_storages_.push_back(tensor.storage().unsafeGetStorageImpl());
      return tensor;
    }
    const auto device = tensor.device().index();
    if (device_ < 0) {
      device_ = device;
    } else if (device != device_) {
      device_mismatch(argument, tensor);
    }
    c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    for (Alias& alias : aliases_) {
      if (alias.brick.unsafeGetTensorImpl() == impl) {
        alias.is_write = alias.is_write || is_write;
        return alias.backing;
      }
    }
    // Tensors that share a brick storage share one backing storage, so backing kernels see
    // their aliasing (overlap checks, in-place on views).
    c10::Storage backing_storage;
    c10::StorageImpl* brick_storage = tensor.storage().unsafeGetStorageImpl();
    for (const StoragePair& pair : storages_) {
      if (pair.brick.unsafeGetStorageImpl() == brick_storage) {
        backing_storage = pair.backing;
        break;
      }
    }
    if (!backing_storage) {
      backing_storage = make_backing_storage(tensor.storage());
      storages_.push_back({backing_storage, tensor.storage()});
    }
    at::Tensor backing = make_backing_tensor(tensor, std::move(backing_storage));
    aliases_.push_back({tensor, backing, is_write});
    return backing;
  }

  at::Generator generator_backing(const at::Generator& generator) const {
    return static_cast<BrickGenerator*>(generator.unsafeGetGeneratorImpl())->backing();
  }

  void convert_argument(const c10::Argument& argument, c10::IValue& value) {
    const bool is_write = argument.alias_info() != nullptr && argument.alias_info()->isWrite();
    if (value.isTensor()) {
      value = to_backing(argument, value.toTensor(), is_write, false);
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      c10::List<at::Tensor> converted;
      converted.reserve(list.size());
      for (const at::Tensor& tensor : list) {
        converted.push_back(to_backing(argument, tensor, is_write, false));
      }
      value = std::move(converted);
    } else if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> converted;
      for (const c10::IValue& element : value.toListRef()) {
        if (element.isTensor()) {
          converted.push_back(to_backing(argument, element.toTensor(), is_write, true));
        } else {
          converted.push_back(std::nullopt);
        }
      }
      value = std::move(converted);
    } else if (value.isGenerator()) {
      // As CUDA: a kernel on brick tensors takes a generator of their device, never another
      // device's (a CPU generator would silently draw a different stream).
      const at::Generator& generator = value.toGenerator();
      TORCH_CHECK(generator.device().type() == kBrick, "Expected a 'brick' device type for ",
                  "generator but found '", generator.device().type(), "' (argument '",
                  argument.name(), "' of ", schema_.name(), ")");
      generator_device_ = generator.device().index();
      value = generator_backing(generator);
    } else if (value.isDevice()) {
      const c10::Device device = value.toDevice();
      if (device.type() == kBrick) {
        const auto index = resolve_device_index(device.index());
        if (device_ < 0) device_ = index;
        value = backing_device(index);
      }
    } else if (value.isNone() && is_generator_type(argument)) {
      pending_generators_.push_back(&argument - schema_.arguments().data());
    }
  }

  static bool is_generator_type(const c10::Argument& argument) {
    const auto& type = argument.real_type();
    if (type->kind() != c10::TypeKind::OptionalType) return false;
    return type->expectRef<c10::OptionalType>().getElementType()->kind() ==
           c10::TypeKind::GeneratorType;
  }

  // The brick storage for a storage a kernel pointed a mutable argument at.
  c10::Storage brick_storage_for(c10::StorageImpl* backing_storage) {
    for (const StoragePair& pair : storages_) {
      if (pair.backing.unsafeGetStorageImpl() == backing_storage) return pair.brick;
    }
    TORCH_CHECK(std::find(foreign_storages_.begin(), foreign_storages_.end(), backing_storage) ==
                    foreign_storages_.end(),
                "brick: ", schema_.name(), " pointed a brick tensor at the memory of a ",
                backing_device_type(), " tensor, which brick cannot share");
    adopt_storage_in_place(backing_storage, device_);
    return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(backing_storage));
  }

  // Moves what a kernel did to a mutable argument's storage and geometry into the brick tensor.
  void sync_back(Alias& alias) {
    c10::TensorImpl* brick = alias.brick.unsafeGetTensorImpl();
    c10::TensorImpl* backing = alias.backing.unsafeGetTensorImpl();
    c10::StorageImpl* backing_storage = backing->storage().unsafeGetStorageImpl();
    c10::StorageImpl* brick_storage = brick->storage().unsafeGetStorageImpl();
    const bool same_storage =
        std::any_of(storages_.begin(), storages_.end(), [&](const StoragePair& pair) {
          return pair.backing.unsafeGetStorageImpl() == backing_storage &&
                 pair.brick.unsafeGetStorageImpl() == brick_storage;
        });
    if (same_storage) {
      if (backing_storage->data_ptr().get() != brick_storage->data_ptr().get() ||
          backing_storage->nbytes() != brick_storage->nbytes()) {
        // The kernel resized the argument: its new bytes become the brick storage's.
        const size_t nbytes = backing_storage->nbytes();
        c10::DataPtr data =
            backing_storage->set_data_ptr(c10::DataPtr(nullptr, backing_storage->device()));
        brick_storage->set_data_ptr_noswap(to_brick_data_ptr(std::move(data), nbytes, device_));
        brick_storage->set_nbytes(nbytes);
        // Later results that view this backing storage must see the brick bytes.
        c10::DataPtr view(brick_storage->data_ptr().get(), backing_storage->device());
        backing_storage->set_data_ptr_noswap(std::move(view));
      }
    } else {
      // The kernel pointed the argument at another storage (set_).
      brick->set_storage_keep_dtype(brick_storage_for(backing_storage));
    }
    if (brick->sizes() != backing->sizes() || brick->strides() != backing->strides() ||
        brick->storage_offset() != backing->storage_offset()) {
      brick->set_sizes_and_strides(backing->sizes(), backing->strides(), backing->storage_offset());
    }
  }

  at::Tensor to_brick(const at::Tensor& result) {
    if (!result.defined() || result.device().type() != backing_device_type()) return result;
    c10::TensorImpl* impl = result.unsafeGetTensorImpl();
    for (const Alias& alias : aliases_) {
      if (alias.backing.unsafeGetTensorImpl() == impl) return alias.brick;
    }
    c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
    for (const StoragePair& pair : storages_) {
      if (pair.backing.unsafeGetStorageImpl() == storage)
        return make_brick_tensor(pair.brick, result);
    }
    if (std::find(foreign_storages_.begin(), foreign_storages_.end(), storage) !=
        foreign_storages_.end()) {
      // A backing tensor passed in came back out: copy it, its owner keeps its memory.
      c10::Storage copy(c10::Storage::use_byte_size_t(), storage->nbytes(), brick_allocator(),
                        /*resizable=*/true);
      // From host memory, or from backing-device memory of this brick device.
      const int source_device = storage->device().is_cpu() ? -1 : device_;
      BRICK_RUNTIME_CALL(rt().copy(copy.mutable_data(), device_, storage->data_ptr().get(),
                                   source_device, storage->nbytes()));
      return make_brick_tensor(std::move(copy), result);
    }
    // A fresh result: relabel it as brick in place, no copy and no new tensor.
    return adopt_result(result, device_);
  }

  void convert_result(c10::IValue& value) {
    if (value.isTensor()) {
      value = to_brick(value.toTensor());
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      c10::List<at::Tensor> converted;
      converted.reserve(list.size());
      for (const at::Tensor& tensor : list) converted.push_back(to_brick(tensor));
      value = std::move(converted);
    }
  }

  const c10::OperatorHandle& op_;
  const c10::FunctionSchema& schema_;
  c10::DeviceIndex device_ = -1;
  c10::SmallVector<Alias, 4> aliases_;
  c10::SmallVector<StoragePair, 4> storages_;
  c10::SmallVector<c10::StorageImpl*, 2> foreign_storages_;
  c10::SmallVector<size_t, 1> pending_generators_;
  c10::DeviceIndex generator_device_ = -1;  // an explicit brick generator's device
  const c10::Argument* mismatch_argument_ = nullptr;
  at::Tensor mismatch_tensor_;
};

void brick_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet /*key_set*/,
                    torch::jit::Stack* stack) {
  FallbackCall(op).run(stack);
}

}  // namespace

void run_boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  FallbackCall(op).run(stack);
}

namespace {

// A library of brick's own aten kernels, alive until the process exits.
std::unique_ptr<torch::Library> brick_kernel_library() {
  return std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                          c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
}

// Registers the fallback into `library` as brick's own kernel for every aten op without one
// that `wanted(op, "name.overload")` picks; returns how many.
template <typename Wanted>
int register_fallback_where(torch::Library& library, Wanted&& wanted) {
  auto& dispatcher = c10::Dispatcher::singleton();
  int registered = 0;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto op = dispatcher.findOp(name);
    if (!op.has_value() || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    const std::string qualified =
        name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    if (!wanted(*op, qualified)) continue;
    library.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&brick_fallback>());
    ++registered;
  }
  return registered;
}

}  // namespace

int register_direct_fallback_kernels() {
  // PyTorch prefers a composite kernel to a backend fallback, which costs brick twice:
  //  - ops with a CompositeExplicitAutogradNonFunctional kernel (functional and in-place forms of
  //    structured ops such as add.Tensor) decompose into an allocation plus the out= form,
  //    checking and computing the output geometry twice;
  //  - ops with a CompositeExplicitAutograd kernel beside a backing-device kernel (layer and
  //    group norm, addr, ...) would run a generic decomposition that differs numerically from
  //    the backing device's kernel; so would ops with a CompositeImplicitAutograd kernel beside
  //    one (silu_backward, mish_backward: the CPU runs its own kernel, a device without one the
  //    math formula). A composite-implicit op has no kernel of the backing device's key unless
  //    that device registered one, so it qualifies only with a kernel for every backing device
  //    this PyTorch can have (CPU, and CUDA in a CUDA build: _fused_rms_norm_backward has only
  //    CUDA's).
  // For both, brick runs the backing device's own kernel through the fallback.
  // Registered at import, before the runtime (and so the backing device) is chosen: an op with a
  // CPU or a CUDA kernel qualifies. On a backing device without its own kernel for the op, the
  // fallback's redispatch reaches the composite kernel there, as a decomposition would.
  // Composite kernels that refuse devices other than CPU/CUDA/XPU; on the backing device they
  // are fine.
  static const auto library = brick_kernel_library();
  static const int registered = [] {
    const std::set<std::string> device_checking_composites = {"mode.values"};
    const auto empty = c10::Dispatcher::singleton().findOp({"aten::empty", "memory_format"});
    const bool cuda_build =
        empty.has_value() && empty->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
    return register_fallback_where(*library, [&](const c10::OperatorHandle& op,
                                                 const std::string& name) {
      const bool backing_kernel = op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
                                  op.hasKernelForDispatchKey(c10::DispatchKey::CUDA);
      const bool decomposed =
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
      const bool math_elsewhere =
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
          op.hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
          (!cuda_build || op.hasKernelForDispatchKey(c10::DispatchKey::CUDA));
      return (backing_kernel && decomposed) || math_elsewhere ||
             device_checking_composites.count(name) != 0;
    });
  }();
  return registered;
}

int register_cuda_backing_kernels() {
  static const auto library = brick_kernel_library();
  static const int registered = register_fallback_where(
      *library, [](const c10::OperatorHandle& op, const std::string& /*name*/) {
        return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
               op.hasKernelForDispatchKey(c10::DispatchKey::CUDA) &&
               !op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
      });
  return registered;
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&brick_fallback>());
}

}  // namespace brick::backend
