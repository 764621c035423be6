// Running brick work on its backing device.
//
// The host runtime's backing device is the CPU: a brick op only needs brick's current device
// set. The CUDA runtime's is CUDA device N: PyTorch's CUDA kernels must also find that device
// and the CUDA stream behind brick's current stream as *their* current ones, and brick streams
// are PyTorch's own CUDA streams (registered with the runtime), so brick and plain `cuda` code
// order their work alike. Everything here goes through PyTorch's device-generic interfaces
// (guard implementations, hooks), so one build serves CPU-only and CUDA builds of PyTorch.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/record_function.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "backend/device_index.h"

namespace brick::backend {

// Tells the runtime, before its first use, whether this PyTorch can run CUDA kernels.
void configure_runtime_backing();

namespace detail {
// Whether the calling thread may run autograd-engine work for brick (-1 until asked): any thread
// but the one that loaded brick (backing.cpp).
[[gnu::tls_model("initial-exec")]] inline constinit thread_local int8_t tls_may_run_engine_work =
    -1;
// On the host runtime, once per backward pass on such a thread: the process's thread count.
void follow_process_thread_count();
}  // namespace detail

// For the scope: `device` is brick's current device and, on CUDA backing, its CUDA device and the
// CUDA stream behind its current brick stream are PyTorch's current CUDA device and stream.
// Everything is restored on exit, also when an exception leaves the scope. Inline: every brick
// kernel enters one, and on the host runtime it costs a compare and two thread-local reads.
class BackingScope {
 public:
  [[gnu::always_inline]] explicit BackingScope(c10::DeviceIndex device) : device_scope_(device) {
    if (cuda_backing()) [[unlikely]] {
      enter_cuda(device < 0 ? rt().current_device() : device);
    } else if (detail::tls_may_run_engine_work != 0) [[unlikely]] {
      detail::follow_process_thread_count();
    }
  }
  [[gnu::always_inline]] ~BackingScope() {
    if (entered_cuda_) [[unlikely]]
      leave_cuda();
  }
  BackingScope(const BackingScope&) = delete;
  BackingScope& operator=(const BackingScope&) = delete;

 private:
  void enter_cuda(c10::DeviceIndex device);
  void leave_cuda() noexcept;

  DeviceScope device_scope_;
  bool entered_cuda_ = false;
  c10::Device previous_device_{c10::DeviceType::CUDA};
  c10::Stream previous_stream_{c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CUDA)};
};

// What brick runs on the backing device is the brick op's device work, never another call of it.
// Kernels that compute with ATen ops through full dispatch (convolution, attention, the RNN
// cells) would otherwise record the backing device's whole op chain again under the brick op,
// with the same names, in every profiler (brick's registry, the legacy profiler, Kineto): counts
// above the calls, bricks above 100 % of wall. For the scope the calling thread records no op.
// Free while no profiler listens (no RecordFunction callback registered); while one does,
// PyTorch rebuilds the thread's callback lists on entry and exit, which these heavy ops absorb.
class UnrecordedBackingOps {
 public:
  UnrecordedBackingOps() : silenced_(at::hasCallbacks() && at::isRecordFunctionEnabled()) {
    if (silenced_) at::enableRecordFunction(false);
  }
  ~UnrecordedBackingOps() {
    if (silenced_) at::enableRecordFunction(true);
  }
  UnrecordedBackingOps(const UnrecordedBackingOps&) = delete;
  UnrecordedBackingOps& operator=(const UnrecordedBackingOps&) = delete;

 private:
  bool silenced_;
};

// A brick stream for `device`: on CUDA backing a stream of PyTorch's CUDA stream pool (the same
// streams torch.cuda hands out), registered with the runtime; on the host, a runtime stream.
runtime::StreamId new_brick_stream(c10::DeviceIndex device, int priority);
runtime::StreamId pooled_brick_stream(c10::DeviceIndex device, bool high_priority);

// The CUDA stream behind brick stream `stream` of `device` (CUDA backing only).
c10::Stream backing_cuda_stream(c10::DeviceIndex device, runtime::StreamId stream);

// A generator of the backing device for brick device `device`, seeded with `seed`: a CPU
// generator on the host, an independent CUDA generator (not torch.cuda's default) on CUDA.
at::Generator make_backing_generator(c10::DeviceIndex device, uint64_t seed);

}  // namespace brick::backend
