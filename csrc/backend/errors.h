// Turns runtime errors into c10::Error, which PyTorch reports to Python as RuntimeError.
#pragma once

#include <c10/util/Exception.h>

#include "runtime/runtime.h"

#define BRICK_RUNTIME_CALL(expr)                      \
  do {                                                \
    try {                                             \
      expr;                                           \
    } catch (const ::brick::runtime::Error& error_) { \
      TORCH_CHECK(false, error_.what());              \
    }                                                 \
  } while (false)

namespace brick::backend {

// Evaluates `fn()` and converts a runtime::Error into a c10::Error.
template <typename Fn>
auto runtime_call(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const runtime::Error& error) {
    TORCH_CHECK(false, error.what());
  }
}

}  // namespace brick::backend
