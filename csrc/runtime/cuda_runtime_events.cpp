// The CUDA runtime's events (CUDA events) and their completion times on the host clock, through
// per-device clock references.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "common/steady_clock.h"
#include "runtime/cuda_runtime_impl.h"
#include "runtime/cuda_support.h"
#include "runtime/runtime.h"

namespace brick::runtime::cuda_detail {

Event* CudaRuntime::create_event(DeviceIndex device, bool enable_timing) {
  check_device(device);
  auto event = std::make_unique<CudaEvent>();
  event->device = device;
  event->timing = enable_timing;
  DeviceGuard guard(device);  // an event belongs to the context current at creation
  check(cudaEventCreateWithFlags(&event->handle,
                                 enable_timing ? cudaEventDefault : cudaEventDisableTiming),
        "creating an event", device);
  return event.release();
}

void CudaRuntime::destroy_event(Event* base) noexcept {
  if (base == nullptr) return;
  CudaEvent* event = as_cuda(base);
  {
    DeviceGuard guard(event->device, std::nothrow);
    const cudaError_t status = guard.ok() ? cudaEventDestroy(event->handle) : guard.status();
    if (status != cudaSuccess) (void)cudaGetLastError();  // nothing useful to do at a destroy
  }
  delete event;
}

void CudaRuntime::record_event(Event* base, DeviceIndex device, StreamId stream) {
  CudaEvent* event = as_cuda(base);
  check_device(device);
  const cudaStream_t handle = stream_handle(device, stream);
  if (event->device != device) {
    throw Error("brick: event was created on brick:" + std::to_string(event->device) +
                " but is being recorded on a stream of brick:" + std::to_string(device));
  }
  DeviceGuard guard(device);
  // Recording inside a capture is legal and orders the capture's streams; what such an event
  // cannot do (be queried, synchronized, timed) is refused when asked.
  const bool in_capture = capture_active(handle, device);
  check(cudaEventRecord(event->handle, handle), "recording an event", device);
  event->recorded_in_capture.store(in_capture, std::memory_order_release);
  event->recorded.store(true, std::memory_order_release);
}

bool CudaRuntime::query_event(Event* base) {
  CudaEvent* event = as_cuda(base);
  if (!event->recorded.load(std::memory_order_acquire)) return true;  // as CUDA
  refuse_if_recorded_in_capture(*event, "queried");
  // The guard keeps a thread with no context current from creating one on device 0.
  DeviceGuard guard(event->device);
  RelaxedCaptureMode relaxed;
  const cudaError_t status = cudaEventQuery(event->handle);
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  throw_cuda(status, "querying an event", event->device);
}

void CudaRuntime::synchronize_event(Event* base) {
  CudaEvent* event = as_cuda(base);
  if (!event->recorded.load(std::memory_order_acquire)) return;  // as CUDA
  refuse_if_recorded_in_capture(*event, "synchronized");
  DeviceGuard guard(event->device);
  RelaxedCaptureMode relaxed;
  check(cudaEventSynchronize(event->handle), "synchronizing an event", event->device);
}

void CudaRuntime::stream_wait_event(DeviceIndex device, StreamId stream, Event* base) {
  CudaEvent* event = as_cuda(base);
  check_device(device);
  const cudaStream_t handle = stream_handle(device, stream);
  if (!event->recorded.load(std::memory_order_acquire)) return;  // waits for nothing
  DeviceGuard guard(device);
  check(cudaStreamWaitEvent(handle, event->handle, 0), "making a stream wait for an event", device);
}

double CudaRuntime::elapsed_ms(Event* start_base, Event* end_base) {
  CudaEvent* start = as_cuda(start_base);
  CudaEvent* end = as_cuda(end_base);
  if (!start->timing || !end->timing) {
    throw Error("brick: elapsed time needs both events created with enable_timing=True");
  }
  if (!start->recorded.load(std::memory_order_acquire) ||
      !end->recorded.load(std::memory_order_acquire)) {
    throw Error("brick: elapsed time needs both events to be recorded first");
  }
  if (start->device != end->device) {
    throw Error("brick: elapsed time needs both events on the same device, got brick:" +
                std::to_string(start->device) + " and brick:" + std::to_string(end->device));
  }
  refuse_if_recorded_in_capture(*start, "timed");
  refuse_if_recorded_in_capture(*end, "timed");
  // Without the guard, a thread whose current device has no context would create one.
  DeviceGuard guard(start->device);
  RelaxedCaptureMode relaxed;
  float ms = 0.0f;
  const cudaError_t status = cudaEventElapsedTime(&ms, start->handle, end->handle);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    const bool start_done = cudaEventQuery(start->handle) != cudaErrorNotReady;
    const bool end_done = cudaEventQuery(end->handle) != cudaErrorNotReady;
    (void)cudaGetLastError();
    const char* which = !start_done && !end_done ? "neither event has"
                        : !start_done            ? "the start event has not"
                                                 : "the end event has not";
    throw Error(std::string("brick: elapsed time needs both events to have completed, but ") +
                which + " completed yet on " + device_label(start->device) +
                " (synchronize the end event first)");
  }
  check(status, "measuring the time between two events", start->device);
  return static_cast<double>(ms);
}

int64_t CudaRuntime::event_host_time_ns(Event* base) {
  CudaEvent* event = as_cuda(base);
  if (!event->timing || !event->recorded.load(std::memory_order_acquire)) return -1;
  refuse_if_recorded_in_capture(*event, "timed");
  const DeviceIndex device = event->device;
  DeviceGuard guard(device);
  RelaxedCaptureMode relaxed;
  const cudaError_t status = cudaEventQuery(event->handle);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return -1;
  }
  check(status, "querying an event", device);

  DeviceState& state = devices_[device];
  std::lock_guard<std::mutex> lock(state.clock_mutex);
  if (state.newest_clock_reference < 0 ||
      steady_ns() - state.clock_references[state.newest_clock_reference].host_ns >
          kClockReferenceMaxAgeNs) {
    add_clock_reference(state, device);
  }
  // Estimate from the newest reference, then measure again from the nearest one.
  const ClockReference& newest = state.clock_references[state.newest_clock_reference];
  const int64_t estimate = newest.host_ns + ns_between(newest.event, event->handle, device);
  const ClockReference* nearest = &newest;
  for (const ClockReference& reference : state.clock_references) {
    if (reference.valid &&
        std::llabs(reference.host_ns - estimate) < std::llabs(nearest->host_ns - estimate)) {
      nearest = &reference;
    }
  }
  if (nearest == &newest) return estimate;
  return nearest->host_ns + ns_between(nearest->event, event->handle, device);
}

void CudaRuntime::refuse_if_recorded_in_capture(const CudaEvent& event, const char* what) {
  if (event.recorded_in_capture.load(std::memory_order_acquire)) {
    throw Error(std::string("brick: an event recorded while its stream was being captured "
                            "into a CUDA graph cannot be ") +
                what + " (record it again outside the capture); on " + device_label(event.device));
  }
}

void CudaRuntime::add_clock_reference(DeviceState& state, DeviceIndex device) {
  if (state.clock_stream == nullptr) {
    int least = 0;
    int greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "querying the stream priority range",
          device);
    check(cudaStreamCreateWithPriority(&state.clock_stream, cudaStreamNonBlocking, greatest),
          "creating the clock calibration stream", device);
  }
  const int slot = (state.newest_clock_reference + 1) % kClockReferences;
  ClockReference& reference = state.clock_references[slot];
  reference.valid = false;  // about to be re-recorded
  if (reference.event == nullptr) {
    check(cudaEventCreateWithFlags(&reference.event, cudaEventDefault),
          "creating a clock calibration event", device);
  }
  // The event's timestamp lies between the host times just before its record and just after
  // it is seen complete; the reference is that window's midpoint, so its error is at most half
  // the window. Polling (not a blocking synchronize, whose wake-up can take tens of µs) keeps
  // the window short; a wide one (the thread was preempted) is measured again.
  for (int attempt = 0; attempt < kClockReferenceAttempts; ++attempt) {
    const int64_t before = steady_ns();
    check(cudaEventRecord(reference.event, state.clock_stream),
          "recording a clock calibration event", device);
    cudaError_t status = cudaErrorNotReady;
    while ((status = cudaEventQuery(reference.event)) == cudaErrorNotReady) {
    }
    (void)cudaGetLastError();  // the polls' "not ready" must not reach PyTorch's next check
    check(status, "waiting for a clock calibration event", device);
    const int64_t after = steady_ns();
    reference.host_ns = before + (after - before) / 2;
    if (after - before <= kClockReferenceTightSpanNs) break;
  }
  reference.valid = true;
  state.newest_clock_reference = slot;
}

int64_t CudaRuntime::ns_between(cudaEvent_t from, cudaEvent_t to, DeviceIndex device) {
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, from, to), "measuring an event against the host clock", device);
  return std::llround(static_cast<double>(ms) * 1e6);
}

}  // namespace brick::runtime::cuda_detail
