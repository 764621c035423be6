// Brick tensors beyond the strided layout.
//
// Sparse tensors, COO and the compressed layouts (CSR, CSC, BSR, BSC), are brick tensors whose
// member tensors (indices, values) are dense brick tensors; strided nested tensors hold a brick
// storage and their nested sizes, strides and offsets (CPU tensors, as on every device). The
// boxed fallback runs their ops as the backing device's sparse or nested kernels over backing
// tensors of the same memory (fallback.cpp). Jagged nested tensors are Python tensors over dense
// brick tensors (their math attention goes through strided nested ones). Quantized tensors have
// no brick kernels: brick refuses to make one, naming what was asked and what brick supports.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/Storage.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

namespace brick::backend {

// True for a tensor of a sparse layout, COO or compressed (CSR, CSC, BSR, BSC: Tensor's
// is_sparse_csr() is CSR's alone). Reads the key set only.
inline bool is_sparse_layout(const at::Tensor& tensor) {
  return tensor.key_set().has_any(
      c10::DispatchKeySet({c10::DispatchKey::Sparse, c10::DispatchKey::SparseCsr}));
}

// Whether `tensor` is anything but a plain dense tensor (sparse, nested or quantized): one test of
// its key set, for the op path's results.
inline bool is_sparse_nested_or_quantized(const at::Tensor& tensor) {
  return tensor.key_set().has_any(
      c10::DispatchKeySet({c10::DispatchKey::Sparse, c10::DispatchKey::SparseCsr,
                           c10::DispatchKey::NestedTensor, c10::DispatchKey::Quantized}));
}

// The member tensors of sparse tensor `sparse`, read without dispatch: COO's indices and values;
// a compressed layout's compressed indices, plain indices and values.
c10::SmallVector<at::Tensor, 3> sparse_members(const at::Tensor& sparse);

// A sparse tensor on `device` with the layout, dtype, sizes, sparse and dense dims and coalesced
// flag of sparse tensor `like`, over `members` (tensors on `device`, as sparse_members lists
// them), which it holds as they are: no copy.
at::Tensor make_sparse_tensor(const at::Tensor& like, c10::Device device,
                              c10::ArrayRef<at::Tensor> members);

// Gives sparse tensor `target` the sizes, sparse and dense dims and coalesced flag of `like` and
// `members` (on target's device) as its own: what a kernel did to a sparse argument.
void assign_sparse_tensor(const at::Tensor& target, const at::Tensor& like,
                          c10::ArrayRef<at::Tensor> members);

// A strided nested tensor over `storage` (of the device `dense_keys`, the dispatch keys of a
// dense tensor there, name) with the nested sizes, strides, offsets and dtype of nested tensor
// `like`: no copy.
at::Tensor make_nested_tensor(const at::Tensor& like, c10::Storage storage,
                              c10::DispatchKeySet dense_keys);

// Throws for `result`, a quantized result of brick op `op`: brick holds no quantized tensor. The
// message names the op, what it made and what brick supports.
[[noreturn]] void refuse_quantized_result(const at::Tensor& result, const char* op);

}  // namespace brick::backend
