// GoogleTest suite for the host runtime's work tracer (runtime/work_tracer.h): launches seen
// through the launch hooks become work on the steady clock, each piece named by the innermost
// interval pushed while it ran; records outlive their thread. The launches here are the hooks'
// calls as brick's launch path makes them (backend/launch.h), without torch.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>

#include "runtime/launch_observer.h"
#include "runtime/work_tracer.h"

namespace brick::runtime {
namespace {

// A launch as LaunchScope makes it: queued, run for `work`, done.
void launch(std::chrono::microseconds work = std::chrono::microseconds(0)) {
  const LaunchTrace* trace = launch_hooks().trace;
  ASSERT_NE(trace, nullptr);
  trace->queued();
  if (work.count() > 0) std::this_thread::sleep_for(work);
  trace->done();
}

class HostWorkTracerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tracer_ = make_host_work_tracer();
    tracer_->start();
    TracedRecords stale;
    tracer_->drain(&stale);  // an earlier test's leftovers
  }
  void TearDown() override { tracer_->stop(); }

  // Per interval (0: none): the pieces of work, and their summed ns.
  std::map<uint64_t, std::pair<int, int64_t>> drain() {
    TracedRecords records;
    tracer_->drain(&records);
    EXPECT_EQ(records.dropped, 0u);
    std::map<uint32_t, uint64_t> interval_of;
    for (const TracedCall& call : records.calls) interval_of[call.call] = call.interval;
    std::map<uint64_t, std::pair<int, int64_t>> out;
    for (const TracedWork& work : records.work) {
      EXPECT_LE(work.start_ns, work.end_ns);
      const auto found = interval_of.find(work.call);
      auto& entry = out[found == interval_of.end() ? 0 : found->second];
      ++entry.first;
      entry.second += work.end_ns - work.start_ns;
    }
    return out;
  }

  std::unique_ptr<WorkTracer> tracer_;
};

TEST_F(HostWorkTracerTest, ALaunchIsWorkOfTheInnermostIntervalForItsWholeDuration) {
  tracer_->push(1);
  tracer_->push(2);
  launch(std::chrono::microseconds(2000));
  tracer_->pop();
  launch();
  tracer_->pop();
  launch();  // outside every interval: work with no call naming one
  EXPECT_EQ(tracer_->launches(), 3u);
  const auto by_interval = drain();
  ASSERT_EQ(by_interval.count(2), 1u);
  EXPECT_EQ(by_interval.at(2).first, 1);
  EXPECT_GE(by_interval.at(2).second, 2'000'000);
  EXPECT_EQ(by_interval.at(1).first, 1);
  EXPECT_EQ(by_interval.at(0).first, 1);
  EXPECT_TRUE(drain().empty()) << "drained once";
}

TEST_F(HostWorkTracerTest, ABrickOpeningInsideALaunchSplitsItsWorkAtThatPoint) {
  // aten::relu's launch runs the backing device's aten::clamp_min, itself a brick.
  tracer_->push(10);
  const LaunchTrace* trace = launch_hooks().trace;
  trace->queued();
  std::this_thread::sleep_for(std::chrono::microseconds(500));
  tracer_->push(11);
  std::this_thread::sleep_for(std::chrono::microseconds(1500));
  tracer_->pop();
  trace->done();
  tracer_->pop();
  const auto by_interval = drain();
  EXPECT_EQ(by_interval.at(11).first, 1);
  EXPECT_GE(by_interval.at(11).second, 1'500'000);
  EXPECT_EQ(by_interval.at(10).first, 2) << "before and after the nested brick";
  EXPECT_GE(by_interval.at(10).second, 500'000);
}

TEST_F(HostWorkTracerTest, ReplacingTheIntervalInsideALaunchSplitsItWithNoPieceOutsideBoth) {
  tracer_->push(30);
  const LaunchTrace* trace = launch_hooks().trace;
  trace->queued();
  std::this_thread::sleep_for(std::chrono::microseconds(300));
  tracer_->replace(31);
  std::this_thread::sleep_for(std::chrono::microseconds(300));
  trace->done();
  tracer_->pop();
  const auto by_interval = drain();
  EXPECT_EQ(by_interval.size(), 2u) << "no piece of the launch belongs to no interval";
  EXPECT_EQ(by_interval.at(30).first, 1);
  EXPECT_GE(by_interval.at(30).second, 300'000);
  EXPECT_EQ(by_interval.at(31).first, 1);
  EXPECT_GE(by_interval.at(31).second, 300'000);
}

TEST_F(HostWorkTracerTest, ALaunchInsideALaunchContinuesItAndTheOutermostEndsIt) {
  tracer_->push(20);
  const LaunchTrace* trace = launch_hooks().trace;
  trace->queued();
  launch(std::chrono::microseconds(300));
  std::this_thread::sleep_for(std::chrono::microseconds(300));
  trace->done();
  trace->done();  // unbalanced: ignored
  tracer_->pop();
  const auto by_interval = drain();
  EXPECT_EQ(by_interval.size(), 1u);
  EXPECT_EQ(by_interval.at(20).first, 3);
  EXPECT_GE(by_interval.at(20).second, 600'000);
}

TEST_F(HostWorkTracerTest, AThreadsRecordsOutliveItAndItsIntervalsAreItsOwn) {
  tracer_->push(30);
  std::thread other([] {
    launch();  // the other thread has pushed nothing
  });
  other.join();
  launch();
  tracer_->pop();
  const auto by_interval = drain();
  EXPECT_EQ(by_interval.at(30).first, 1);
  EXPECT_EQ(by_interval.at(0).first, 1) << "the exited thread's launch, outside any interval";
}

TEST_F(HostWorkTracerTest, StoppedItSeesNoLaunchAndRemovesItsHook) {
  tracer_->stop();
  EXPECT_EQ(launch_hooks().trace, nullptr);
  tracer_->start();
  EXPECT_NE(launch_hooks().trace, nullptr);
  const LaunchTrace* trace = launch_hooks().trace;
  tracer_->stop();
  trace->queued();  // a launch that read the table before the stop
  trace->done();
  EXPECT_TRUE(drain().empty());
  tracer_->start();
}

}  // namespace
}  // namespace brick::runtime
