// GoogleTest suite for what only the CUDA runtime does (brick device N = CUDA device N): CUDA's
// current device left alone, the legacy default stream, registering CUDA streams, stream capture,
// events on held streams, event times on the host clock, and refusing the memory and streams the
// host runtime serves. The contract both runtimes keep is in runtime_test.cpp.
//
// Every test needs a usable GPU and skips, saying why, where there is none. Each test builds its
// own runtime with make_cuda_runtime(). Streams and memory come from the CUDA runtime kind
// (runtime_test_util.h), as PyTorch's would. Host functions (cudaLaunchHostFunc) stand in for
// kernels: they hold a stream for a known time or until the test opens a gate, which makes
// ordering and timing observable without compiling device code.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime.h"
#include "runtime_test_util.h"
#include "test_util.h"

namespace brick::runtime {
namespace {

using brick::test::CudaRuntimeKind;
using brick::test::enqueue_sleep;
using brick::test::error_message;
using brick::test::EventPtr;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Skips the calling test, with the reason, when no GPU is usable.
#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    std::string skip_reason;                                                 \
    if (!cuda_runtime_usable(&skip_reason)) {                                \
      GTEST_SKIP() << "no usable GPU for the CUDA runtime: " << skip_reason; \
    }                                                                        \
  } while (0)

// ---- stream helpers: host functions that hold a stream ----

// Holds every stream it is queued on until opened (or 30 s, so a failed test cannot hang).
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<int> passed{0};
  std::atomic<int64_t> passed_at_ns{0};
};

void CUDART_CB gate_host_fn(void* data) {
  auto* gate = static_cast<Gate*>(data);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!gate->open.load() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  gate->passed_at_ns.store(now_ns());
  gate->passed.fetch_add(1);
}

cudaError_t enqueue_gate(cudaStream_t stream, Gate& gate) {
  return cudaLaunchHostFunc(stream, gate_host_fn, &gate);
}

// Opens the gate when the scope ends, so a failing assertion never leaves a stream held.
struct GateOpener {
  Gate& gate;
  ~GateOpener() { gate.open.store(true); }
};

void CUDART_CB stamp_host_fn(void* data) {
  static_cast<std::atomic<int64_t>*>(data)->store(now_ns());
}

class CudaRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    rt_ = make_cuda_runtime();
  }
  void TearDown() override { tear_down_runtime(rt_, kind_); }

  Runtime& rt() { return *rt_; }
  StreamId new_stream(DeviceIndex device, int priority = 0) {
    return kind_.new_stream(*rt_, device, priority);
  }
  cudaStream_t native(DeviceIndex device, StreamId stream) {
    return kind_.native(*rt_, device, stream);
  }
  EventPtr make_event(DeviceIndex device, bool timing) {
    return brick::test::make_event(*rt_, device, timing);
  }

  CudaRuntimeKind kind_;
  std::unique_ptr<Runtime> rt_;
};

// ---------------------------------------------------------------------------------------------
// Availability

TEST(CudaRuntimeAvailability, UsableAgreesWithCudaGetDeviceCount) {
  SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  EXPECT_GT(count, 0);
  std::string why = "untouched";
  EXPECT_TRUE(cuda_runtime_usable(&why));
  EXPECT_EQ(why, "untouched") << "a usable GPU leaves the reason alone";
  EXPECT_TRUE(cuda_runtime_usable(nullptr));
}

// ---------------------------------------------------------------------------------------------
// Current device

TEST_F(CudaRuntimeTest, CurrentDeviceIsBrickStateNotCudaState) {
  ASSERT_CUDA(cudaSetDevice(0));
  ASSERT_CUDA(cudaFree(nullptr));  // make device 0's primary context exist, as PyTorch would
  const int last = rt().device_count() - 1;
  rt().set_current_device(last);
  EXPECT_EQ(rt().current_device(), last);
  int cuda_device = -1;
  ASSERT_CUDA(cudaGetDevice(&cuda_device));
  EXPECT_EQ(cuda_device, 0) << "set_current_device changed CUDA's current device";

  // Calls on another device switch CUDA's current device only for their duration.
  const StreamId stream = new_stream(last);
  auto event = make_event(last, true);
  rt().record_event(event.get(), last, stream);
  rt().synchronize_stream(last, stream);
  unsigned char host[64] = {};
  rt().copy(kind_.device_memory(rt(), last, sizeof(host)), last, host, -1, sizeof(host));
  ASSERT_CUDA(cudaGetDevice(&cuda_device));
  EXPECT_EQ(cuda_device, 0) << "a runtime call left CUDA's current device changed";
}

// ---------------------------------------------------------------------------------------------
// Streams

TEST_F(CudaRuntimeTest, DefaultStreamIsTheLegacyStream) {
  for (int d = 0; d < rt().device_count(); ++d) {
    EXPECT_EQ(rt().current_stream(d), kDefaultStream);
    EXPECT_EQ(rt().stream_from_native(d, nullptr), kDefaultStream) << "PyTorch's default stream";
    EXPECT_EQ(rt().stream_from_native(d, cudaStreamLegacy), kDefaultStream);
  }
}

TEST_F(CudaRuntimeTest, DefaultStreamOrdersWithPlainCudaWork) {
  // A blocking stream stands in for work PyTorch queues on its own CUDA streams: the legacy
  // stream waits for it, so an event on brick's default stream completes after it.
  ASSERT_CUDA(cudaSetDevice(0));
  cudaStream_t blocking = nullptr;
  ASSERT_CUDA(cudaStreamCreate(&blocking));
  std::atomic<int64_t> slept_until{0};
  ASSERT_CUDA(enqueue_sleep(blocking, 50));
  ASSERT_CUDA(cudaLaunchHostFunc(blocking, stamp_host_fn, &slept_until));
  auto event = make_event(0, false);
  rt().record_event(event.get(), 0, kDefaultStream);
  rt().synchronize_event(event.get());
  EXPECT_NE(slept_until.load(), 0) << "the default stream did not wait for a blocking stream";
  ASSERT_CUDA(cudaStreamSynchronize(blocking));
  ASSERT_CUDA(cudaStreamDestroy(blocking));
}

TEST_F(CudaRuntimeTest, StreamFromNativeRegistersExternalStreams) {
  const cudaStream_t external = kind_.create_native_stream(0, cudaStreamNonBlocking);
  const StreamId id = rt().stream_from_native(0, external);
  EXPECT_NE(id, kDefaultStream);
  EXPECT_EQ(rt().stream_from_native(0, external), id) << "registered once";
  rt().set_current_stream(0, id);
  EXPECT_EQ(rt().current_stream(0), id);
  rt().synchronize_stream(0, id);

  const StreamId created = new_stream(0);
  EXPECT_EQ(rt().stream_from_native(0, native(0, created)), created);

  EXPECT_CONTAINS(error_message([&] { rt().stream_from_native(0, cudaStreamPerThread); }),
                  ("per-thread default stream"));
  rt().set_current_stream(0, kDefaultStream);
}

TEST_F(CudaRuntimeTest, StreamFromNativeRejectsAnotherDevicesStream) {
  if (rt().device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const cudaStream_t on_one = kind_.create_native_stream(1, cudaStreamNonBlocking);
  const std::string message = error_message([&] { rt().stream_from_native(0, on_one); });
  EXPECT_CONTAINS(message, ("belongs to cuda:1"));
  EXPECT_CONTAINS(message, ("brick:0 (cuda:0)"));
}

TEST_F(CudaRuntimeTest, QueryAndSynchronizeStream) {
  const StreamId s = new_stream(0);
  EXPECT_TRUE(rt().query_stream(0, s));
  Gate gate;
  {
    GateOpener opener{gate};
    ASSERT_CUDA(enqueue_gate(native(0, s), gate));
    EXPECT_FALSE(rt().query_stream(0, s)) << "a held stream reported idle";
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaErrorNotReady was left behind";
  }
  rt().synchronize_stream(0, s);
  EXPECT_EQ(gate.passed.load(), 1);
  EXPECT_TRUE(rt().query_stream(0, s));
}

TEST_F(CudaRuntimeTest, SynchronizeDeviceWaitsForEveryStream) {
  const StreamId a = new_stream(0);
  const StreamId b = new_stream(0, -1);
  std::atomic<int64_t> a_done{0};
  std::atomic<int64_t> b_done{0};
  ASSERT_CUDA(enqueue_sleep(native(0, a), 30));
  ASSERT_CUDA(cudaLaunchHostFunc(native(0, a), stamp_host_fn, &a_done));
  ASSERT_CUDA(enqueue_sleep(native(0, b), 30));
  ASSERT_CUDA(cudaLaunchHostFunc(native(0, b), stamp_host_fn, &b_done));
  rt().synchronize_device(0);
  EXPECT_NE(a_done.load(), 0);
  EXPECT_NE(b_done.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Stream capture

// Ends a capture when the scope ends, so a failing assertion never leaves a stream capturing.
struct CaptureEnder {
  cudaStream_t stream;
  cudaError_t* result;
  ~CaptureEnder() {
    cudaGraph_t graph = nullptr;
    const cudaError_t status = cudaStreamEndCapture(stream, &graph);
    if (result != nullptr) *result = status;
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
};

TEST_F(CudaRuntimeTest, CaptureIsDetectedAndGuardsIllegalCalls) {
  const StreamId s = new_stream(0);
  const cudaStream_t handle = native(0, s);
  auto event = make_event(0, false);
  void* device_buffer = kind_.device_memory(rt(), 0, 256);
  EXPECT_FALSE(rt().is_capturing(0, s));
  ASSERT_CUDA(cudaSetDevice(0));
  ASSERT_CUDA(cudaStreamBeginCapture(handle, cudaStreamCaptureModeRelaxed));
  cudaError_t end_status = cudaErrorUnknown;
  {
    CaptureEnder ender{handle, &end_status};
    EXPECT_TRUE(rt().is_capturing(0, s));
    EXPECT_FALSE(rt().is_capturing(0, kDefaultStream)) << "a non-blocking capture is private";
    // Recording inside a capture is legal; what such an event cannot do is refused.
    EXPECT_NO_THROW(rt().record_event(event.get(), 0, s));
    EXPECT_CONTAINS(error_message([&] { rt().query_event(event.get()); }), ("captured"));
    EXPECT_CONTAINS(error_message([&] { rt().synchronize_event(event.get()); }), ("captured"));
    EXPECT_CONTAINS(error_message([&] { rt().synchronize_stream(0, s); }), ("captured"));
    EXPECT_CONTAINS(error_message([&] { rt().query_stream(0, s); }), ("captured"));
    rt().set_current_stream(0, s);
    unsigned char host[256] = {};
    EXPECT_CONTAINS(error_message([&] { rt().copy(device_buffer, 0, host, -1, 256); }),
                    ("captured"));
    rt().set_current_stream(0, kDefaultStream);
  }
  EXPECT_EQ(end_status, cudaSuccess)
      << "the checks invalidated the capture: " << cudaGetErrorName(end_status);
  EXPECT_FALSE(rt().is_capturing(0, s));
  EXPECT_NO_THROW(rt().record_event(event.get(), 0, s));
  rt().synchronize_event(event.get());
}

TEST_F(CudaRuntimeTest, ASideStreamForksAndJoinsInsideACaptureThroughEvents) {
  const StreamId main_stream = new_stream(0);
  const StreamId side = new_stream(0);
  auto fork = make_event(0, false);
  auto join = make_event(0, false);
  ASSERT_CUDA(cudaSetDevice(0));
  ASSERT_CUDA(cudaStreamBeginCapture(native(0, main_stream), cudaStreamCaptureModeGlobal));
  cudaError_t end_status = cudaErrorUnknown;
  {
    CaptureEnder ender{native(0, main_stream), &end_status};
    EXPECT_NO_THROW(rt().record_event(fork.get(), 0, main_stream));
    EXPECT_NO_THROW(rt().stream_wait_event(0, side, fork.get()));  // the side joins the capture
    EXPECT_TRUE(rt().is_capturing(0, side));
    EXPECT_NO_THROW(rt().record_event(join.get(), 0, side));
    EXPECT_NO_THROW(rt().stream_wait_event(0, main_stream, join.get()));
  }
  EXPECT_EQ(end_status, cudaSuccess) << cudaGetErrorName(end_status);
  // Recorded again outside a capture, the events are ordinary again.
  rt().record_event(fork.get(), 0, main_stream);
  rt().synchronize_event(fork.get());
  EXPECT_TRUE(rt().query_event(fork.get()));
}

TEST_F(CudaRuntimeTest, SynchronizingTheDeviceLeavesAnotherStreamsCaptureIntact) {
  const StreamId capturing = new_stream(0);
  const StreamId busy = new_stream(0);
  std::atomic<int64_t> done{0};
  ASSERT_CUDA(cudaSetDevice(0));
  ASSERT_CUDA(enqueue_sleep(native(0, busy), 20));
  ASSERT_CUDA(cudaLaunchHostFunc(native(0, busy), stamp_host_fn, &done));
  ASSERT_CUDA(cudaStreamBeginCapture(native(0, capturing), cudaStreamCaptureModeGlobal));
  cudaError_t end_status = cudaErrorUnknown;
  {
    CaptureEnder ender{native(0, capturing), &end_status};
    EXPECT_NO_THROW(rt().synchronize_device(0));  // (as immediate mode does around every brick)
    EXPECT_NE(done.load(), 0) << "the other streams' work was waited for";
  }
  EXPECT_EQ(end_status, cudaSuccess)
      << "the synchronize invalidated the capture: " << cudaGetErrorName(end_status);
}

TEST_F(CudaRuntimeTest, LegacyStreamCountsAsCapturingDuringABlockingCapture) {
  // While a blocking stream captures (global mode), the legacy stream is unusable.
  const cudaStream_t blocking = kind_.create_native_stream(0, cudaStreamDefault);
  ASSERT_CUDA(cudaSetDevice(0));
  const StreamId s = rt().stream_from_native(0, blocking);
  ASSERT_CUDA(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal));
  cudaError_t end_status = cudaErrorUnknown;
  {
    CaptureEnder ender{blocking, &end_status};
    EXPECT_TRUE(rt().is_capturing(0, s));
    EXPECT_TRUE(rt().is_capturing(0, kDefaultStream));
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaErrorStreamCaptureImplicit left behind";
  }
  EXPECT_EQ(end_status, cudaSuccess) << cudaGetErrorName(end_status);
  EXPECT_FALSE(rt().is_capturing(0, kDefaultStream));
}

// ---------------------------------------------------------------------------------------------
// Events

TEST_F(CudaRuntimeTest, EventsOrderWorkAcrossStreams) {
  const StreamId producer = new_stream(0);
  const StreamId consumer = new_stream(0);
  std::atomic<int64_t> produced_at{0};
  std::atomic<int64_t> consumed_at{0};
  ASSERT_CUDA(enqueue_sleep(native(0, producer), 50));
  ASSERT_CUDA(cudaLaunchHostFunc(native(0, producer), stamp_host_fn, &produced_at));
  auto ready = make_event(0, false);
  rt().record_event(ready.get(), 0, producer);
  rt().stream_wait_event(0, consumer, ready.get());
  ASSERT_CUDA(cudaLaunchHostFunc(native(0, consumer), stamp_host_fn, &consumed_at));
  rt().synchronize_stream(0, consumer);
  ASSERT_NE(produced_at.load(), 0) << "the consumer ran before the producer's work";
  EXPECT_GE(consumed_at.load(), produced_at.load());
}

TEST_F(CudaRuntimeTest, EventOfHeldWorkIsIncompleteUntilItRuns) {
  auto event = make_event(0, false);
  const StreamId s = new_stream(0);
  Gate gate;
  {
    GateOpener opener{gate};
    ASSERT_CUDA(enqueue_gate(native(0, s), gate));
    rt().record_event(event.get(), 0, s);
    EXPECT_FALSE(rt().query_event(event.get()));
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  rt().synchronize_event(event.get());
  EXPECT_EQ(gate.passed.load(), 1);
  EXPECT_TRUE(rt().query_event(event.get()));
}

TEST_F(CudaRuntimeTest, ElapsedTimeNeedsBothEventsCompleted) {
  const StreamId s = new_stream(0);
  auto start = make_event(0, true);
  auto end = make_event(0, true);
  Gate gate;
  {
    GateOpener opener{gate};
    rt().record_event(start.get(), 0, s);
    ASSERT_CUDA(enqueue_gate(native(0, s), gate));
    rt().record_event(end.get(), 0, s);
    rt().synchronize_event(start.get());
    const std::string message = error_message([&] { rt().elapsed_ms(start.get(), end.get()); });
    EXPECT_CONTAINS(message, ("the end event has not completed"));
    EXPECT_CONTAINS(message, ("brick:0 (cuda:0)"));
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaErrorNotReady was left behind";
  }
  rt().synchronize_event(end.get());
  EXPECT_GE(rt().elapsed_ms(start.get(), end.get()), 0.0);
}

TEST_F(CudaRuntimeTest, EventHostTimeIsWhenTheEventCompleted) {
  const StreamId s = new_stream(0);
  auto event = make_event(0, true);
  EXPECT_EQ(rt().event_host_time_ns(event.get()), -1) << "not recorded";
  auto untimed = make_event(0, false);
  rt().record_event(untimed.get(), 0, s);
  rt().synchronize_event(untimed.get());
  EXPECT_EQ(rt().event_host_time_ns(untimed.get()), -1) << "created without timing";

  // The event completes right after the host function returns, which it stamps.
  std::atomic<int64_t> returned_at{0};
  ASSERT_CUDA(enqueue_sleep(native(0, s), 10));
  ASSERT_CUDA(cudaLaunchHostFunc(native(0, s), stamp_host_fn, &returned_at));
  rt().record_event(event.get(), 0, s);
  rt().synchronize_event(event.get());
  const int64_t after_sync = now_ns();
  const int64_t host_ns = rt().event_host_time_ns(event.get());
  ASSERT_NE(host_ns, -1);
  EXPECT_GE(host_ns, returned_at.load() - 200'000) << "more than 0.2 ms before it could complete";
  EXPECT_LE(host_ns, after_sync + 200'000) << "after the host saw it complete";
}

TEST_F(CudaRuntimeTest, EventHostTimeOfAnIncompleteEventIsMinusOne) {
  const StreamId s = new_stream(0);
  auto event = make_event(0, true);
  Gate gate;
  {
    GateOpener opener{gate};
    ASSERT_CUDA(enqueue_gate(native(0, s), gate));
    rt().record_event(event.get(), 0, s);
    EXPECT_EQ(rt().event_host_time_ns(event.get()), -1);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  rt().synchronize_event(event.get());
  EXPECT_GT(rt().event_host_time_ns(event.get()), 0);
}

TEST_F(CudaRuntimeTest, EventHostTimeIsStableAcrossClockReferences) {
  // Measured again after the reference is renewed (older than 1 s), an event keeps its time
  // within the calibration error, and events keep their spacing.
  auto first = make_event(0, true);
  auto second = make_event(0, true);
  const StreamId s = new_stream(0);
  rt().record_event(first.get(), 0, s);
  ASSERT_CUDA(enqueue_sleep(native(0, s), 100));
  rt().record_event(second.get(), 0, s);
  rt().synchronize_event(second.get());
  const int64_t first_ns = rt().event_host_time_ns(first.get());
  const int64_t second_ns = rt().event_host_time_ns(second.get());
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  const int64_t first_again = rt().event_host_time_ns(first.get());
  const int64_t second_again = rt().event_host_time_ns(second.get());
  EXPECT_NEAR(static_cast<double>(first_again), static_cast<double>(first_ns), 100'000.0);
  EXPECT_NEAR(static_cast<double>(second_again), static_cast<double>(second_ns), 100'000.0);
  const double spacing_ms = static_cast<double>(second_again - first_again) / 1e6;
  EXPECT_NEAR(spacing_ms, rt().elapsed_ms(first.get(), second.get()), 0.1);
}

TEST_F(CudaRuntimeTest, EventHostTimeFromManyThreads) {
  auto event = make_event(0, true);
  rt().record_event(event.get(), 0, kDefaultStream);
  rt().synchronize_event(event.get());
  const int64_t expected = rt().event_host_time_ns(event.get());
  std::vector<int64_t> seen(8, -1);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] { seen[t] = rt().event_host_time_ns(event.get()); });
  }
  for (auto& thread : threads) thread.join();
  for (int64_t value : seen) EXPECT_NEAR(static_cast<double>(value), double(expected), 100'000.0);
}

// ---------------------------------------------------------------------------------------------
// Memory and streams: PyTorch's, never the runtime's

TEST_F(CudaRuntimeTest, RefusesToAllocateOrCreateStreamsSayingWhy) {
  const std::string no_memory = error_message([&] { rt().allocate(0, 4096); });
  EXPECT_CONTAINS(no_memory, ("the CUDA runtime allocates no memory (asked for 4096 bytes on "
                              "brick:0 (cuda:0))"));
  EXPECT_CONTAINS(no_memory, ("PyTorch's CUDA caching allocator"));
  EXPECT_CONTAINS(error_message([&] { rt().allocate(rt().device_count(), 16); }), ("device index"));
  EXPECT_CONTAINS(error_message([&] { rt().create_stream(0, -1); }),
                  ("registered with stream_from_native"));
  EXPECT_CONTAINS(error_message([&] { rt().create_stream(rt().device_count(), 0); }),
                  ("device index"));
  int on_the_stack = 0;
  EXPECT_CONTAINS(error_message([&] { rt().record_stream(&on_the_stack, 0, kDefaultStream); }),
                  ("is not memory of the CUDA runtime"));
  // A zero-byte allocation (nullptr) has nothing to keep alive or free.
  EXPECT_NO_THROW(rt().record_stream(nullptr, 0, kDefaultStream));
  const Runtime::Released released = rt().deallocate(nullptr);
  EXPECT_EQ(released.nbytes, 0u);
  EXPECT_EQ(released.device, -1);
  EXPECT_EQ(rt().memory_stats(0).total_allocations, 0);
}

TEST_F(CudaRuntimeTest, DeallocatingAnyPointerAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int on_the_stack = 0;
  EXPECT_DEATH(rt().deallocate(&on_the_stack), "allocates no memory");
}

}  // namespace
}  // namespace brick::runtime
