// The brick runtime: devices, streams, events and memory behind one small interface.
//
// Plain C++ with no torch dependency. The backend layer talks only to `Runtime`, so a CUDA
// implementation can slot in beside the host one without the backend changing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace brick::runtime {

using DeviceIndex = int;
using StreamId = int64_t;

// Upper bound on brick devices in one process (PyTorch's DeviceIndex is int8).
constexpr int kMaxDevices = 64;
constexpr StreamId kDefaultStream = 0;

// What actually executes a brick device's work.
enum class BackingKind { Host, Cuda };

// Every runtime failure is reported as this, with a message naming the device and the problem.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MemoryStats {
  int64_t allocated_bytes = 0;       // live bytes, including adopted ones
  int64_t peak_allocated_bytes = 0;  // high-water mark since the last reset
  int64_t allocations = 0;           // live allocations
  int64_t peak_allocations = 0;
  int64_t total_allocations = 0;  // allocations ever made (monotonic)
  int64_t total_frees = 0;
  int64_t allocated_bytes_total = 0;  // bytes ever allocated (monotonic)
  int64_t freed_bytes_total = 0;
  int64_t adopted_bytes = 0;  // live bytes allocated by the backing device and adopted by brick
};

// Lock-free per-device memory accounting shared by every runtime implementation.
class MemoryTracker {
 public:
  void on_alloc(int64_t nbytes) noexcept;
  void on_free(int64_t nbytes) noexcept;
  void on_adopt(int64_t nbytes) noexcept;
  void on_release_adopted(int64_t nbytes) noexcept;
  MemoryStats snapshot() const noexcept;
  void reset_peak() noexcept;

 private:
  void bump_peaks() noexcept;
  std::atomic<int64_t> allocated_bytes_{0};
  std::atomic<int64_t> peak_allocated_bytes_{0};
  std::atomic<int64_t> allocations_{0};
  std::atomic<int64_t> peak_allocations_{0};
  std::atomic<int64_t> total_allocations_{0};
  std::atomic<int64_t> total_frees_{0};
  std::atomic<int64_t> allocated_bytes_total_{0};
  std::atomic<int64_t> freed_bytes_total_{0};
  std::atomic<int64_t> adopted_bytes_{0};
};

// Opaque event owned by a runtime.
struct Event;

class Runtime {
 public:
  virtual ~Runtime() = default;

  virtual BackingKind backing_kind() const noexcept = 0;
  virtual const char* name() const noexcept = 0;
  virtual int device_count() const noexcept = 0;
  // Index of the backing device that runs brick device `device` (-1 for the host).
  virtual int backing_device_index(DeviceIndex device) const noexcept = 0;

  // Current device of the calling thread.
  virtual DeviceIndex current_device() const noexcept = 0;
  virtual void set_current_device(DeviceIndex device) = 0;

  // Memory. `allocate(device, 0)` returns nullptr. `deallocate` takes any pointer returned by
  // `allocate` (from any thread) and says what it released.
  struct Released {
    size_t nbytes;
    DeviceIndex device;
  };
  virtual void* allocate(DeviceIndex device, size_t nbytes) = 0;
  virtual Released deallocate(void* ptr) noexcept = 0;
  // Copies bytes between brick memory and host memory (device -1 means plain host memory),
  // ordered on the current stream of the device involved.
  virtual void copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
                    size_t nbytes) = 0;

  // Streams. Stream 0 is each device's default stream; the current stream is per thread.
  virtual StreamId create_stream(DeviceIndex device, int priority) = 0;
  virtual StreamId current_stream(DeviceIndex device) const = 0;
  virtual void set_current_stream(DeviceIndex device, StreamId stream) = 0;
  virtual bool query_stream(DeviceIndex device, StreamId stream) = 0;
  virtual void synchronize_stream(DeviceIndex device, StreamId stream) = 0;
  virtual void synchronize_device(DeviceIndex device) = 0;

  // Events.
  virtual Event* create_event(DeviceIndex device, bool enable_timing) = 0;
  virtual void destroy_event(Event* event) noexcept = 0;
  virtual void record_event(Event* event, DeviceIndex device, StreamId stream) = 0;
  virtual bool query_event(Event* event) = 0;
  virtual void synchronize_event(Event* event) = 0;
  virtual void stream_wait_event(DeviceIndex device, StreamId stream, Event* event) = 0;
  // Milliseconds from `start` to `end`; both must be timing events that were recorded.
  virtual double elapsed_ms(Event* start, Event* end) = 0;
  virtual DeviceIndex event_device(const Event* event) const noexcept = 0;
  // When a recorded timing event completed, in steady_clock nanoseconds of the host (so device
  // timelines can be placed beside CPU ones); -1 if it was not recorded or has not completed.
  virtual int64_t event_host_time_ns(Event* event) = 0;

  // Memory statistics (allocations made through `allocate` plus adopted bytes).
  MemoryStats memory_stats(DeviceIndex device) const;
  void reset_peak_memory_stats(DeviceIndex device);
  // Bytes the backing device allocated that brick took over (zero-copy op results).
  void record_adopted(DeviceIndex device, size_t nbytes) noexcept;
  void release_adopted(DeviceIndex device, size_t nbytes) noexcept;

  // Throws Error naming the device and the valid range when `device` is not a brick device.
  void check_device(DeviceIndex device) const;

 protected:
  MemoryTracker& tracker(DeviceIndex device) noexcept { return trackers_[device]; }

 private:
  MemoryTracker trackers_[kMaxDevices];
};

// The process-wide runtime, created on first use. Which implementation is chosen by the
// BRICK_RUNTIME environment variable (`host`, or `auto`, the default).
Runtime& get();

// Number of virtual host devices: BRICK_HOST_DEVICES (1..kMaxDevices, default 2).
int host_device_count_from_env();

std::unique_ptr<Runtime> make_host_runtime(int device_count);

const char* backing_kind_name(BackingKind kind) noexcept;

}  // namespace brick::runtime
