#include "profiler/traced_work.h"

#include <algorithm>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace brick::profiler {

TracedWork& TracedWork::instance() {
  static TracedWork* const kept = new TracedWork();  // marks on other threads may outlive exit
  return *kept;
}

runtime::WorkTracer* TracedWork::tracer_for(const runtime::Runtime& rt, std::string* why) {
  if (rt.backing_kind() == runtime::BackingKind::Host) {
    static runtime::WorkTracer* const host = runtime::make_host_work_tracer().release();
    return host;
  }
  static std::string cupti_why;
  static runtime::WorkTracer* const cupti = runtime::make_cupti_tracer(&cupti_why).release();
  if (cupti == nullptr && why != nullptr) *why = cupti_why;
  return cupti;
}

void TracedWork::acquire(TracedClient client, runtime::Runtime& rt) {
  const auto bit = static_cast<uint8_t>(1u << static_cast<unsigned>(client));
  if ((clients_ & bit) != 0) return;
  if (clients_ == 0) {
    std::string why;
    runtime::WorkTracer* tracer = tracer_for(rt, &why);
    if (tracer == nullptr) throw runtime::Error(why);
    if (started_ != nullptr) drain_into_correlators();  // an earlier tracing's last records
    delivered_ = false;
    tracer->start();
    started_ = tracer;
    tracer_.store(tracer, std::memory_order_release);
  }
  clients_ |= bit;
}

void TracedWork::release(TracedClient client, bool keep_kinds) noexcept {
  const auto bit = static_cast<uint8_t>(1u << static_cast<unsigned>(client));
  if ((clients_ & bit) == 0) return;
  clients_ &= static_cast<uint8_t>(~bit);
  if (clients_ != 0) return;
  tracer_.store(nullptr, std::memory_order_release);
  if (!keep_kinds) started_->stop();
}

bool TracedWork::holds(TracedClient client) const noexcept {
  return (clients_ & (1u << static_cast<unsigned>(client))) != 0;
}

void TracedWork::attach(WorkCorrelator* correlator) {
  if (std::find(attached_.begin(), attached_.end(), correlator) == attached_.end()) {
    attached_.push_back(correlator);
  }
}

void TracedWork::detach(WorkCorrelator* correlator) noexcept { std::erase(attached_, correlator); }

void TracedWork::drain_into_correlators() {
  runtime::TracedRecords records;
  started_->drain(&records);
  if (!records.work.empty()) delivered_ = true;
  // (Records no correlator reads are dropped: no profile asks about them.)
  for (size_t i = 0; i < attached_.size(); ++i) {
    if (i + 1 == attached_.size()) {
      attached_[i]->add(records);
    } else {
      runtime::TracedRecords copy = records;
      attached_[i]->add(copy);
    }
  }
}

bool TracedWork::settle(runtime::Runtime& rt) {
  if (started_ == nullptr) return true;
  const uint64_t devices = devices_.load(std::memory_order_relaxed);
  for (int device = 0; device < runtime::kMaxDevices; ++device) {
    if ((devices >> device & 1) != 0) rt.synchronize_device(device);
  }
  drain_into_correlators();
  return delivered_ || started_->launches() == 0;
}

void TracedWork::after_fork_in_child() noexcept {
  new (&mutex_) std::mutex();
  // A resolution under way in another thread at the fork may have left the correlators
  // mid-change: left behind. The legacy profiler's profile is the parent's (the registry's goes
  // on in the child).
  new (&correlator_) WorkCorrelator();
  (void)new std::vector<WorkCorrelator*>(std::move(attached_));
  attached_.clear();
  devices_.store(0, std::memory_order_relaxed);
  clients_ &= static_cast<uint8_t>(~(1u << static_cast<unsigned>(TracedClient::LegacyStubs)));
  if (holds(TracedClient::Registry)) {
    try {
      attached_.push_back(&correlator_);
    } catch (...) {  // out of memory: the child's traced bricks get no work
    }
  }
  if (clients_ == 0 && tracer_.load(std::memory_order_relaxed) != nullptr) {
    tracer_.store(nullptr, std::memory_order_relaxed);
    started_->stop();
  }
}

}  // namespace brick::profiler
