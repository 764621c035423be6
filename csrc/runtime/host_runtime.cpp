// The host runtime: brick devices backed by host memory and the calling thread.
//
// Work runs synchronously on the thread that issues it, so an event stamps the host clock at
// the moment it is recorded and the time between two events is the execution time of what ran
// between them. Streams order nothing (everything is already ordered) but are real objects with
// ids, per-thread current streams and validation, so stream-aware code is exercised.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "common/hot_path.h"
#include "common/steady_clock.h"
#include "runtime/runtime.h"
#include "runtime/thread_state.h"

namespace brick::runtime {
namespace {

struct HostEvent final : Event {
  DeviceIndex device = 0;
  bool timing = false;
  std::atomic<int64_t> recorded_ns{-1};
};

HostEvent* as_host(Event* event) noexcept { return static_cast<HostEvent*>(event); }

constexpr size_t kAlignment = 64;  // matches PyTorch's CPU allocator
constexpr uint64_t kMagic = 0x6b63697262ULL;

// Stored in the 64 bytes in front of every allocation so a free needs no lookup table.
struct alignas(kAlignment) BlockHeader {
  uint64_t magic;
  uint64_t nbytes;
  void* block;  // what malloc returned
  int32_t device;
};
static_assert(sizeof(BlockHeader) == kAlignment);

class HostRuntime final : public Runtime {
 public:
  HostRuntime(int device_count, HostCompletion completion)
      : device_count_(device_count), deferred_(completion == HostCompletion::Deferred) {
    if (device_count < 1 || device_count > kMaxDevices) {
      throw Error("brick: a host runtime needs 1 to " + std::to_string(kMaxDevices) +
                  " devices, got " + std::to_string(device_count));
    }
    for (auto& n : stream_counts_) n.store(1);
    for (auto& at : last_recorded_ns_) at.store(-1);
  }

  BackingKind backing_kind() const noexcept override { return BackingKind::Host; }
  bool asynchronous() const noexcept override { return deferred_; }
  const char* name() const noexcept override { return "host"; }
  int device_count() const noexcept override { return device_count_; }
  int backing_device_index(DeviceIndex) const noexcept override { return -1; }

  BRICK_HOT_PATH void set_current_device(DeviceIndex device) override {
    check_device(device);
    state().device = device;
  }

  BRICK_HOT_PATH void* allocate(DeviceIndex device, size_t nbytes) override {
    check_device(device);
    if (nbytes == 0) return nullptr;
    // malloc, aligned here, rather than aligned_alloc: glibc serves small malloc requests from
    // its per-thread cache, while every aligned allocation carves an aligned chunk out of a
    // larger one (about 400 instructions more per op result).
    constexpr size_t kMallocAlignment = alignof(std::max_align_t);
    const size_t total = kAlignment + ((nbytes + kAlignment - 1) / kAlignment) * kAlignment +
                         (kAlignment - kMallocAlignment);
    void* block = std::malloc(total);
    if (block == nullptr) {
      throw Error("brick: out of memory on brick:" + std::to_string(device) +
                  " (host runtime) while allocating " + std::to_string(nbytes) + " bytes");
    }
    const auto address = reinterpret_cast<uintptr_t>(block);
    auto* header =
        reinterpret_cast<BlockHeader*>((address + kAlignment - 1) & ~uintptr_t{kAlignment - 1});
    header->block = block;
    header->magic = kMagic;
    header->nbytes = nbytes;
    header->device = device;
    tracker(device).on_alloc(static_cast<int64_t>(nbytes));
    return header + 1;
  }

  BRICK_HOT_PATH Released deallocate(void* ptr) noexcept override {
    if (ptr == nullptr) return {0, -1};
    auto* header = static_cast<BlockHeader*>(ptr) - 1;
    if (header->magic != kMagic) std::abort();  // not ours, or freed twice: never continue
    header->magic = 0;
    const Released released{header->nbytes, header->device};
    tracker(released.device).on_free(static_cast<int64_t>(released.nbytes));
    std::free(header->block);
    return released;
  }

  void copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
            size_t nbytes) override {
    check_copy(dst, dst_device, src, src_device, nbytes);
    if (nbytes != 0) std::memcpy(dst, src, nbytes);
  }

  void record_stream(void* /*ptr*/, DeviceIndex device, StreamId stream) override {
    check_stream(device, stream);  // every op completes before it returns: nothing to wait for
  }

  // Priorities order nothing here: work runs on the calling thread.
  StreamId create_stream(DeviceIndex device, int /*priority*/) override {
    check_device(device);
    return stream_counts_[device].fetch_add(1, std::memory_order_relaxed);
  }

  StreamId current_stream(DeviceIndex device) const override {
    check_device(device);
    return state().streams[device];
  }

  void set_current_stream(DeviceIndex device, StreamId stream) override {
    check_stream(device, stream);
    state().streams[device] = stream;
  }

  bool query_stream(DeviceIndex device, StreamId stream) override {
    check_stream(device, stream);
    // Work completes before the call that issued it returns (deferred: its events later).
    return !deferred_ || steady_ns() >= completes_at(last_recorded_ns_[device]);
  }

  void synchronize_stream(DeviceIndex device, StreamId stream) override {
    check_stream(device, stream);
    if (deferred_) wait_until(completes_at(last_recorded_ns_[device]));
  }

  void synchronize_device(DeviceIndex device) override {
    check_device(device);
    if (deferred_) wait_until(completes_at(last_recorded_ns_[device]));
  }

  StreamId stream_from_native(DeviceIndex device, void* /*handle*/) override {
    check_device(device);
    throw Error(
        "brick: stream_from_native is not supported by the host runtime: its streams have no "
        "native handles");
  }

  bool is_capturing(DeviceIndex device, StreamId stream) override {
    check_stream(device, stream);
    return false;
  }

  Event* create_event(DeviceIndex device, bool enable_timing) override {
    check_device(device);
    auto* event = new HostEvent;
    event->device = device;
    event->timing = enable_timing;
    return event;
  }

  void destroy_event(Event* event) noexcept override { delete as_host(event); }

  void record_event(Event* base, DeviceIndex device, StreamId stream) override {
    HostEvent* event = as_host(base);
    check_stream(device, stream);
    if (event->device != device) {
      throw Error("brick: event was created on brick:" + std::to_string(event->device) +
                  " but is being recorded on a stream of brick:" + std::to_string(device));
    }
    const int64_t now = steady_ns();
    event->recorded_ns.store(now, std::memory_order_release);
    if (deferred_) last_recorded_ns_[device].store(now, std::memory_order_relaxed);
  }

  bool query_event(Event* event) override {
    if (!deferred_) return true;
    const int64_t recorded = as_host(event)->recorded_ns.load(std::memory_order_acquire);
    return recorded < 0 || steady_ns() >= recorded + kDeferredCompletionNs;  // never recorded: done
  }

  void synchronize_event(Event* event) override {
    if (!deferred_) return;
    const int64_t recorded = as_host(event)->recorded_ns.load(std::memory_order_acquire);
    if (recorded >= 0) wait_until(recorded + kDeferredCompletionNs);
  }

  void stream_wait_event(DeviceIndex device, StreamId stream, Event* /*event*/) override {
    check_stream(device, stream);
  }

  double elapsed_ms(Event* start_base, Event* end_base) override {
    const HostEvent* start = as_host(start_base);
    const HostEvent* end = as_host(end_base);
    if (!start->timing || !end->timing) {
      throw Error("brick: elapsed time needs both events created with enable_timing=True");
    }
    const int64_t t0 = start->recorded_ns.load(std::memory_order_acquire);
    const int64_t t1 = end->recorded_ns.load(std::memory_order_acquire);
    if (t0 < 0 || t1 < 0) {
      throw Error("brick: elapsed time needs both events to be recorded first");
    }
    if (start->device != end->device) {  // their clocks need not agree on a real device
      throw Error("brick: elapsed time needs both events on the same device, got brick:" +
                  std::to_string(start->device) + " and brick:" + std::to_string(end->device));
    }
    if (deferred_ && steady_ns() < std::max(t0, t1) + kDeferredCompletionNs) {
      throw Error("brick: elapsed time needs both events to have completed (synchronize first)");
    }
    return static_cast<double>(t1 - t0) / 1e6;
  }

  int64_t event_host_time_ns(Event* event) override {
    const int64_t recorded = as_host(event)->recorded_ns.load(std::memory_order_acquire);
    if (deferred_ && recorded >= 0 && steady_ns() < recorded + kDeferredCompletionNs) return -1;
    return recorded;
  }

 private:
  detail::ThreadState& state() const { return detail::thread_state(id_); }

  void check_stream(DeviceIndex device, StreamId stream) const {
    check_device(device);
    const StreamId count = stream_counts_[device].load(std::memory_order_relaxed);
    if (stream < 0 || stream >= count) {
      throw Error("brick: stream " + std::to_string(stream) + " does not exist on brick:" +
                  std::to_string(device) + " (" + std::to_string(count) + " stream(s) created)");
    }
  }

  static int64_t completes_at(const std::atomic<int64_t>& recorded) noexcept {
    const int64_t at = recorded.load(std::memory_order_relaxed);
    return at < 0 ? 0 : at + kDeferredCompletionNs;
  }

  static void wait_until(int64_t deadline_ns) noexcept {
    while (steady_ns() < deadline_ns) {
    }
  }

  const int device_count_;
  const bool deferred_;
  // Deferred completion: when each device last had an event recorded (what a sync waits for).
  std::atomic<int64_t> last_recorded_ns_[kMaxDevices];
  mutable std::atomic<StreamId> stream_counts_[kMaxDevices];
};

}  // namespace

std::unique_ptr<Runtime> make_host_runtime(int device_count, HostCompletion completion) {
  return std::make_unique<HostRuntime>(device_count, completion);
}

}  // namespace brick::runtime
