// Backing aliases of brick memory, brick tensors on backing geometry, and the body of the
// calling thread's alias pool (backing_alias.h, alias_pool.h).
#include "backend/backing_alias.h"

#include <c10/core/TensorImpl.h>

#include <deque>

#include "backend/alias_pool.h"
#include "backend/allocator.h"
#include "backend/device_index.h"
#include "common/hot_path.h"

namespace brick::backend {

c10::Storage make_backing_storage(const c10::Storage& brick_storage) {
  const c10::StorageImpl* storage = brick_storage.unsafeGetStorageImpl();
  // Non-owning: the brick storage keeps the memory alive for the alias's lifetime.
  c10::DataPtr view(storage->data_ptr().get(), backing_device(storage->device().index()));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                            storage->nbytes(), std::move(view),
                                                            backing_alias_allocator(),
                                                            /*resizable=*/true));
}

namespace {

// Gives `impl` the geometry and conj/neg bits of `like`.
void copy_geometry(c10::TensorImpl* impl, const at::Tensor& like) {
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
}

}  // namespace

at::Tensor make_backing_tensor(const at::Tensor& brick_tensor, c10::Storage backing_storage) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(backing_storage), backing_dispatch_key_set(), brick_tensor.dtype());
  copy_geometry(impl.get(), brick_tensor);
  return at::Tensor(std::move(impl));
}

at::Tensor make_backing_alias(const at::Tensor& brick_tensor) {
  return make_backing_tensor(brick_tensor, make_backing_storage(brick_tensor.storage()));
}

namespace {

// Element by element, inline: a tensor has few dims, and memcmp's call costs more than the loop.
bool same_values(c10::IntArrayRef a, c10::IntArrayRef b) noexcept {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// The first slot whose alias nothing uses: not lent to a running call, referenced by the pool
// alone and the only user of its storage (a kernel may keep either); -1 for none.
int free_slot(const AliasPool& pool) noexcept {
  for (size_t i = 0; i < AliasPool::kSize; ++i) {
    const at::Tensor& alias = pool.aliases[i];
    if ((pool.lent >> i) & 1u || !alias.defined()) continue;
    if (alias.use_count() == 1 && alias.weak_use_count() == 1 &&
        alias.unsafeGetTensorImpl()->unsafe_storage().use_count() == 1) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// Points the pool's alias at `brick_tensor`: its bytes, dtype, geometry and conj/neg bits.
BRICK_HOT_PATH void point_alias(const at::Tensor& alias, const at::Tensor& brick_tensor) {
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  const c10::StorageImpl* brick_storage =
      brick_tensor.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  c10::StorageImpl* storage = impl->unsafe_storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(brick_storage->data_ptr().get(),
                                            backing_device(brick_storage->device().index())));
  if (storage->nbytes() != brick_storage->nbytes()) storage->set_nbytes(brick_storage->nbytes());
  if (impl->dtype() != brick_tensor.dtype()) {
    impl->set_storage_and_dtype(impl->unsafe_storage(), brick_tensor.dtype());
  }
  // A loop's ops see the same shapes again and again: the alias often has them already.
  if (!same_values(impl->sizes(), brick_tensor.sizes()) ||
      !same_values(impl->strides(), brick_tensor.strides()) ||
      impl->storage_offset() != brick_tensor.storage_offset()) {
    impl->set_sizes_and_strides(brick_tensor.sizes(), brick_tensor.strides(),
                                brick_tensor.storage_offset());
  }
  if (impl->is_conj() != brick_tensor.is_conj()) impl->_set_conj(brick_tensor.is_conj());
  if (impl->is_neg() != brick_tensor.is_neg()) impl->_set_neg(brick_tensor.is_neg());
}

// The slot a new alias replaces: the next one round robin that is not lent; -1 when all are.
int slot_to_replace(AliasPool& pool) noexcept {
  for (size_t tries = 0; tries < AliasPool::kSize; ++tries) {
    const size_t slot = pool.next;
    pool.next = (pool.next + 1) % AliasPool::kSize;
    if (((pool.lent >> slot) & 1u) == 0) return static_cast<int>(slot);
  }
  return -1;
}

}  // namespace

void LentAliases::release_own() noexcept { delete own_; }

BRICK_HOT_PATH at::Tensor& LentAliases::operator()(const at::Tensor& brick_tensor) {
  if (!looked_up_) {
    looked_up_ = true;
    pool_ = AliasPool::get();
    if (pool_ != nullptr) lent_before_ = pool_->lent;
  }
  if (pool_ != nullptr) [[likely]] {
    int slot = free_slot(*pool_);
    if (slot >= 0) {
      point_alias(pool_->aliases[slot], brick_tensor);
    } else if (slot = slot_to_replace(*pool_); slot >= 0) {
      pool_->aliases[slot] = make_backing_alias(brick_tensor);
    }
    if (slot >= 0) {
      pool_->lent |= 1u << slot;
      return pool_->aliases[slot];
    }
  }
  if (own_ == nullptr) own_ = new std::deque<at::Tensor>();
  return own_->emplace_back(make_backing_alias(brick_tensor));
}

at::Tensor make_backing_alias(const std::optional<at::Tensor>& brick_tensor) {
  return brick_tensor.has_value() && brick_tensor->defined() ? make_backing_alias(*brick_tensor)
                                                             : at::Tensor();
}

at::Tensor make_brick_tensor(c10::Storage brick_storage, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(brick_storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), like.dtype());
  copy_geometry(impl.get(), like);
  return at::Tensor(std::move(impl));
}

}  // namespace brick::backend
