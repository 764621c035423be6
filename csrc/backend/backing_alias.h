// Backing-device views of brick memory, and brick views of backing memory: tensors that share
// bytes across the two devices, without a copy.
//
// Aliases a kernel needs for one call are lent by its BackingCall (backing_call.h), from the
// calling thread's pool (alias_pool.h); `make_backing_alias` makes one that may outlive any call
// (an autograd graph of the backing device, a collective's work).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Storage.h>

#include <optional>

namespace brick::backend {

// Aliases a brick storage's bytes as a storage of the backing device; backing-device kernels
// that grow it (out= results) get brick memory from its allocator.
c10::Storage make_backing_storage(const c10::Storage& brick_storage);
// Views such a storage with a brick tensor's dtype, sizes, strides, storage offset and conj/neg
// bits.
at::Tensor make_backing_tensor(const at::Tensor& brick_tensor, c10::Storage backing_storage);
at::Tensor make_backing_alias(const at::Tensor& brick_tensor);
// The alias of an optional argument; undefined for none (or an undefined tensor).
at::Tensor make_backing_alias(const std::optional<at::Tensor>& brick_tensor);

// A brick tensor on `brick_storage` with the dtype and geometry of the backing tensor `like`.
at::Tensor make_brick_tensor(c10::Storage brick_storage, const at::Tensor& like);

}  // namespace brick::backend
