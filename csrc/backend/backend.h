// The brick backend: PyTorch's PrivateUse1 device, executed by the runtime's backing device.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

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

// The brick device a factory op (`op`, for errors) makes its tensor on: its `device=` argument,
// which must be a brick device, or the current brick device for none or one without an index.
c10::DeviceIndex factory_device_index(std::optional<c10::Device> device, const char* op);
// Throws unless `layout` is none or strided, the only layout brick tensors have.
void check_strided_layout(std::optional<c10::Layout> layout, const char* op);

// Makes `device` the calling thread's current brick device for a scope; restores the previous
// one on exit, also when an exception leaves the scope. A negative device changes nothing.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : previous_(rt().current_device()) {
    if (device >= 0 && device != previous_) rt().set_current_device(device);
  }
  ~DeviceScope() {
    if (rt().current_device() != previous_) rt().set_current_device(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_;
};

// The allocator behind every brick storage. Reports to PyTorch's memory profiler.
c10::Allocator* brick_allocator();
bool is_brick_allocation(const c10::DataPtr& data_ptr);

// Pinned host memory on the host runtime (pinned_memory.cpp): blocks of host memory that
// `is_host_pinned` recognises, for any address inside one.
c10::Allocator* host_pinned_allocator();
bool is_host_pinned(const void* data);

// Frees what brick's allocator caches: nothing on the host runtime (allocations are returned to
// the system when freed); PyTorch's CUDA caching allocator's unused blocks on CUDA backing.
void empty_brick_cache();
// (free, total) bytes of the memory behind brick device `device`: the host's physical memory on
// the host runtime, the GPU's on CUDA backing.
std::pair<size_t, size_t> brick_memory_info(c10::DeviceIndex device);

// Brick memory `data_ptr` is used by work queued on `stream` of brick `device`: its free waits
// for that work (record_stream). Memory of any other kind is left alone.
void record_stream_use(const c10::DataPtr& data_ptr, c10::DeviceIndex device,
                       runtime::StreamId stream);

// Turns a DataPtr allocated by the backing device's allocator into brick memory without copying:
// relabels its device and counts its bytes in brick's statistics until it is freed.
c10::DataPtr adopt_data_ptr(c10::DataPtr original, size_t nbytes, c10::DeviceIndex device);

// Relabels brick memory (brick allocator or adopted) as belonging to `device`; anything else is
// adopted first.
c10::DataPtr to_brick_data_ptr(c10::DataPtr data_ptr, size_t nbytes, c10::DeviceIndex device);

// Backing-device views of brick memory. `make_backing_storage` aliases a brick storage's bytes
// as a storage of the backing device; backing-device kernels that grow it (out= results) get
// brick memory from its allocator. `make_backing_tensor` views such a storage with a brick
// tensor's dtype, sizes, strides, storage offset and conj/neg bits.
c10::Storage make_backing_storage(const c10::Storage& brick_storage);
at::Tensor make_backing_tensor(const at::Tensor& brick_tensor, c10::Storage backing_storage);
at::Tensor make_backing_alias(const at::Tensor& brick_tensor);
// The same, reusing one of the calling thread's earlier aliases that nothing uses any more
// (alias_pool.h; `LentAliases` lends them to one call without copying).
at::Tensor make_reused_backing_alias(const at::Tensor& brick_tensor);
// The alias of an optional argument; undefined for none (or an undefined tensor).
at::Tensor make_backing_alias(const std::optional<at::Tensor>& brick_tensor);

// A brick tensor on `brick_storage` with the dtype and geometry of the backing tensor `like`.
at::Tensor make_brick_tensor(c10::Storage brick_storage, const at::Tensor& like);

// Makes a backing-device storage that nothing else owns (a fresh kernel result) brick memory on
// `device`, in place and without copying. A no-op for a storage that is brick already.
void adopt_storage_in_place(c10::StorageImpl* storage, c10::DeviceIndex device);

// Turns a fresh result of a backing-device kernel into a brick tensor on `device`, in place.
at::Tensor adopt_result(at::Tensor result, c10::DeviceIndex device);

// Resizes a brick storage to `new_nbytes`, keeping the common prefix of its bytes.
void resize_brick_storage_bytes(const c10::Storage& storage, size_t new_nbytes);

// Adds to `error`, raised by the backing device's kernel of op `name` (with `overload_name`), the
// context every brick kernel gives it: which op on which brick device failed, and on what.
void add_backing_failure_context(c10::Error& error, const std::string& name,
                                 const std::string& overload_name, c10::DeviceIndex device);

// Runs `op` on `stack` through the boxed fallback (the way every op without a kernel of its own
// runs): for the direct kernels' unusual calls.
void run_boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Registers the fallback as brick's own kernel for ops PyTorch would otherwise decompose into
// an allocation plus their out= form; returns how many. Called by ensure_registered().
int register_direct_fallback_kernels();

// On CUDA backing, registers the fallback as brick's own kernel for ops that decompose on every
// device but CUDA, whose own kernel is one fused kernel there (_fused_rms_norm: F.rms_norm is
// one CUDA kernel, six without it); returns how many. Run once CUDA backing is decided
// (detail::set_backing_setup): on host backing these ops keep their decomposition (the CPU has
// no such kernel, nor one for their backward).
int register_cuda_backing_kernels();

// On host backing, registers brick's autograd kernels for the composite ops that branch on the
// device type in ways that change results (the recurrent layers and cells): they run as the CPU
// runs them, on aliases of brick memory, the CPU's autograd graph included (backing_graph.cpp).
// Run once host backing is decided. On CUDA backing these ops decompose on brick.
void register_host_backing_kernels();

// Registered once: hooks, device guard, generator, allocator. Safe to call repeatedly.
void ensure_registered();

}  // namespace brick::backend
