// The boxed fallback: every aten op without a brick kernel of its own runs here, as the backing
// device's kernel on the same memory.
//
// Brick arguments become backing-device tensors that alias their bytes (no copy), the op is
// redispatched to the backing device, and each result comes back as a brick tensor:
//   - the very tensor passed in, for in-place and out= results (its metadata synced back);
//   - a brick view of the argument's storage, for view results;
//   - an adopted brick storage, for fresh results (the backing allocation is relabelled).
// Sparse and nested brick tensors (layouts.h) reach brick's sparse and nested keys, whose calls
// run the backing device's sparse and nested kernels: each sparse argument becomes a backing
// sparse tensor over aliases of its brick members, each nested one a backing nested tensor over
// an alias of its storage; each sparse result becomes a brick sparse tensor over its members as
// brick tensors (the arguments' members, views of their storages, or adopted fresh members), each
// nested result a brick nested tensor over its storage (an argument's, or adopted).
#include "backend/fallback.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/adoption.h"
#include "backend/allocator.h"
#include "backend/backing_alias.h"
#include "backend/backing_call.h"
#include "backend/device_index.h"
#include "backend/errors.h"
#include "backend/generator.h"
#include "backend/layouts.h"

namespace brick::backend {

namespace {

// The dispatch keys a call serves: brick's dense key, or its keys of other layouts
// (SparsePrivateUse1, SparseCsrPrivateUse1, NestedTensorPrivateUse1), whose arguments may be
// sparse or nested brick tensors.
enum class FallbackKeys : uint8_t { kDense, kLayouts };

template <FallbackKeys kKeys>
class FallbackCall {
  static constexpr bool kLayouts = kKeys == FallbackKeys::kLayouts;
  // The backing device's sparse and nested kernels compute with at:: ops through full dispatch.
  // Arguments share backing storages their own way (one per brick storage), not lent.
  using Call = BackingCall<kLayouts ? BackingOps::kDispatched : BackingOps::kRedispatched,
                           BackingArguments::kNotAliased>;

 public:
  explicit FallbackCall(const c10::OperatorHandle& op) : op_(op), schema_(op.schema()) {}

  // `dispatch_keys`: the call's keys, whose highest is the key it reached.
  FallbackCall(const c10::OperatorHandle& op, c10::DispatchKeySet dispatch_keys) requires kLayouts
      : op_(op),
        schema_(op.schema()),
        backing_keys_(backing_layout_keys(dispatch_keys)) {}

  void run(torch::jit::Stack* stack) {
    const auto& arguments = schema_.arguments();
    const size_t first = stack->size() - arguments.size();
    Call call(schema_.name().c_str(), schema_.overload_name().c_str(), runtime::LaunchKind::Kernel,
              [&] { return prepare(*stack, first); });
    call.run([&] { op_.redispatchBoxed(kLayouts ? backing_keys_ : call.keys(), stack); });

    for (Alias& alias : aliases_) {
      if (alias.is_write) sync_back(alias);
    }
    if constexpr (kLayouts) {
      for (LayoutAlias& alias : layout_aliases_) {
        if (!alias.is_write) continue;
        if (alias.brick.is_nested()) {
          sync_back_nested(alias);
        } else {
          sync_back_sparse(alias);
        }
      }
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
  // A sparse or nested brick argument and the backing tensor of its kind that stands for it:
  // sparse, over aliases of its members; nested, over an alias of its storage.
  struct LayoutAlias {
    at::Tensor brick;
    at::Tensor backing;
    bool is_write;
  };

  // The backing device's key of the functionality (sparse, nested) `dispatch_keys` reached.
  static c10::DispatchKeySet backing_layout_keys(c10::DispatchKeySet dispatch_keys) {
    const c10::DispatchKey functionality =
        c10::toFunctionalityKey(dispatch_keys.highestPriorityTypeId());
    return c10::DispatchKeySet(c10::toRuntimePerBackendFunctionalityKey(
        functionality,
        c10::toBackendComponent(backing_dispatch_key_set().highestPriorityTypeId())));
  }

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
    if constexpr (kLayouts) {
      if (tensor.device().type() == kBrick && (is_sparse_layout(tensor) || tensor.is_nested())) {
        return layout_to_backing(argument, tensor, is_write);
      }
    }
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
    settle_device(argument, tensor);
    c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    for (Alias& alias : aliases_) {
      if (alias.brick.unsafeGetTensorImpl() == impl) {
        alias.is_write = alias.is_write || is_write;
        return alias.backing;
      }
    }
    at::Tensor backing = make_backing_tensor(tensor, backing_storage_of(tensor.storage()));
    aliases_.push_back({tensor, backing, is_write});
    return backing;
  }

  // The op runs on the device of its first brick argument; every other one must be there too.
  void settle_device(const c10::Argument& argument, const at::Tensor& tensor) {
    const auto device = tensor.device().index();
    if (device_ < 0) {
      device_ = device;
    } else if (device != device_) {
      device_mismatch(argument, tensor);
    }
  }

  // Tensors that share a brick storage share one backing storage, so backing kernels see their
  // aliasing (overlap checks, in-place on views).
  c10::Storage backing_storage_of(const c10::Storage& brick_storage) {
    for (const StoragePair& pair : storages_) {
      if (pair.brick.unsafeGetStorageImpl() == brick_storage.unsafeGetStorageImpl()) {
        return pair.backing;
      }
    }
    c10::Storage backing_storage = make_backing_storage(brick_storage);
    storages_.push_back({backing_storage, brick_storage});
    return backing_storage;
  }

  // The backing tensor for sparse or nested brick tensor `tensor`: a backing sparse tensor over
  // aliases of its members (a kernel that writes it may write them), or a backing nested tensor
  // over an alias of its storage.
  at::Tensor layout_to_backing(const c10::Argument& argument, const at::Tensor& tensor,
                               bool is_write) {
    c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
    const bool nested = tensor.is_nested();
    for (LayoutAlias& alias : layout_aliases_) {
      if (alias.brick.unsafeGetTensorImpl() != impl) continue;
      if (is_write && !alias.is_write) {
        alias.is_write = true;
        if (!nested) {
          for (const at::Tensor& member : sparse_members(tensor)) {
            to_backing(argument, member, true, false);
          }
        }
      }
      return alias.backing;
    }
    at::Tensor backing;
    if (nested) {
      settle_device(argument, tensor);
      backing =
          make_nested_tensor(tensor, backing_storage_of(tensor.storage()), backing_dense_keys());
    } else {
      auto members = sparse_members(tensor);
      for (at::Tensor& member : members) member = to_backing(argument, member, is_write, false);
      backing = make_sparse_tensor(tensor, backing_device(tensor.device().index()), members);
    }
    layout_aliases_.push_back({tensor, backing, is_write});
    return backing;
  }

  // The dispatch keys of a dense tensor of the backing device.
  static c10::DispatchKeySet backing_dense_keys() { return backing_dispatch_key_set(); }

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

  // A kernel that resized an argument gave its backing storage new bytes: they become the brick
  // storage's.
  void sync_resized_storage(c10::StorageImpl* backing_storage, c10::StorageImpl* brick_storage) {
    if (backing_storage->data_ptr().get() == brick_storage->data_ptr().get() &&
        backing_storage->nbytes() == brick_storage->nbytes()) {
      return;
    }
    const size_t nbytes = backing_storage->nbytes();
    c10::DataPtr data =
        backing_storage->set_data_ptr(c10::DataPtr(nullptr, backing_storage->device()));
    brick_storage->set_data_ptr_noswap(to_brick_data_ptr(std::move(data), nbytes, device_));
    brick_storage->set_nbytes(nbytes);
    // Later results that view this backing storage must see the brick bytes.
    c10::DataPtr view(brick_storage->data_ptr().get(), backing_storage->device());
    backing_storage->set_data_ptr_noswap(std::move(view));
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
      sync_resized_storage(backing_storage, brick_storage);
    } else {
      // The kernel pointed the argument at another storage (set_).
      brick->set_storage_keep_dtype(brick_storage_for(backing_storage));
    }
    if (brick->sizes() != backing->sizes() || brick->strides() != backing->strides() ||
        brick->storage_offset() != backing->storage_offset()) {
      brick->set_sizes_and_strides(backing->sizes(), backing->strides(), backing->storage_offset());
    }
  }

  // Moves what a kernel did to a sparse argument (new members, sizes, coalesced flag) into the
  // brick tensor; its members' own writes are synced already.
  void sync_back_sparse(LayoutAlias& alias) {
    auto members = sparse_members(alias.backing);
    for (at::Tensor& member : members) member = to_brick(member);
    assign_sparse_tensor(alias.brick, alias.backing, members);
  }

  // Moves what a kernel wrote into a nested argument into the brick tensor: its bytes (the
  // nested kernels that write in place keep its nested sizes, strides and offsets).
  void sync_back_nested(LayoutAlias& alias) {
    c10::StorageImpl* backing_storage = alias.backing.storage().unsafeGetStorageImpl();
    c10::StorageImpl* brick_storage = alias.brick.storage().unsafeGetStorageImpl();
    TORCH_CHECK(backing_storage_of(alias.brick.storage()).unsafeGetStorageImpl() == backing_storage,
                "brick: ", schema_.name(),
                " pointed a nested tensor at other memory, which brick "
                "cannot carry back to the brick tensor");
    sync_resized_storage(backing_storage, brick_storage);
  }

  // A sparse or nested result as a brick tensor of its layout.
  at::Tensor layout_to_brick(const at::Tensor& result) {
    c10::TensorImpl* impl = result.unsafeGetTensorImpl();
    for (const LayoutAlias& alias : layout_aliases_) {
      if (alias.backing.unsafeGetTensorImpl() == impl) return alias.brick;
    }
    if (result.is_nested()) {
      return make_nested_tensor(result, brick_storage_of_result(result.storage()),
                                c10::DispatchKeySet(c10::DispatchKey::PrivateUse1));
    }
    auto members = sparse_members(result);
    for (at::Tensor& member : members) member = to_brick(member);
    return make_sparse_tensor(result, c10::Device(kBrick, device_), members);
  }

  // The brick storage a result's backing storage stands for: an argument's, a copy of a backing
  // tensor passed in, or the fresh storage adopted in place.
  c10::Storage brick_storage_of_result(const c10::Storage& storage) {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    if (std::find(foreign_storages_.begin(), foreign_storages_.end(), impl) !=
        foreign_storages_.end()) {
      return copy_foreign_storage(impl);
    }
    return brick_storage_for(impl);
  }

  // A brick copy of the storage of a backing tensor passed in: its owner keeps its memory.
  c10::Storage copy_foreign_storage(c10::StorageImpl* storage) const {
    c10::Storage copy(c10::Storage::use_byte_size_t(), storage->nbytes(), brick_allocator(),
                      /*resizable=*/true);
    // From host memory, or from backing-device memory of this brick device.
    const int source_device = storage->device().is_cpu() ? -1 : device_;
    BRICK_RUNTIME_CALL(rt().copy(copy.mutable_data(), device_, storage->data_ptr().get(),
                                 source_device, storage->nbytes()));
    return copy;
  }

  at::Tensor to_brick(const at::Tensor& result) {
    if (!result.defined() || result.device().type() != backing_device_type()) return result;
    if (is_sparse_nested_or_quantized(result)) [[unlikely]] {
      if (result.is_quantized()) refuse_quantized_result(result, schema_.name().c_str());
      return layout_to_brick(result);
    }
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
      return make_brick_tensor(copy_foreign_storage(storage), result);
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
  c10::SmallVector<LayoutAlias, kLayouts ? 2 : 0> layout_aliases_;
  c10::DispatchKeySet backing_keys_;  // calls of other layouts: the backing device's key
  c10::SmallVector<c10::StorageImpl*, 2> foreign_storages_;
  c10::SmallVector<size_t, 1> pending_generators_;
  c10::DeviceIndex generator_device_ = -1;  // an explicit brick generator's device
  const c10::Argument* mismatch_argument_ = nullptr;
  at::Tensor mismatch_tensor_;
};

void brick_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet /*key_set*/,
                    torch::jit::Stack* stack) {
  FallbackCall<FallbackKeys::kDense>(op).run(stack);
}

void brick_layout_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet key_set,
                           torch::jit::Stack* stack) {
  FallbackCall<FallbackKeys::kLayouts>(op, key_set).run(stack);
}

}  // namespace

void run_boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  FallbackCall<FallbackKeys::kDense>(op).run(stack);
}

namespace {

// A library of brick's own aten kernels for dispatch key `key`, alive until the process exits.
std::unique_ptr<torch::Library> brick_kernel_library(
    c10::DispatchKey key = c10::DispatchKey::PrivateUse1) {
  return std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
}

// Registers `fallback` into `library` (of key `key`) as brick's own kernel for every aten op
// without one that `wanted(op, "name.overload")` picks; returns how many.
template <c10::BoxedKernel::BoxedKernelFunction_withDispatchKeys* fallback = &brick_fallback,
          typename Wanted>
int register_fallback_where(torch::Library& library, Wanted&& wanted,
                            c10::DispatchKey key = c10::DispatchKey::PrivateUse1) {
  auto& dispatcher = c10::Dispatcher::singleton();
  int registered = 0;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto op = dispatcher.findOp(name);
    if (!op.has_value() || op->hasKernelForDispatchKey(key)) continue;
    const std::string qualified =
        name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    if (!wanted(*op, qualified)) continue;
    library.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<fallback>());
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

int register_layout_fallback_kernels() {
  // PyTorch prefers a composite kernel to a backend fallback: on brick's sparse and nested keys,
  // ops with both a sparse (nested) backing kernel and a composite one (values, crow_indices,
  // copy_, transpose, ...) would run the composite one, made for dense tensors. As the backing
  // device does, brick runs the sparse (nested) kernel: the fallback is their own kernel there.
  const auto register_for = [](c10::DispatchKey functionality) {
    const auto brick_key = c10::toRuntimePerBackendFunctionalityKey(
        functionality, c10::BackendComponent::PrivateUse1Bit);
    const auto cpu_key =
        c10::toRuntimePerBackendFunctionalityKey(functionality, c10::BackendComponent::CPUBit);
    const auto cuda_key =
        c10::toRuntimePerBackendFunctionalityKey(functionality, c10::BackendComponent::CUDABit);
    static std::vector<std::unique_ptr<torch::Library>> libraries;
    libraries.push_back(brick_kernel_library(brick_key));
    return register_fallback_where<&brick_layout_fallback>(
        *libraries.back(),
        [&](const c10::OperatorHandle& op, const std::string& /*name*/) {
          return op.hasKernelForDispatchKey(cpu_key) || op.hasKernelForDispatchKey(cuda_key);
        },
        brick_key);
  };
  static const int registered = register_for(c10::DispatchKey::Sparse) +
                                register_for(c10::DispatchKey::SparseCsr) +
                                register_for(c10::DispatchKey::NestedTensor);
  return registered;
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&brick_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&brick_layout_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&brick_layout_fallback>());
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&brick_layout_fallback>());
}

}  // namespace brick::backend
