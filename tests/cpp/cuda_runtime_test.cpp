// GoogleTest suite for the CUDA runtime (brick device N = CUDA device N).
//
// Every test needs a usable GPU and skips, saying why, where there is none. Each test builds its
// own runtime with make_cuda_runtime(), so memory statistics start from zero. Host functions
// (cudaLaunchHostFunc) stand in for kernels: they hold a stream for a known time or until the
// test opens a gate, which makes ordering and timing observable without compiling device code.
#include <cuda.h>  // cuuint64_t
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime.h"
#include "test_util.h"

namespace brick::runtime {
namespace {

#define ASSERT_CUDA(expr)                                                \
  do {                                                                   \
    const cudaError_t assert_cuda_status = (expr);                       \
    ASSERT_EQ(assert_cuda_status, cudaSuccess)                           \
        << #expr << ": " << cudaGetErrorName(assert_cuda_status) << ": " \
        << cudaGetErrorString(assert_cuda_status);                       \
  } while (0)

template <typename Fn>
std::string error_message(Fn&& fn) {
  return brick::test::thrown_message<Error>(fn, "brick::runtime::Error");
}

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

void CUDART_CB sleep_host_fn(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::intptr_t>(ms)));
}

// Queues a host-side sleep of `ms` on `stream`: work queued after it starts `ms` later.
cudaError_t enqueue_sleep(cudaStream_t stream, int ms) {
  return cudaLaunchHostFunc(stream, sleep_host_fn,
                            reinterpret_cast<void*>(static_cast<std::intptr_t>(ms)));
}

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

struct EventDeleter {
  Runtime* runtime;
  void operator()(Event* event) const { runtime->destroy_event(event); }
};
using EventPtr = std::unique_ptr<Event, EventDeleter>;

class CudaRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    rt_ = make_cuda_runtime();
  }
  void TearDown() override {
    if (rt_ == nullptr) return;
    for (int d = 0; d < rt_->device_count(); ++d) rt_->set_current_stream(d, kDefaultStream);
    rt_->set_current_device(0);
    for (int d = 0; d < rt_->device_count(); ++d) rt_->synchronize_device(d);
  }

  Runtime& rt() { return *rt_; }
  cudaStream_t native(DeviceIndex device, StreamId stream) {
    return static_cast<cudaStream_t>(rt().native_stream(device, stream));
  }
  EventPtr make_event(DeviceIndex device, bool timing) {
    return EventPtr(rt().create_event(device, timing), EventDeleter{&rt()});
  }

  std::unique_ptr<Runtime> rt_;
};

// ---------------------------------------------------------------------------------------------
// Availability and identity

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

TEST_F(CudaRuntimeTest, IdentifiesAsCuda) {
  int count = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&count));
  EXPECT_EQ(rt().backing_kind(), BackingKind::Cuda);
  EXPECT_STREQ(rt().name(), "cuda");
  EXPECT_EQ(rt().device_count(), std::min(count, kMaxDevices));
  for (int d = 0; d < rt().device_count(); ++d) EXPECT_EQ(rt().backing_device_index(d), d);
}

TEST_F(CudaRuntimeTest, ChecksDeviceIndices) {
  const int n = rt().device_count();
  EXPECT_CONTAINS(error_message([&] { rt().check_device(n); }),
                  ("device index " + std::to_string(n) + " is out of range"));
  EXPECT_THROW(rt().allocate(n, 16), Error);
  EXPECT_THROW(rt().create_stream(n, 0), Error);
  EXPECT_THROW(rt().create_event(-1, false), Error);
  EXPECT_THROW(rt().native_stream(n, kDefaultStream), Error);
  EXPECT_THROW(rt().is_capturing(n, kDefaultStream), Error);
  EXPECT_THROW(rt().synchronize_device(n), Error);
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
  void* ptr = rt().allocate(last, 4096);
  const StreamId stream = rt().create_stream(last, 0);
  rt().synchronize_stream(last, stream);
  rt().deallocate(ptr);
  ASSERT_CUDA(cudaGetDevice(&cuda_device));
  EXPECT_EQ(cuda_device, 0) << "a runtime call left CUDA's current device changed";
}

TEST_F(CudaRuntimeTest, CurrentDeviceIsPerThread) {
  const int last = rt().device_count() - 1;
  rt().set_current_device(last);
  int seen = -1;
  std::thread([&] { seen = rt().current_device(); }).join();
  EXPECT_EQ(seen, 0);
  EXPECT_EQ(rt().current_device(), last);
}

// ---------------------------------------------------------------------------------------------
// Streams

TEST_F(CudaRuntimeTest, DefaultStreamIsTheLegacyStream) {
  for (int d = 0; d < rt().device_count(); ++d) {
    EXPECT_EQ(rt().current_stream(d), kDefaultStream);
    EXPECT_EQ(rt().native_stream(d, kDefaultStream), nullptr) << "PyTorch's default stream";
    EXPECT_EQ(rt().stream_from_native(d, nullptr), kDefaultStream);
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

TEST_F(CudaRuntimeTest, CreatedStreamsAreDistinctAndNonBlocking) {
  std::vector<StreamId> ids;
  std::vector<cudaStream_t> handles;
  for (int i = 0; i < 8; ++i) {
    ids.push_back(rt().create_stream(0, 0));
    handles.push_back(native(0, ids.back()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_NE(ids[i], kDefaultStream);
    EXPECT_NE(handles[i], nullptr);
    unsigned int flags = 0;
    ASSERT_CUDA(cudaStreamGetFlags(handles[i], &flags));
    EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking);
    for (size_t j = i + 1; j < ids.size(); ++j) {
      EXPECT_NE(ids[i], ids[j]);
      EXPECT_NE(handles[i], handles[j]);
    }
  }
}

TEST_F(CudaRuntimeTest, PrioritiesAreCudaPrioritiesClampedToTheDeviceRange) {
  ASSERT_CUDA(cudaSetDevice(0));
  int least = 0;
  int greatest = 0;
  ASSERT_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  auto priority_of = [&](int brick_priority) {
    int priority = 12345;
    EXPECT_EQ(cudaStreamGetPriority(native(0, rt().create_stream(0, brick_priority)), &priority),
              cudaSuccess);
    return priority;
  };
  EXPECT_EQ(priority_of(0), std::clamp(0, greatest, least));
  EXPECT_EQ(priority_of(-1), std::clamp(-1, greatest, least));
  EXPECT_EQ(priority_of(-1000), greatest) << "more negative than the range: the highest";
  EXPECT_EQ(priority_of(1000), least) << "positive: the lowest";
}

TEST_F(CudaRuntimeTest, CreateStreamIdsAreDistinctAcrossThreads) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 50;
  std::vector<std::vector<StreamId>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) ids[t].push_back(rt().create_stream(0, 0));
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<StreamId> all;
  for (const auto& v : ids) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "duplicate stream id";
  std::vector<cudaStream_t> handles;
  for (StreamId id : all) handles.push_back(native(0, id));
  std::sort(handles.begin(), handles.end());
  EXPECT_EQ(std::adjacent_find(handles.begin(), handles.end()), handles.end());
}

TEST_F(CudaRuntimeTest, StreamFromNativeRegistersExternalStreams) {
  ASSERT_CUDA(cudaSetDevice(0));
  cudaStream_t external = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&external, cudaStreamNonBlocking));
  const StreamId id = rt().stream_from_native(0, external);
  EXPECT_NE(id, kDefaultStream);
  EXPECT_EQ(rt().stream_from_native(0, external), id) << "registered once";
  EXPECT_EQ(native(0, id), external);
  rt().set_current_stream(0, id);
  EXPECT_EQ(rt().current_stream(0), id);
  rt().synchronize_stream(0, id);

  const StreamId created = rt().create_stream(0, 0);
  EXPECT_EQ(rt().stream_from_native(0, native(0, created)), created);

  EXPECT_CONTAINS(error_message([&] { rt().stream_from_native(0, cudaStreamPerThread); }),
                  ("per-thread default stream"));
  rt().set_current_stream(0, kDefaultStream);
  ASSERT_CUDA(cudaStreamDestroy(external));
}

TEST_F(CudaRuntimeTest, StreamFromNativeRejectsAnotherDevicesStream) {
  if (rt().device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const StreamId on_one = rt().create_stream(1, 0);
  const std::string message =
      error_message([&] { rt().stream_from_native(0, rt().native_stream(1, on_one)); });
  EXPECT_CONTAINS(message, ("belongs to cuda:1"));
  EXPECT_CONTAINS(message, ("brick:0 (cuda:0)"));
}

TEST_F(CudaRuntimeTest, CurrentStreamIsPerThreadAndPerDevice) {
  const StreamId mine = rt().create_stream(0, 0);
  const StreamId theirs = rt().create_stream(0, 0);
  rt().set_current_stream(0, mine);
  StreamId seen_default = -1;
  StreamId seen_after_set = -1;
  std::thread([&] {
    seen_default = rt().current_stream(0);
    rt().set_current_stream(0, theirs);
    seen_after_set = rt().current_stream(0);
  }).join();
  EXPECT_EQ(seen_default, kDefaultStream);
  EXPECT_EQ(seen_after_set, theirs);
  EXPECT_EQ(rt().current_stream(0), mine);
  if (rt().device_count() > 1) {
    EXPECT_EQ(rt().current_stream(1), kDefaultStream);
  }
}

TEST_F(CudaRuntimeTest, InvalidStreamIdsAreRejected) {
  const StreamId created = rt().create_stream(0, 0);
  const StreamId missing = created + 1;
  const std::string message = error_message([&] { rt().set_current_stream(0, missing); });
  EXPECT_CONTAINS(message, ("stream " + std::to_string(missing) + " does not exist"));
  EXPECT_CONTAINS(message, ("brick:0"));
  EXPECT_THROW(rt().set_current_stream(0, -1), Error);
  EXPECT_THROW(rt().query_stream(0, missing), Error);
  EXPECT_THROW(rt().synchronize_stream(0, missing), Error);
  EXPECT_THROW(rt().native_stream(0, missing), Error);
  EXPECT_THROW(rt().is_capturing(0, missing), Error);
  EXPECT_THROW(rt().record_stream(nullptr, 0, missing), Error);
  EXPECT_EQ(rt().current_stream(0), kDefaultStream);
}

TEST_F(CudaRuntimeTest, QueryAndSynchronizeStream) {
  const StreamId s = rt().create_stream(0, 0);
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
  const StreamId a = rt().create_stream(0, 0);
  const StreamId b = rt().create_stream(0, -1);
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
  const StreamId s = rt().create_stream(0, 0);
  const cudaStream_t handle = native(0, s);
  auto event = make_event(0, false);
  void* device_buffer = rt().allocate(0, 256);
  EXPECT_FALSE(rt().is_capturing(0, s));
  ASSERT_CUDA(cudaSetDevice(0));
  ASSERT_CUDA(cudaStreamBeginCapture(handle, cudaStreamCaptureModeRelaxed));
  cudaError_t end_status = cudaErrorUnknown;
  {
    CaptureEnder ender{handle, &end_status};
    EXPECT_TRUE(rt().is_capturing(0, s));
    EXPECT_FALSE(rt().is_capturing(0, kDefaultStream)) << "a non-blocking capture is private";
    EXPECT_CONTAINS(error_message([&] { rt().record_event(event.get(), 0, s); }),
                    ("being captured into a CUDA graph"));
    EXPECT_CONTAINS(error_message([&] { rt().synchronize_stream(0, s); }), ("captured"));
    EXPECT_CONTAINS(error_message([&] { rt().query_stream(0, s); }), ("captured"));
    rt().set_current_stream(0, s);
    unsigned char host[256] = {};
    EXPECT_CONTAINS(error_message([&] { rt().copy(host, -1, device_buffer, 0, 256); }),
                    ("captured"));
    rt().set_current_stream(0, kDefaultStream);
  }
  EXPECT_EQ(end_status, cudaSuccess)
      << "the checks invalidated the capture: " << cudaGetErrorName(end_status);
  EXPECT_FALSE(rt().is_capturing(0, s));
  EXPECT_NO_THROW(rt().record_event(event.get(), 0, s));
  rt().synchronize_event(event.get());
  rt().deallocate(device_buffer);
}

TEST_F(CudaRuntimeTest, LegacyStreamCountsAsCapturingDuringABlockingCapture) {
  // While a blocking stream captures (global mode), the legacy stream is unusable.
  ASSERT_CUDA(cudaSetDevice(0));
  cudaStream_t blocking = nullptr;
  ASSERT_CUDA(cudaStreamCreate(&blocking));
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
  ASSERT_CUDA(cudaStreamDestroy(blocking));
}

// ---------------------------------------------------------------------------------------------
// Events

TEST_F(CudaRuntimeTest, EventsKnowTheirDeviceAndTimingFlag) {
  for (int d = 0; d < rt().device_count(); ++d) {
    EXPECT_EQ(rt().event_device(make_event(d, false).get()), d);
    EXPECT_EQ(rt().event_device(make_event(d, true).get()), d);
  }
  EXPECT_NO_FATAL_FAILURE(rt().destroy_event(nullptr));
}

TEST_F(CudaRuntimeTest, EventsOrderWorkAcrossStreams) {
  const StreamId producer = rt().create_stream(0, 0);
  const StreamId consumer = rt().create_stream(0, 0);
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

TEST_F(CudaRuntimeTest, WaitingForAnUnrecordedEventIsANoOp) {
  const StreamId s = rt().create_stream(0, 0);
  auto never = make_event(0, false);
  EXPECT_NO_THROW(rt().stream_wait_event(0, s, never.get()));
  rt().synchronize_stream(0, s);
}

TEST_F(CudaRuntimeTest, QueryAndSynchronizeEvent) {
  auto event = make_event(0, false);
  EXPECT_TRUE(rt().query_event(event.get())) << "an unrecorded event counts as complete";
  EXPECT_NO_THROW(rt().synchronize_event(event.get()));
  const StreamId s = rt().create_stream(0, 0);
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

TEST_F(CudaRuntimeTest, ElapsedTimeMeasuresAKnownDuration) {
  const StreamId s = rt().create_stream(0, 0);
  auto start = make_event(0, true);
  auto end = make_event(0, true);
  rt().record_event(start.get(), 0, s);
  ASSERT_CUDA(enqueue_sleep(native(0, s), 20));
  rt().record_event(end.get(), 0, s);
  rt().synchronize_event(end.get());
  const double ms = rt().elapsed_ms(start.get(), end.get());
  EXPECT_GE(ms, 19.5);
  EXPECT_LE(ms, 500.0);
  // Reversed order: the negative interval (event_host_time_ns relies on this).
  EXPECT_NEAR(rt().elapsed_ms(end.get(), start.get()), -ms, 0.01);
}

TEST_F(CudaRuntimeTest, ElapsedTimeNeedsTimingEvents) {
  auto timed = make_event(0, true);
  auto untimed = make_event(0, false);
  rt().record_event(timed.get(), 0, kDefaultStream);
  rt().record_event(untimed.get(), 0, kDefaultStream);
  rt().synchronize_device(0);
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(timed.get(), untimed.get()); }),
                  ("enable_timing"));
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(untimed.get(), timed.get()); }),
                  ("enable_timing"));
}

TEST_F(CudaRuntimeTest, ElapsedTimeNeedsBothEventsRecorded) {
  auto start = make_event(0, true);
  auto end = make_event(0, true);
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(start.get(), end.get()); }), ("recorded"));
  rt().record_event(start.get(), 0, kDefaultStream);
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(start.get(), end.get()); }), ("recorded"));
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(end.get(), start.get()); }), ("recorded"));
}

TEST_F(CudaRuntimeTest, ElapsedTimeNeedsBothEventsCompleted) {
  const StreamId s = rt().create_stream(0, 0);
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

TEST_F(CudaRuntimeTest, ElapsedTimeNeedsEventsOfOneDevice) {
  if (rt().device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto a = make_event(0, true);
  auto b = make_event(1, true);
  rt().record_event(a.get(), 0, kDefaultStream);
  rt().record_event(b.get(), 1, kDefaultStream);
  rt().synchronize_event(a.get());
  rt().synchronize_event(b.get());
  EXPECT_CONTAINS(error_message([&] { rt().elapsed_ms(a.get(), b.get()); }), ("same device"));
}

TEST_F(CudaRuntimeTest, RecordingOnAnotherDevicesStreamThrows) {
  if (rt().device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto event = make_event(0, true);
  const std::string message =
      error_message([&] { rt().record_event(event.get(), 1, kDefaultStream); });
  EXPECT_CONTAINS(message, ("brick:0"));
  EXPECT_CONTAINS(message, ("brick:1"));
}

TEST_F(CudaRuntimeTest, RecordingOnAnInvalidStreamThrows) {
  auto event = make_event(0, false);
  EXPECT_CONTAINS(error_message([&] { rt().record_event(event.get(), 0, 4242); }),
                  ("stream 4242 does not exist"));
}

TEST_F(CudaRuntimeTest, EventHostTimeIsWhenTheEventCompleted) {
  const StreamId s = rt().create_stream(0, 0);
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
  const StreamId s = rt().create_stream(0, 0);
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
  const StreamId s = rt().create_stream(0, 0);
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
// Memory

TEST_F(CudaRuntimeTest, AllocateGivesDeviceMemoryOfTheGivenDevice) {
  for (int d = 0; d < rt().device_count(); ++d) {
    void* ptr = rt().allocate(d, 1000);
    ASSERT_NE(ptr, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ptr) % 256, 0u);
    cudaPointerAttributes attributes{};
    ASSERT_CUDA(cudaPointerGetAttributes(&attributes, ptr));
    EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
    EXPECT_EQ(attributes.device, d);
    const Runtime::Released released = rt().deallocate(ptr);
    EXPECT_EQ(released.nbytes, 1000u);
    EXPECT_EQ(released.device, d);
  }
}

TEST_F(CudaRuntimeTest, ZeroBytesAndNull) {
  EXPECT_EQ(rt().allocate(0, 0), nullptr);
  EXPECT_EQ(rt().memory_stats(0).total_allocations, 0);
  const Runtime::Released released = rt().deallocate(nullptr);
  EXPECT_EQ(released.nbytes, 0u);
  EXPECT_EQ(released.device, -1);
  EXPECT_NO_THROW(rt().record_stream(nullptr, 0, kDefaultStream));
}

TEST_F(CudaRuntimeTest, MemoryStatsFollowAllocations) {
  void* a = rt().allocate(0, 100);
  void* b = rt().allocate(0, 300);
  MemoryStats s = rt().memory_stats(0);
  EXPECT_EQ(s.allocated_bytes, 400);
  EXPECT_EQ(s.allocations, 2);
  EXPECT_EQ(s.peak_allocated_bytes, 400);
  rt().deallocate(b);
  s = rt().memory_stats(0);
  EXPECT_EQ(s.allocated_bytes, 100);
  EXPECT_EQ(s.peak_allocated_bytes, 400);
  EXPECT_EQ(s.total_frees, 1);
  EXPECT_EQ(s.freed_bytes_total, 300);
  rt().reset_peak_memory_stats(0);
  EXPECT_EQ(rt().memory_stats(0).peak_allocated_bytes, 100);
  rt().deallocate(a);
  s = rt().memory_stats(0);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.allocations, 0);
  EXPECT_EQ(s.total_allocations, 2);
  if (rt().device_count() > 1) {
    EXPECT_EQ(rt().memory_stats(1).total_allocations, 0);
  }
}

TEST_F(CudaRuntimeTest, MemoryPoolKeepsFreedMemoryCached) {
  rt().deallocate(rt().allocate(0, 1 << 20));  // sets the pool up
  cudaMemPool_t pool = nullptr;
  ASSERT_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  cuuint64_t threshold = 0;
  ASSERT_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  EXPECT_EQ(threshold, std::numeric_limits<cuuint64_t>::max());
}

TEST_F(CudaRuntimeTest, AllocationFailureNamesDeviceBytesAndCudaError) {
  const size_t too_much = size_t{1} << 50;  // 1 PiB
  const std::string message = error_message([&] { rt().allocate(0, too_much); });
  EXPECT_CONTAINS(message, ("brick: allocating " + std::to_string(too_much) + " bytes"));
  EXPECT_CONTAINS(message, ("on brick:0 (cuda:0) failed: cudaError"));
  EXPECT_CONTAINS(message, ("out of memory"));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failure was left as the last error";
  EXPECT_EQ(rt().memory_stats(0).allocations, 0);
  // The runtime still works afterwards.
  rt().deallocate(rt().allocate(0, 64));
}

TEST_F(CudaRuntimeTest, AllocationIsOrderedOnTheCurrentStream) {
  // Memory allocated and written on the current stream reads back correctly.
  const StreamId s = rt().create_stream(0, 0);
  rt().set_current_stream(0, s);
  constexpr size_t kBytes = 1 << 20;
  void* ptr = rt().allocate(0, kBytes);
  ASSERT_CUDA(cudaSetDevice(0));
  ASSERT_CUDA(cudaMemsetAsync(ptr, 0x5a, kBytes, native(0, s)));
  std::vector<unsigned char> back(kBytes, 0);
  rt().copy(back.data(), -1, ptr, 0, kBytes);
  EXPECT_TRUE(std::all_of(back.begin(), back.end(), [](unsigned char c) { return c == 0x5a; }));
  rt().deallocate(ptr);
}

TEST_F(CudaRuntimeTest, RecordStreamDelaysTheFreeUntilThatStreamsWork) {
  const StreamId alloc_stream = rt().create_stream(0, 0);
  const StreamId user_stream = rt().create_stream(0, 0);
  rt().set_current_stream(0, alloc_stream);
  constexpr size_t kBytes = 1 << 16;
  void* ptr = rt().allocate(0, kBytes);
  rt().synchronize_stream(0, alloc_stream);
  rt().record_stream(ptr, 0, user_stream);
  rt().record_stream(ptr, 0, user_stream);   // recorded once
  rt().record_stream(ptr, 0, alloc_stream);  // the allocation stream: nothing to add
  Gate gate;
  {
    GateOpener opener{gate};
    ASSERT_CUDA(enqueue_gate(native(0, user_stream), gate));  // "work" using ptr
    rt().deallocate(ptr);
    EXPECT_EQ(rt().memory_stats(0).allocations, 0) << "the free counts at once";
    EXPECT_FALSE(rt().query_stream(0, alloc_stream))
        << "the free on the allocation stream did not wait for the recorded stream";
  }
  rt().synchronize_stream(0, alloc_stream);
  EXPECT_EQ(gate.passed.load(), 1);
}

TEST_F(CudaRuntimeTest, RecordStreamOfAnotherDevice) {
  if (rt().device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  void* ptr = rt().allocate(0, 4096);
  const StreamId other = rt().create_stream(1, 0);
  rt().record_stream(ptr, 1, other);
  Gate gate;
  {
    GateOpener opener{gate};
    ASSERT_CUDA(enqueue_gate(native(1, other), gate));
    rt().deallocate(ptr);
    EXPECT_FALSE(rt().query_stream(0, kDefaultStream));
  }
  rt().synchronize_device(0);
  EXPECT_EQ(gate.passed.load(), 1);
}

TEST_F(CudaRuntimeTest, RecordStreamRejectsForeignPointers) {
  int on_the_stack = 0;
  EXPECT_CONTAINS(error_message([&] { rt().record_stream(&on_the_stack, 0, kDefaultStream); }),
                  ("not the start of memory allocated by this CUDA runtime"));
}

TEST_F(CudaRuntimeTest, DeallocateFromAnotherThread) {
  void* ptr = rt().allocate(0, 256);
  Runtime::Released released{0, -1};
  std::thread([&] { released = rt().deallocate(ptr); }).join();
  EXPECT_EQ(released.nbytes, 256u);
  EXPECT_EQ(released.device, 0);
  EXPECT_EQ(rt().memory_stats(0).allocated_bytes, 0);
}

TEST_F(CudaRuntimeTest, ConcurrentAllocationsBalanceExactly) {
  constexpr int kThreads = 8;
  constexpr int kBlocks = 2000;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int device = t % rt().device_count();
      rt().set_current_stream(device, rt().create_stream(device, 0));
      std::vector<void*> live;
      for (int i = 0; i < kBlocks; ++i) {
        live.push_back(rt().allocate(device, 1 + static_cast<size_t>((i * 131 + t) % 8192)));
        if (live.size() == 32) {
          for (void* ptr : live) {
            if (rt().deallocate(ptr).device != device) ++failures[t];
          }
          live.clear();
        }
      }
      for (void* ptr : live) rt().deallocate(ptr);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  for (int d = 0; d < rt().device_count(); ++d) {
    const MemoryStats s = rt().memory_stats(d);
    EXPECT_EQ(s.allocated_bytes, 0) << "device " << d;
    EXPECT_EQ(s.allocations, 0) << "device " << d;
    EXPECT_EQ(s.total_allocations, s.total_frees) << "device " << d;
  }
}

TEST(CudaRuntimeExit, FreeingAtExitIsClean) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        static Runtime* runtime = make_cuda_runtime().release();
        static void* ptr = runtime->allocate(0, 1 << 20);
        std::atexit([] {
          runtime->deallocate(ptr);
          std::_Exit(7);
        });
        std::exit(0);
      },
      ::testing::ExitedWithCode(7), "");
}

// ---------------------------------------------------------------------------------------------
// Copy

std::vector<unsigned char> pattern(size_t nbytes, unsigned seed) {
  std::vector<unsigned char> bytes(nbytes);
  for (size_t i = 0; i < nbytes; ++i) bytes[i] = static_cast<unsigned char>(i * 31 + seed);
  return bytes;
}

TEST_F(CudaRuntimeTest, CopyBetweenHostAndDevice) {
  constexpr size_t kBytes = (1 << 20) + 3;
  const auto host = pattern(kBytes, 7);
  void* a = rt().allocate(0, kBytes);
  void* b = rt().allocate(0, kBytes);
  rt().copy(a, 0, host.data(), -1, kBytes);  // host -> brick:0
  rt().copy(b, 0, a, 0, kBytes);             // brick:0 -> brick:0
  std::vector<unsigned char> back(kBytes, 0);
  rt().copy(back.data(), -1, b, 0, kBytes);  // brick:0 -> host
  EXPECT_EQ(back, host);
  rt().deallocate(a);
  rt().deallocate(b);
}

TEST_F(CudaRuntimeTest, CopyFromPageableMemoryIsDoneWhenItReturns) {
  constexpr size_t kBytes = 8 << 20;
  auto host = pattern(kBytes, 1);
  const auto original = host;
  void* ptr = rt().allocate(0, kBytes);
  rt().copy(ptr, 0, host.data(), -1, kBytes);
  std::fill(host.begin(), host.end(), 0);  // the caller owns the buffer again
  std::vector<unsigned char> back(kBytes, 0);
  rt().copy(back.data(), -1, ptr, 0, kBytes);
  EXPECT_EQ(back, original);
  rt().deallocate(ptr);
}

TEST_F(CudaRuntimeTest, CopyOnANonDefaultCurrentStream) {
  const StreamId s = rt().create_stream(0, 0);
  rt().set_current_stream(0, s);
  constexpr size_t kBytes = 4096;
  const auto host = pattern(kBytes, 3);
  void* ptr = rt().allocate(0, kBytes);
  rt().copy(ptr, 0, host.data(), -1, kBytes);
  std::vector<unsigned char> back(kBytes, 0);
  rt().copy(back.data(), -1, ptr, 0, kBytes);
  EXPECT_EQ(back, host);
  rt().deallocate(ptr);
}

TEST_F(CudaRuntimeTest, CopyWithinADeviceHandlesOverlap) {
  constexpr size_t kBytes = 1 << 16;
  constexpr size_t kShift = 1000;
  const auto host = pattern(kBytes, 11);
  auto* buf = static_cast<unsigned char*>(rt().allocate(0, kBytes));
  for (const bool forward : {true, false}) {
    rt().copy(buf, 0, host.data(), -1, kBytes);
    auto expected = host;
    const size_t n = kBytes - kShift;
    if (forward) {
      rt().copy(buf + kShift, 0, buf, 0, n);
      std::memmove(expected.data() + kShift, expected.data(), n);
    } else {
      rt().copy(buf, 0, buf + kShift, 0, n);
      std::memmove(expected.data(), expected.data() + kShift, n);
    }
    std::vector<unsigned char> back(kBytes, 0);
    rt().copy(back.data(), -1, buf, 0, kBytes);
    EXPECT_EQ(back, expected) << (forward ? "forward" : "backward");
  }
  EXPECT_NO_THROW(rt().copy(buf, 0, buf, 0, kBytes));  // onto itself: nothing to do
  EXPECT_NO_THROW(rt().copy(nullptr, 0, nullptr, 0, 0));
  rt().deallocate(buf);
}

TEST_F(CudaRuntimeTest, CopyBetweenHostBuffers) {
  const auto src = pattern(100, 5);
  std::vector<unsigned char> dst(100, 0);
  rt().copy(dst.data(), -1, src.data(), -1, 100);
  EXPECT_EQ(dst, src);
}

TEST_F(CudaRuntimeTest, CopyValidatesDevices) {
  unsigned char a[8] = {};
  unsigned char b[8] = {};
  const int n = rt().device_count();
  EXPECT_CONTAINS(error_message([&] { rt().copy(a, n, b, -1, 8); }),
                  ("device index " + std::to_string(n)));
}

TEST_F(CudaRuntimeTest, CopyBetweenTwoGpus) {
  if (rt().device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  constexpr size_t kBytes = (4 << 20) + 5;
  const auto host = pattern(kBytes, 9);
  void* on0 = rt().allocate(0, kBytes);
  void* on1 = rt().allocate(1, kBytes);
  rt().copy(on0, 0, host.data(), -1, kBytes);
  rt().copy(on1, 1, on0, 0, kBytes);  // brick:0 -> brick:1
  std::vector<unsigned char> back(kBytes, 0);
  rt().copy(back.data(), -1, on1, 1, kBytes);
  EXPECT_EQ(back, host);

  // The other way, on non-default current streams: ordered on both.
  const StreamId s0 = rt().create_stream(0, 0);
  const StreamId s1 = rt().create_stream(1, 0);
  rt().set_current_stream(0, s0);
  rt().set_current_stream(1, s1);
  const auto other = pattern(kBytes, 77);
  rt().copy(on1, 1, other.data(), -1, kBytes);
  rt().copy(on0, 0, on1, 1, kBytes);  // brick:1 -> brick:0
  rt().copy(back.data(), -1, on0, 0, kBytes);
  EXPECT_EQ(back, other);
  rt().deallocate(on0);
  rt().deallocate(on1);
}

TEST_F(CudaRuntimeTest, PeerCopyWaitsForTheDestinationsStream) {
  if (rt().device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  constexpr size_t kBytes = 1 << 20;
  void* on0 = rt().allocate(0, kBytes);
  void* on1 = rt().allocate(1, kBytes);
  Gate gate;
  {
    GateOpener opener{gate};
    ASSERT_CUDA(enqueue_gate(native(1, kDefaultStream), gate));  // brick:1 still "using" on1
    rt().copy(on1, 1, on0, 0, kBytes);
    EXPECT_FALSE(rt().query_stream(0, kDefaultStream))
        << "the copy on brick:0's stream did not wait for brick:1's stream";
  }
  rt().synchronize_device(0);
  rt().synchronize_device(1);
  rt().deallocate(on0);
  rt().deallocate(on1);
}

// ---------------------------------------------------------------------------------------------
// Selection (with a GPU present; runtime_test.cpp covers the machine without one)

// CUDA backing checks standing in for a CPU-only PyTorch above the runtime.
std::optional<std::string> refuse_cuda_backing() { return "this PyTorch cannot run CUDA kernels"; }

class SelectionWithGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    if (const char* value = std::getenv("BRICK_RUNTIME")) saved_ = value;
  }
  void TearDown() override {
    set_cuda_backing_check(nullptr);
    if (saved_) {
      setenv("BRICK_RUNTIME", saved_->c_str(), 1);
    } else {
      unsetenv("BRICK_RUNTIME");
    }
  }
  std::optional<std::string> saved_;
};

TEST_F(SelectionWithGpuTest, AutoChoosesCudaWhenAllowed) {
  unsetenv("BRICK_RUNTIME");
  set_cuda_backing_check(nullptr);
  const RuntimeChoice choice = make_runtime_from_env();
  EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Cuda);
  EXPECT_CONTAINS(choice.note, ("cuda runtime"));
}

TEST_F(SelectionWithGpuTest, AutoChoosesHostWhenCudaBackingIsNotAllowed) {
  setenv("BRICK_RUNTIME", "auto", 1);
  set_cuda_backing_check(&refuse_cuda_backing);
  const RuntimeChoice choice = make_runtime_from_env();
  EXPECT_EQ(choice.runtime->backing_kind(), BackingKind::Host);
  EXPECT_CONTAINS(choice.note, ("this PyTorch cannot run CUDA kernels"));
}

TEST_F(SelectionWithGpuTest, CudaAskedForButNotAllowedThrowsTheReason) {
  setenv("BRICK_RUNTIME", "cuda", 1);
  set_cuda_backing_check(&refuse_cuda_backing);
  const std::string message = error_message([] { make_runtime_from_env(); });
  EXPECT_CONTAINS(message, ("BRICK_RUNTIME=cuda was asked for but this PyTorch cannot run CUDA"));
  set_cuda_backing_check(nullptr);
  EXPECT_EQ(make_runtime_from_env().runtime->backing_kind(), BackingKind::Cuda);
}

}  // namespace
}  // namespace brick::runtime
