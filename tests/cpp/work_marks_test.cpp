// GoogleTest suite for threads' work marks (runtime/work_marks.h) on a tracer that logs its
// pushes and pops: which marks start a segment, when a segment is pushed, and that nothing stays
// pushed after a thread's last mark.
#include "runtime/work_marks.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "runtime/launch_observer.h"

namespace brick::runtime {
namespace {

class LoggingTracer final : public WorkTracer {
 public:
  const char* name() const noexcept override { return "log"; }
  void start() override {}
  void stop() noexcept override {}
  void push(uint64_t interval) noexcept override {
    log.push_back("push " + std::to_string(interval));
  }
  void pop() noexcept override { log.push_back("pop"); }
  void replace(uint64_t interval) noexcept override {
    log.push_back("replace " + std::to_string(interval));
  }
  void drain(TracedRecords* /*into*/) override {}
  uint64_t launches() const noexcept override { return 0; }
  std::vector<std::string> log;
};

std::string pushed(const WorkMark& mark) {
  return "push " + std::to_string(segment_interval(mark.thread, mark.segment));
}

// A launch as LaunchScope makes it while a tracer traces: counted, its segment pushed, queued,
// done, popped.
void launch() {
  count_device_work();
  ++detail::tls_traced_launches;
  push_segment_for_launch();
  --detail::tls_traced_launches;
  segment_launch_done();
}

// Each test on a fresh thread: its marks start from nothing.
template <typename Body>
void on_new_thread(Body&& body) {
  std::thread thread(body);
  thread.join();
}

TEST(WorkMarks, MarksWithNoWorkBetweenShareASegmentAndCostTheTracerNothing) {
  on_new_thread([] {
    LoggingTracer tracer;
    const WorkMark first = mark_work(tracer);
    ASSERT_NE(first.thread, 0u);
    const WorkMark second = mark_work(tracer);
    EXPECT_EQ(second.segment, first.segment);
    EXPECT_TRUE(tracer.log.empty()) << "nothing pushed for marks around views and CPU ops";
  });
}

TEST(WorkMarks, ALaunchPushesItsSegmentWhileItRunsAndTheNextMarkStartsAnother) {
  on_new_thread([] {
    LoggingTracer tracer;
    const WorkMark open = mark_work(tracer);
    launch();
    launch();  // the same segment again
    const std::vector<std::string> expected = {pushed(open), "pop", pushed(open), "pop"};
    ASSERT_EQ(tracer.log, expected) << "nothing of brick's stays pushed outside a launch";
    const WorkMark close = mark_work(tracer);
    EXPECT_EQ(close.segment, open.segment + 1);
    EXPECT_EQ(mark_work(tracer).segment, close.segment);
    EXPECT_EQ(tracer.log.size(), 4u) << "marks outside launches call the tracer for nothing";
  });
}

TEST(WorkMarks, InsideALaunchEachMarkPushesItsSegmentAtOnceAndTheOneAfterTheLaunchEndsIt) {
  // aten::relu's launch runs the backing device's aten::clamp_min, a brick of its own, and may
  // go on queueing work after it: no later launch announces that work.
  on_new_thread([] {
    LoggingTracer tracer;
    const WorkMark relu_open = mark_work(tracer);
    count_device_work();
    ++detail::tls_traced_launches;
    push_segment_for_launch();
    const WorkMark clamp_open = mark_work(tracer);
    const WorkMark clamp_close = mark_work(tracer);
    --detail::tls_traced_launches;
    segment_launch_done();
    const WorkMark relu_close = mark_work(tracer);
    EXPECT_EQ(clamp_open.segment, relu_open.segment + 1);
    EXPECT_EQ(clamp_close.segment, clamp_open.segment + 1);
    EXPECT_EQ(relu_close.segment, clamp_close.segment + 1)
        << "the launch's work after the nested brick is in the segment it ended in";
    const std::vector<std::string> expected = {pushed(relu_open),
                                               "replace " + pushed(clamp_open).substr(5),
                                               "replace " + pushed(clamp_close).substr(5), "pop"};
    EXPECT_EQ(tracer.log, expected);
  });
}

TEST(WorkMarks, InCompiledCodeEachMarkPushesItsSegmentAtOnce) {
  // Inductor's kernels reach the device without brick's launch path.
  on_new_thread([] {
    LoggingTracer tracer;
    enter_compiled_code();
    const WorkMark open = mark_work(tracer);
    const WorkMark close = mark_work(tracer);
    exit_compiled_code();
    EXPECT_EQ(close.segment, open.segment + 1);
    const std::vector<std::string> expected = {pushed(open), "replace " + pushed(close).substr(5)};
    EXPECT_EQ(tracer.log, expected);
    (void)mark_work(tracer);  // outside the compiled code: its segment popped
    EXPECT_EQ(tracer.log.back(), "pop");
  });
}

TEST(WorkMarks, ThreadsHaveTheirOwnNumbers) {
  uint32_t numbers[2] = {0, 0};
  on_new_thread([&] {
    LoggingTracer tracer;
    numbers[0] = mark_work(tracer).thread;
  });
  on_new_thread([&] {
    LoggingTracer tracer;
    numbers[1] = mark_work(tracer).thread;
  });
  EXPECT_NE(numbers[0], 0u);
  EXPECT_NE(numbers[0], numbers[1]);
}

}  // namespace
}  // namespace brick::runtime
