// GoogleTest suite for the CUDA work tracer (runtime/work_tracer.h over CUPTI): on a GPU, every
// copy and memset queued inside a pushed interval comes back with that interval's id and the
// device's duration, which an event pair around a long one confirms; nothing comes back once
// tracing stops. Without a GPU or CUPTI the tests skip, saying why; the reason for a library
// that cannot be loaded is checked everywhere (cupti_tracer_missing_library, in CTest).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "runtime/runtime.h"
#include "runtime/work_tracer.h"
#include "runtime_test_util.h"

namespace brick::runtime {
namespace {

TEST(CuptiTracerLoading, ALibraryThatCannotBeLoadedIsNamedInTheReason) {
  const char* asked = std::getenv("BRICK_CUPTI_LIBRARY");
  if (asked == nullptr || std::string(asked).find("/nonexistent/") == std::string::npos) {
    GTEST_SKIP() << "run with BRICK_CUPTI_LIBRARY=/nonexistent/... (CTest: "
                    "cupti_tracer_missing_library)";
  }
  std::string why;
  EXPECT_EQ(make_cupti_tracer(&why), nullptr);
  EXPECT_NE(why.find(asked), std::string::npos) << why;
  EXPECT_NE(why.find("cannot be loaded"), std::string::npos) << why;
}

TEST(CuptiTracerLoading, ARealCuptiLibraryGivesEveryEntryPointWithoutAGpu) {
  const char* asked = std::getenv("BRICK_CUPTI_LIBRARY");
  if (asked == nullptr || std::string(asked).find("/nonexistent/") != std::string::npos) {
    GTEST_SKIP() << "run with BRICK_CUPTI_LIBRARY naming a CUPTI library (CTest: "
                    "cupti_tracer_loads_the_toolkits_library, where the toolkit has one)";
  }
  std::string why;
  EXPECT_NE(make_cupti_tracer(&why), nullptr) << why;
  EXPECT_EQ(why, "");
}

class CuptiTracerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_runtime_usable(&why)) GTEST_SKIP() << "no usable GPU: " << why;
    tracer_ = make_cupti_tracer(&why);
    if (tracer_ == nullptr) GTEST_SKIP() << "no CUPTI: " << why;
    ASSERT_CUDA(cudaMalloc(&buffer_, kBytes));
    ASSERT_CUDA(cudaMalloc(&other_, kBytes));
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    tracer_->start();
  }
  void TearDown() override {
    if (tracer_ != nullptr) tracer_->stop();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    cudaFree(buffer_);
    cudaFree(other_);
  }

  // Durations of the work each interval's calls queued, summed, and its pieces of work.
  struct Sum {
    int64_t ns = 0;
    int pieces = 0;
  };
  std::map<uint64_t, Sum> drain_by_interval() {
    TracedRecords records;
    tracer_->drain(&records);
    std::map<uint32_t, uint64_t> interval_of;
    for (const TracedCall& call : records.calls) interval_of[call.call] = call.interval;
    std::map<uint64_t, Sum> sums;
    for (const TracedWork& work : records.work) {
      const auto found = interval_of.find(work.call);
      Sum& sum = sums[found == interval_of.end() ? 0 : found->second];
      sum.ns += work.end_ns - work.start_ns;
      ++sum.pieces;
    }
    EXPECT_EQ(records.dropped, 0u);
    return sums;
  }

  static constexpr size_t kBytes = size_t{512} << 20;
  std::unique_ptr<WorkTracer> tracer_;
  void* buffer_ = nullptr;
  void* other_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

TEST_F(CuptiTracerTest, WorkQueuedInsideAnIntervalComesBackWithItsIdAndTheDevicesDuration) {
  cudaEvent_t start = nullptr, end = nullptr;
  ASSERT_CUDA(cudaEventCreate(&start));
  ASSERT_CUDA(cudaEventCreate(&end));
  tracer_->push(41);
  ASSERT_CUDA(cudaMemsetAsync(buffer_, 1, kBytes, stream_));
  tracer_->push(42);  // nested: its calls belong to 42 only
  ASSERT_CUDA(cudaEventRecord(start, stream_));
  ASSERT_CUDA(cudaMemcpyAsync(other_, buffer_, kBytes, cudaMemcpyDeviceToDevice, stream_));
  ASSERT_CUDA(cudaEventRecord(end, stream_));
  tracer_->pop();
  tracer_->pop();
  ASSERT_CUDA(cudaMemsetAsync(buffer_, 2, kBytes, stream_));  // outside every interval
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  float event_ms = 0;
  ASSERT_CUDA(cudaEventElapsedTime(&event_ms, start, end));
  const auto sums = drain_by_interval();
  ASSERT_EQ(sums.count(41), 1u) << "the memset inside 41";
  ASSERT_EQ(sums.count(42), 1u) << "the copy inside 42";
  EXPECT_EQ(sums.at(41).pieces, 1);
  EXPECT_EQ(sums.at(42).pieces, 1);
  EXPECT_GT(sums.at(41).ns, 0);
  // The copy behind a queued memset: the event pair brackets it alone, with the stream busy.
  const double event_ns = event_ms * 1e6;
  EXPECT_NEAR(static_cast<double>(sums.at(42).ns), event_ns, 0.05 * event_ns + 5'000);
  ASSERT_EQ(sums.count(0), 1u) << "the memset outside every interval is traced, unnamed";
  cudaEventDestroy(start);
  cudaEventDestroy(end);
}

TEST_F(CuptiTracerTest, NothingIsTracedOnceStopped) {
  tracer_->stop();
  tracer_->push(7);
  ASSERT_CUDA(cudaMemsetAsync(buffer_, 3, kBytes, stream_));
  tracer_->pop();
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(drain_by_interval().empty());
}

}  // namespace
}  // namespace brick::runtime
