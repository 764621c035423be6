// The CUDA runtime: brick device N is CUDA device N.
//
// Plain C++ over the CUDA runtime API (no kernels). What it maps to CUDA:
// - Stream 0 of every device is the CUDA legacy default stream, the stream PyTorch's default
//   CUDA stream is, so brick work on it orders with plain `cuda` work. Every other brick stream
//   is a CUDA stream made elsewhere (PyTorch's, on CUDA backing) and registered on first sight
//   by stream_from_native; the runtime creates none.
// - Memory: none. Brick memory on CUDA backing is PyTorch's CUDA caching allocator's, which the
//   backend adopts (Runtime::record_adopted); the runtime copies into it on brick's streams.
// - Events are CUDA events; their completion times are placed on the host clock through
//   per-device reference events.
// - The current device and streams are brick's own per-thread state. CUDA's current device is
//   changed only inside a call that needs it and restored before the call returns.
//
// This header declares the class, its events and its per-device state (private to the runtime
// layer); cuda_runtime.cpp defines construction, memory, copies and streams,
// cuda_runtime_events.cpp events and their clock references.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/runtime.h"
#include "runtime/thread_state.h"

namespace brick::runtime::cuda_detail {

// ---- events ----------------------------------------------------------------------------------

struct CudaEvent final : Event {
  cudaEvent_t handle = nullptr;
  DeviceIndex device = 0;
  bool timing = false;
  std::atomic<bool> recorded{false};
  // Last recorded on a stream that was being captured into a CUDA graph: legal (it orders the
  // capture's streams, as a side stream's fork and join do), but such an event cannot be
  // queried, synchronized or timed until it is recorded again outside a capture.
  std::atomic<bool> recorded_in_capture{false};
};

inline CudaEvent* as_cuda(Event* event) noexcept { return static_cast<CudaEvent*>(event); }

// ---- per-device state ------------------------------------------------------------------------

// Stream handles live in fixed chunks that are never moved, so the hot-path lookup of a handle
// is two loads with no lock: entries are written before the count that publishes them.
constexpr StreamId kStreamsPerChunk = 256;
constexpr StreamId kStreamChunks = 256;
constexpr StreamId kMaxStreamsPerDevice = kStreamsPerChunk * kStreamChunks;

struct StreamChunk {
  cudaStream_t handles[kStreamsPerChunk] = {};
};

// A pair (reference event, host steady_clock time at which it completed).
struct ClockReference {
  cudaEvent_t event = nullptr;
  int64_t host_ns = 0;
  bool valid = false;
};

// cudaEventElapsedTime returns float milliseconds, whose resolution coarsens with distance
// (0.5 us at 4 s), so references are renewed every second and several are kept: an event is
// measured from the nearest one.
constexpr int kClockReferences = 16;
constexpr int64_t kClockReferenceMaxAgeNs = 1'000'000'000;
constexpr int64_t kClockReferenceTightSpanNs = 10'000;
constexpr int kClockReferenceAttempts = 5;

struct DeviceState {
  // Streams. `stream_count` publishes entries; registration happens under `streams_mutex`.
  std::atomic<StreamId> stream_count{0};
  std::atomic<StreamChunk*> stream_chunks[kStreamChunks] = {};
  std::mutex streams_mutex;
  std::unordered_map<cudaStream_t, StreamId> ids_by_handle;  // non-default streams
  // Calibration of device event times against the host clock.
  std::mutex clock_mutex;
  cudaStream_t clock_stream = nullptr;  // idle, so a reference completes as soon as it is queued
  std::array<ClockReference, kClockReferences> clock_references;
  int newest_clock_reference = -1;
};

// ---- the runtime -----------------------------------------------------------------------------

class CudaRuntime final : public Runtime {
 public:
  CudaRuntime();
  ~CudaRuntime() override;

  BackingKind backing_kind() const noexcept override { return BackingKind::Cuda; }
  bool asynchronous() const noexcept override { return true; }
  const char* name() const noexcept override { return "cuda"; }
  int device_count() const noexcept override { return device_count_; }
  int backing_device_index(DeviceIndex device) const noexcept override { return device; }

  void set_current_device(DeviceIndex device) override;

  // ---- memory: none (see the top of this file); what the host runtime serves fails clearly ----

  void* allocate(DeviceIndex device, size_t nbytes) override;
  Released deallocate(void* ptr) noexcept override;
  void record_stream(void* ptr, DeviceIndex device, StreamId stream) override;
  void copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
            size_t nbytes) override;

  // ---- streams ----

  StreamId create_stream(DeviceIndex device, int priority) override;
  StreamId current_stream(DeviceIndex device) const override;
  void set_current_stream(DeviceIndex device, StreamId stream) override;
  bool query_stream(DeviceIndex device, StreamId stream) override;
  void synchronize_stream(DeviceIndex device, StreamId stream) override;
  void synchronize_device(DeviceIndex device) override;
  StreamId stream_from_native(DeviceIndex device, void* native) override;
  bool is_capturing(DeviceIndex device, StreamId stream) override;

  // ---- events ----

  Event* create_event(DeviceIndex device, bool enable_timing) override;
  void destroy_event(Event* base) noexcept override;
  void record_event(Event* base, DeviceIndex device, StreamId stream) override;
  bool query_event(Event* base) override;
  void synchronize_event(Event* base) override;
  void stream_wait_event(DeviceIndex device, StreamId stream, Event* base) override;
  double elapsed_ms(Event* start_base, Event* end_base) override;
  int64_t event_host_time_ns(Event* base) override;

 private:
  detail::ThreadState& state() const { return detail::thread_state(id_); }

  // The handle of a stream of a valid device; throws Error when the stream does not exist.
  cudaStream_t stream_handle(DeviceIndex device, StreamId stream) const;

  cudaStream_t current_stream_handle(DeviceIndex device) const;

  // Gives `handle` the next id of `device`. Caller holds streams_mutex.
  StreamId register_stream(DeviceIndex device, cudaStream_t handle);

  // Whether `handle` is in a stream capture (active or invalidated). Caller made the device
  // current: the legacy stream handle means the current device's.
  static bool capture_active(cudaStream_t handle, DeviceIndex device);

  // The streams of `device` brick knows (its registered ones, the legacy default stream
  // included) that are being captured into a CUDA graph now. Caller made the device current.
  std::vector<cudaStream_t> capturing_streams(DeviceIndex device) const;

  static void refuse_if_recorded_in_capture(const CudaEvent& event, const char* what);

  static void refuse_if_capturing(cudaStream_t handle, DeviceIndex device, StreamId stream,
                                  const char* verb);

  // Records a clock reference: an event on an idle stream, synchronized, stamped with the
  // midpoint of the host times around it (tried again when that span is wide, e.g. preempted).
  // Caller holds clock_mutex and made `device` current.
  void add_clock_reference(DeviceState& state, DeviceIndex device);

  // Nanoseconds from completed event `from` to completed event `to` (negative if `to` came
  // first). Caller made `device` current.
  static int64_t ns_between(cudaEvent_t from, cudaEvent_t to, DeviceIndex device);

  int device_count_ = 0;
  std::unique_ptr<DeviceState[]> devices_;
};

}  // namespace brick::runtime::cuda_detail
