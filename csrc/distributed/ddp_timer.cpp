// DDP's runtime statistics for brick modules: PyTorch's Reducer asks c10d's TimerRegistry for a
// timer of its parameters' device type and, finding none for PrivateUse1, warns ("Time stats
// are currently only collected for CPU and CUDA devices") and times the host instead. Brick
// registers one that times as CUDA's does: an event recorded on the device's current stream at
// each point of the iteration (forward start, backward compute start and end, first and last
// collective), read when DDP's logger asks (at the next forward, when the previous iteration's
// work is done), so forward/backward/communication times are the device's.
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <array>
#include <cstdint>
#include <optional>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

namespace brick::distributed {
namespace {

class BrickTimer final : public c10d::Timer {
 public:
  explicit BrickTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event);  // the host's timestamp, which DDP's logger also reads
    c10::impl::VirtualGuardImpl guard(device_.type());
    const c10::Stream stream = guard.getStream(device_);
    std::optional<c10::Event>& slot = events_[static_cast<size_t>(event)];
    if (!slot) slot.emplace(device_.type(), c10::EventFlag::BACKEND_DEFAULT);  // timing on
    slot->record(stream);
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    std::optional<c10::Event>& first = events_[static_cast<size_t>(start)];
    std::optional<c10::Event>& last = events_[static_cast<size_t>(end)];
    // Not recorded (no backward, or no collective in no_sync()): nothing to measure.
    if (!first || !last || !first->was_marked_for_recording() ||
        !last->was_marked_for_recording()) {
      return std::nullopt;
    }
    first->synchronize();
    last->synchronize();
    const double ms = first->elapsedTime(*last);
    // An end left from an earlier iteration than its start: no valid figure this iteration.
    if (ms < 0) return std::nullopt;
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  c10::Device device_;
  std::array<std::optional<c10::Event>, 5> events_;
};

}  // namespace
}  // namespace brick::distributed

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, brick::distributed::BrickTimer)
}  // namespace c10d
