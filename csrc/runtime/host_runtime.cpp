// The host runtime: brick devices backed by host memory and the calling thread.
//
// Work runs synchronously on the thread that issues it, so an event stamps the host clock at
// the moment it is recorded and the time between two events is the execution time of what ran
// between them. Streams order nothing (everything is already ordered) but are real objects with
// ids, per-thread current streams and validation, so stream-aware code is exercised.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace brick::runtime {

struct Event {
  DeviceIndex device;
  bool timing;
  std::atomic<int64_t> recorded_ns{-1};
};

namespace {

constexpr size_t kAlignment = 64;  // matches PyTorch's CPU allocator
constexpr uint64_t kMagic = 0x6b63697262ULL;

// Stored in the 64 bytes in front of every allocation so a free needs no lookup table.
struct alignas(kAlignment) BlockHeader {
  uint64_t magic;
  uint64_t nbytes;
  int32_t device;
};
static_assert(sizeof(BlockHeader) == kAlignment);

int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ThreadState {
  uint64_t owner = 0;  // id of the runtime this state belongs to
  DeviceIndex device = 0;
  StreamId streams[kMaxDevices] = {};
};

// Per-thread state of every runtime the thread has used. Runtimes are told apart by a unique
// id, never by address: a new runtime at a dead one's address must not inherit its state.
struct ThreadStates {
  std::vector<std::unique_ptr<ThreadState>> all;
};

thread_local ThreadStates tls_states;
// The most recently used state: one compare on the hot path. initial-exec: a direct %fs access
// even inside a dlopen()ed module (8 bytes of static TLS).
[[gnu::tls_model("initial-exec")]] constinit thread_local ThreadState* tls_last = nullptr;
std::atomic<uint64_t> next_runtime_id{1};

class HostRuntime final : public Runtime {
 public:
  explicit HostRuntime(int device_count)
      : id_(next_runtime_id.fetch_add(1, std::memory_order_relaxed)), device_count_(device_count) {
    if (device_count < 1 || device_count > kMaxDevices) {
      throw Error("brick: a host runtime needs 1 to " + std::to_string(kMaxDevices) +
                  " devices, got " + std::to_string(device_count));
    }
    for (auto& n : stream_counts_) n.store(1);
  }

  BackingKind backing_kind() const noexcept override { return BackingKind::Host; }
  const char* name() const noexcept override { return "host"; }
  int device_count() const noexcept override { return device_count_; }
  int backing_device_index(DeviceIndex) const noexcept override { return -1; }

  DeviceIndex current_device() const noexcept override {
    try {
      return state().device;
    } catch (const std::bad_alloc&) {
      return 0;  // no memory for this thread's first state: it has never left device 0
    }
  }

  void set_current_device(DeviceIndex device) override {
    check_device(device);
    state().device = device;
  }

  void* allocate(DeviceIndex device, size_t nbytes) override {
    check_device(device);
    if (nbytes == 0) return nullptr;
    const size_t total = kAlignment + ((nbytes + kAlignment - 1) / kAlignment) * kAlignment;
    void* block = std::aligned_alloc(kAlignment, total);
    if (block == nullptr) {
      throw Error("brick: out of memory on brick:" + std::to_string(device) +
                  " (host runtime) while allocating " + std::to_string(nbytes) + " bytes");
    }
    auto* header = static_cast<BlockHeader*>(block);
    header->magic = kMagic;
    header->nbytes = nbytes;
    header->device = device;
    tracker(device).on_alloc(static_cast<int64_t>(nbytes));
    return header + 1;
  }

  Released deallocate(void* ptr) noexcept override {
    if (ptr == nullptr) return {0, -1};
    auto* header = static_cast<BlockHeader*>(ptr) - 1;
    if (header->magic != kMagic) std::abort();  // not ours, or freed twice: never continue
    header->magic = 0;
    const Released released{header->nbytes, header->device};
    tracker(released.device).on_free(static_cast<int64_t>(released.nbytes));
    std::free(header);
    return released;
  }

  void copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
            size_t nbytes) override {
    if (dst_device >= 0) check_device(dst_device);
    if (src_device >= 0) check_device(src_device);
    if (nbytes != 0) std::memmove(dst, src, nbytes);
  }

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
    return true;  // work completes before the call that issued it returns
  }

  void synchronize_stream(DeviceIndex device, StreamId stream) override {
    check_stream(device, stream);
  }

  void synchronize_device(DeviceIndex device) override { check_device(device); }

  Event* create_event(DeviceIndex device, bool enable_timing) override {
    check_device(device);
    auto* event = new Event;
    event->device = device;
    event->timing = enable_timing;
    return event;
  }

  void destroy_event(Event* event) noexcept override { delete event; }

  void record_event(Event* event, DeviceIndex device, StreamId stream) override {
    check_stream(device, stream);
    if (event->device != device) {
      throw Error("brick: event was created on brick:" + std::to_string(event->device) +
                  " but is being recorded on a stream of brick:" + std::to_string(device));
    }
    event->recorded_ns.store(now_ns(), std::memory_order_release);
  }

  bool query_event(Event* /*event*/) override { return true; }

  void synchronize_event(Event* /*event*/) override {}

  void stream_wait_event(DeviceIndex device, StreamId stream, Event* /*event*/) override {
    check_stream(device, stream);
  }

  double elapsed_ms(Event* start, Event* end) override {
    if (!start->timing || !end->timing) {
      throw Error("brick: elapsed time needs both events created with enable_timing=True");
    }
    const int64_t t0 = start->recorded_ns.load(std::memory_order_acquire);
    const int64_t t1 = end->recorded_ns.load(std::memory_order_acquire);
    if (t0 < 0 || t1 < 0) {
      throw Error("brick: elapsed time needs both events to be recorded first");
    }
    return static_cast<double>(t1 - t0) / 1e6;
  }

  DeviceIndex event_device(const Event* event) const noexcept override { return event->device; }

  int64_t event_host_time_ns(Event* event) override {
    return event->recorded_ns.load(std::memory_order_acquire);
  }

 private:
  ThreadState& state() const {
    ThreadState* last = tls_last;
    if (last != nullptr && last->owner == id_) [[likely]]
      return *last;
    for (auto& state : tls_states.all) {
      if (state->owner == id_) return *(tls_last = state.get());
    }
    tls_states.all.push_back(std::make_unique<ThreadState>());
    tls_states.all.back()->owner = id_;
    return *(tls_last = tls_states.all.back().get());
  }

  void check_stream(DeviceIndex device, StreamId stream) const {
    check_device(device);
    const StreamId count = stream_counts_[device].load(std::memory_order_relaxed);
    if (stream < 0 || stream >= count) {
      throw Error("brick: stream " + std::to_string(stream) + " does not exist on brick:" +
                  std::to_string(device) + " (" + std::to_string(count) + " stream(s) created)");
    }
  }

  const uint64_t id_;
  const int device_count_;
  mutable std::atomic<StreamId> stream_counts_[kMaxDevices];
};

}  // namespace

std::unique_ptr<Runtime> make_host_runtime(int device_count) {
  return std::make_unique<HostRuntime>(device_count);
}

}  // namespace brick::runtime
