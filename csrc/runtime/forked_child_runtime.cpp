// The runtime of a child process forked after a CUDA runtime was created: CUDA cannot be used
// after fork() (the parent's contexts do not exist in the child), so, as torch.cuda does, brick
// refuses every device call there with one clear error instead of failing somewhere inside CUDA.
#include <string>

#include "runtime/runtime.h"

namespace brick::runtime {

namespace {

class ForkedChildRuntime final : public Runtime {
 public:
  explicit ForkedChildRuntime(const Runtime& parent)
      : kind_(parent.backing_kind()), name_(parent.name()), count_(parent.device_count()) {
    for (int device = 0; device < count_; ++device) {
      backing_[device] = parent.backing_device_index(static_cast<DeviceIndex>(device));
    }
  }

  BackingKind backing_kind() const noexcept override { return kind_; }
  bool asynchronous() const noexcept override { return true; }
  const char* name() const noexcept override { return name_; }
  int device_count() const noexcept override { return count_; }
  int backing_device_index(DeviceIndex device) const noexcept override {
    return device >= 0 && device < count_ ? backing_[device] : -1;
  }

  void set_current_device(DeviceIndex) override { refuse("setting the current device"); }
  void* allocate(DeviceIndex, size_t) override { refuse("allocating memory"); }
  // Memory and events inherited from the parent belong to its CUDA contexts: nothing can free
  // them here, and a child's exit must not fail on them.
  Released deallocate(void*) noexcept override { return {0, -1}; }
  void record_stream(void*, DeviceIndex, StreamId) override { refuse("record_stream"); }
  void copy(void*, DeviceIndex, const void*, DeviceIndex, size_t) override { refuse("a copy"); }
  StreamId create_stream(DeviceIndex, int) override { refuse("creating a stream"); }
  StreamId current_stream(DeviceIndex) const override { refuse("running work"); }
  void set_current_stream(DeviceIndex, StreamId) override { refuse("setting a stream"); }
  bool query_stream(DeviceIndex, StreamId) override { refuse("querying a stream"); }
  void synchronize_stream(DeviceIndex, StreamId) override { refuse("synchronizing a stream"); }
  void synchronize_device(DeviceIndex) override { refuse("synchronizing a device"); }
  StreamId stream_from_native(DeviceIndex, void*) override { refuse("adopting a stream"); }
  bool is_capturing(DeviceIndex, StreamId) override { refuse("querying a stream"); }
  Event* create_event(DeviceIndex, bool) override { refuse("creating an event"); }
  void destroy_event(Event*) noexcept override {}
  void record_event(Event*, DeviceIndex, StreamId) override { refuse("recording an event"); }
  bool query_event(Event*) override { refuse("querying an event"); }
  void synchronize_event(Event*) override { refuse("synchronizing an event"); }
  void stream_wait_event(DeviceIndex, StreamId, Event*) override { refuse("waiting on an event"); }
  double elapsed_ms(Event*, Event*) override { refuse("timing events"); }
  int64_t event_host_time_ns(Event*) override { refuse("timing an event"); }

 private:
  [[noreturn]] void refuse(const char* what) const {
    throw Error(std::string("brick: ") + what +
                " on a brick device is not possible in a process "
                "forked after brick used its " +
                name_ + " runtime: " + name_ +
                " cannot be used after fork(), as with torch.cuda. Start child processes with "
                "the 'spawn' or 'forkserver' method (multiprocessing.set_start_method('spawn'), "
                "DataLoader(multiprocessing_context='spawn')), or use brick only after forking");
  }

  BackingKind kind_;
  const char* name_;
  int count_;
  int backing_[kMaxDevices] = {};
};

}  // namespace

std::unique_ptr<Runtime> make_forked_child_runtime(const Runtime& parent) {
  return std::make_unique<ForkedChildRuntime>(parent);
}

}  // namespace brick::runtime
