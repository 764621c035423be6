// The calling thread's backing aliases, kept for reuse by the direct kernels and copies.
//
// An alias that nothing uses once its op is done is pointed at the next call's brick tensor
// instead of being freed and made anew (a TensorImpl and a StorageImpl allocated, constructed,
// destroyed and freed per tensor argument per op). `LentAliases` lends them to one call without
// copying them, so no reference count moves (each copy and release of a tensor is an atomic
// read-modify-write); a kernel that keeps an alias copies it, which the pool then sees.
#pragma once

#include <ATen/Tensor.h>

#include <array>
#include <cstdint>
#include <deque>

#include "runtime/per_thread.h"

namespace brick::backend {

struct AliasPool {
  static constexpr size_t kSize = 8;
  std::array<at::Tensor, kSize> aliases;
  uint32_t lent = 0;  // bit i: aliases[i] is lent to a call that is still running
  size_t next = 0;    // where a new alias goes when no slot is free (round robin)

  static AliasPool* get() noexcept { return runtime::PerThread<AliasPool>::get(); }
};

// Backing aliases of brick tensors for the duration of one call (a scope): each alias returned
// stays this scope's until it ends. Scopes nest on a thread (each restores what it found).
// The pool is looked up at the first alias: a call that lends none (brick's structured kernels)
// never touches it.
class LentAliases {
 public:
  LentAliases() noexcept = default;
  ~LentAliases() {
    if (pool_ != nullptr) pool_->lent = lent_before_;
    if (own_ != nullptr) [[unlikely]]
      release_own();  // checked inline, freed out of line: most calls have none
  }
  LentAliases(const LentAliases&) = delete;
  LentAliases& operator=(const LentAliases&) = delete;

  // The backing alias of `brick_tensor`, valid until this scope ends. Mutable for the in-place
  // kernels' `Tensor& self`; the caller never reassigns it (the pool owns the slot).
  at::Tensor& operator()(const at::Tensor& brick_tensor);

 private:
  [[gnu::cold]] void release_own() noexcept;

  AliasPool* pool_ = nullptr;  // none before the first alias, and while the thread exits
  uint32_t lent_before_ = 0;
  bool looked_up_ = false;
  // Aliases made for this call alone: when the thread has no pool, or every slot is lent.
  std::deque<at::Tensor>* own_ = nullptr;
};

}  // namespace brick::backend
