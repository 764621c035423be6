// The RecordFunction callback options of brick's observer, in one place: the observer registers
// its callbacks with them, and benchmarks/empty_callback.py registers an empty pair with them
// (the floor it is compared with must run under exactly the same conditions).
#pragma once

#include <ATen/record_function.h>

namespace brick::profiler {

// `needs_inputs`: PyTorch copies each op's inputs for the callback (recording shapes). `ops`:
// ops (scope FUNCTION) are observed too; without them PyTorch's dispatcher keeps its fast path
// (ops are then timed at brick's kernels: OpTiming::Kernels).
inline at::RecordFunctionCallback observer_callback(at::RecordFunctionCallback::StartCallback enter,
                                                    at::RecordFunctionCallback::EndCallback exit,
                                                    bool needs_inputs = false, bool ops = true) {
  auto callback = at::RecordFunctionCallback(enter, exit)
                      .needsInputs(needs_inputs)
                      .needsOutputs(false)
                      .needsIds(false);
  if (ops) {
    return callback.scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                            at::RecordScope::USER_SCOPE});
  }
  return callback.scopes({at::RecordScope::BACKWARD_FUNCTION, at::RecordScope::USER_SCOPE});
}

}  // namespace brick::profiler
