// Brick's own autograd nodes across PyTorch versions: PyTorch holds nodes by c10::intrusive_ptr
// since 2.13, by std::shared_ptr before.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace brick::backend {

// A new node of type `T`, held as PyTorch holds nodes.
template <typename T, typename... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, T>) {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  } else {
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...));
  }
}

// A node's pointer to itself (to unpack the outputs it saved), held as PyTorch holds nodes.
template <typename T>
auto pointer_to(T* node) {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, T>) {
    return c10::intrusive_ptr<T>::reclaim_copy(node);
  } else {
    return node->shared_from_this();
  }
}

}  // namespace brick::backend
