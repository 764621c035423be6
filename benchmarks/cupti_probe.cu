// What CUPTI's activity API gives and costs on the GPU it runs on: the facts a CUPTI timing
// source for CUDA-backed brick is designed on, measured before it is built.
//  1. Pairing: whether each kernel record pairs with the external correlation id pushed around
//     its launch when only kernel and external-correlation tracing are on, or only once runtime
//     API tracing is on too.
//  2. The first enable of concurrent-kernel tracing and the first launch after it (CUPTI
//     instruments the loaded modules then: seconds in some reports).
//  3. Host ns per empty-kernel launch: no CUPTI; kernel tracing; with a push and a pop of an
//     external id per launch; with runtime API tracing too; after tracing is disabled; after
//     cuptiFinalize() (CUPTI left attached slowed training after a profile in some reports).
//  4. Accuracy: for kernels from empty to tens of µs, an event pair around each launch against
//     CUPTI's duration of the same launch, on an idle stream (each call waited for: the pair
//     then holds the launch gap too) and on a backed-up one.
// Plain CUDA, no PyTorch; CUPTI is loaded at run time (dlopen), from the path given, else from
// BRICK_CUPTI_LIBRARY, else by the loader's search for libcupti.so. Built and run by the GPU job;
// the test command compiles it wherever nvcc is.
//
//   nvcc -O2 -Icsrc -o cupti_probe benchmarks/cupti_probe.cu -ldl && ./cupti_probe [libcupti.so]
#include <cuda_runtime.h>
#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda_host_timing.h"
#include "runtime/cupti_api.h"

namespace {

using cuda_host_timing::check;
using cuda_host_timing::Clock;
using cuda_host_timing::elapsed_ns;
using cuda_host_timing::ns_per_call;

__global__ void empty_kernel() {}

// Spins for `iterations` rounds of a dependent multiply-add: a kernel whose length grows with it.
__global__ void spin_kernel(int iterations, float* sink) {
  float value = threadIdx.x;
  for (int i = 0; i < iterations; ++i) value = value * 0.999f + 1.0f;
  if (value == -1.0f) *sink = value;  // never true: keeps the loop
}

// The CUPTI entry points the probe calls, resolved from the loaded library.
brick::runtime::cupti::Api g_cupti;

void check(CUptiResult status, const char* what) {
  if (status == CUPTI_SUCCESS) return;
  const char* text = "unknown";
  if (g_cupti.result_string != nullptr) g_cupti.result_string(status, &text);
  std::fprintf(stderr, "cupti_probe: %s: CUPTI error %d (%s)\n", what, static_cast<int>(status),
               text);
  std::exit(2);
}

void load_cupti(const char* path) {
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "cupti_probe: cannot load CUPTI from %s: %s\n", path, dlerror());
    std::exit(2);
  }
  if (const char* missing = brick::runtime::cupti::resolve_api(library, &g_cupti)) {
    std::fprintf(stderr, "cupti_probe: %s not found in the CUPTI library\n", missing);
    std::exit(2);
  }
}

// What the completed buffers held since the last take(): kernels (by correlation id) and the
// external ids of correlation ids. CUPTI may hand buffers over on a thread of its own.
struct KernelRecord {
  uint32_t correlation;
  uint64_t start_ns;
  uint64_t end_ns;
};
struct Records {
  std::vector<KernelRecord> kernels;
  std::unordered_map<uint32_t, uint64_t> external_of;
  size_t api_records = 0;
};
std::mutex g_records_mutex;
Records g_records;

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  std::lock_guard<std::mutex> lock(g_records_mutex);
  CUpti_Activity* record = nullptr;
  while (g_cupti.next_record(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        g_records.kernels.push_back({kernel->correlationId, kernel->start, kernel->end});
        break;
      }
      case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const auto* external = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
        g_records.external_of[external->correlationId] = external->externalId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER:
        ++g_records.api_records;
        break;
      default:
        break;
    }
  }
  std::free(buffer);
}

// Every record of the work done so far, delivered and taken (the device drained first).
Records take() {
  check(cudaDeviceSynchronize(), "synchronize");
  check(g_cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_records_mutex);
  Records taken = std::move(g_records);
  g_records = Records{};
  return taken;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Of the kernels taken, how many carry an external id, and how many of those ids lie in
// [first, first + count).
void report_pairing(const char* label, const Records& records, uint64_t first, uint64_t count) {
  size_t paired = 0, in_range = 0;
  for (const KernelRecord& kernel : records.kernels) {
    const auto found = records.external_of.find(kernel.correlation);
    if (found == records.external_of.end()) continue;
    ++paired;
    in_range += found->second >= first && found->second < first + count;
  }
  std::printf(
      "  pairing, %s: %zu kernel records, %zu with an external id (%zu the pushed ones), "
      "%zu API records\n",
      label, records.kernels.size(), paired, in_range, records.api_records);
}

constexpr CUpti_ExternalCorrelationKind kKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;

// Event pair against CUPTI for `calls` launches of `launch`, each inside its own external id
// (from `first_id`): idle (each call waited for) or backed up (behind a long kernel, not waited).
void report_accuracy(const char* label, cudaStream_t stream, bool backed_up, uint64_t first_id,
                     int calls, float* sink, void (*launch)(cudaStream_t, float*)) {
  std::vector<cudaEvent_t> events(2 * calls);
  for (auto& event : events) check(cudaEventCreate(&event), "event");
  take();
  if (backed_up) spin_kernel<<<1, 32, 0, stream>>>(4 << 20, sink);
  for (int i = 0; i < calls; ++i) {
    check(g_cupti.push(kKind, first_id + i), "push");
    check(cudaEventRecord(events[2 * i], stream), "record");
    launch(stream, sink);
    check(cudaEventRecord(events[2 * i + 1], stream), "record");
    uint64_t popped = 0;
    check(g_cupti.pop(kKind, &popped), "pop");
    if (!backed_up) check(cudaStreamSynchronize(stream), "synchronize");
  }
  const Records records = take();
  std::unordered_map<uint64_t, uint64_t> cupti_ns;  // external id -> kernel ns
  for (const KernelRecord& kernel : records.kernels) {
    const auto found = records.external_of.find(kernel.correlation);
    if (found != records.external_of.end())
      cupti_ns[found->second] += kernel.end_ns - kernel.start_ns;
  }
  std::vector<double> event_us, cupti_us, excess_us;
  for (int i = 0; i < calls; ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]), "elapsed");
    const auto found = cupti_ns.find(first_id + i);
    if (found == cupti_ns.end()) continue;
    event_us.push_back(ms * 1e3);
    cupti_us.push_back(found->second / 1e3);
    excess_us.push_back(ms * 1e3 - found->second / 1e3);
  }
  std::printf(
      "  %-34s %-10s %4zu/%d paired  event %8.2f us  CUPTI %8.2f us  event - CUPTI %7.2f us"
      " (median per call)\n",
      label, backed_up ? "backed up" : "idle", cupti_us.size(), calls, median(event_us),
      median(cupti_us), median(excess_us));
  for (auto event : events) cudaEventDestroy(event);
}

}  // namespace

int main(int argc, char** argv) {
  const char* from_env = std::getenv("BRICK_CUPTI_LIBRARY");
  const char* path = argc > 1 ? argv[1] : from_env != nullptr ? from_env : "libcupti.so";
  load_cupti(path);

  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  float* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(float)), "cudaMalloc");
  empty_kernel<<<1, 1, 0, stream>>>();
  spin_kernel<<<1, 32, 0, stream>>>(1, sink);
  check(cudaStreamSynchronize(stream), "synchronize");
  std::printf("cupti_probe on %s, CUPTI from %s\n", prop.name, path);

  constexpr int kIterations = 20000;
  auto launch_cost = [&](const char* what) {
    std::printf("  %-58s %7.0f ns per launch\n", what, ns_per_call(stream, kIterations, [&](int) {
                  empty_kernel<<<1, 1, 0, stream>>>();
                }));
  };
  launch_cost("empty kernel launch, no CUPTI");

  check(g_cupti.register_callbacks(buffer_requested, buffer_completed), "register callbacks");
  auto start = Clock::now();
  check(g_cupti.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable concurrent kernel");
  const double enable_ms = elapsed_ns(start) / 1e6;
  start = Clock::now();
  empty_kernel<<<1, 1, 0, stream>>>();
  check(cudaStreamSynchronize(stream), "synchronize");
  const double first_launch_ms = elapsed_ns(start) / 1e6;
  std::printf(
      "  first enable of concurrent-kernel tracing %.2f ms, the first launch after it "
      "(waited for) %.2f ms\n",
      enable_ms, first_launch_ms);
  take();
  launch_cost("empty kernel launch, kernel tracing");

  check(g_cupti.enable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), "enable external correlation");
  uint64_t next_id = 1;
  // Launches, each inside its own pushed external id: their host cost, then how many of their
  // kernel records carry the ids.
  auto launches_with_external_ids = [&](const char* cost_label, const char* pairing_label) {
    take();
    std::printf("  %-58s %7.0f ns per launch\n", cost_label,
                ns_per_call(stream, kIterations, [&](int i) {
                  g_cupti.push(kKind, next_id + i);
                  empty_kernel<<<1, 1, 0, stream>>>();
                  g_cupti.pop(kKind, nullptr);
                }));
    report_pairing(pairing_label, take(), next_id, kIterations);
    next_id += kIterations;
  };
  launches_with_external_ids("the same with a push and a pop of an external id",
                             "kernel + external correlation");
  check(g_cupti.enable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime");
  launches_with_external_ids("the same with runtime API tracing too",
                             "kernel + external correlation + runtime");

  // Accuracy with the tracing that pairs (runtime tracing kept: pairing may need it).
  struct Size {
    const char* label;
    void (*launch)(cudaStream_t, float*);
  };
  const Size sizes[] = {
      {"empty kernel", [](cudaStream_t s, float*) { empty_kernel<<<1, 1, 0, s>>>(); }},
      {"spin kernel, 1k rounds",
       [](cudaStream_t s, float* k) { spin_kernel<<<1, 32, 0, s>>>(1000, k); }},
      {"spin kernel, 4k rounds",
       [](cudaStream_t s, float* k) { spin_kernel<<<1, 32, 0, s>>>(4000, k); }},
      {"spin kernel, 32k rounds",
       [](cudaStream_t s, float* k) { spin_kernel<<<1, 32, 0, s>>>(32000, k); }},
  };
  constexpr int kCalls = 200;
  for (const Size& size : sizes) {
    for (bool backed_up : {false, true}) {
      report_accuracy(size.label, stream, backed_up, next_id, kCalls, sink, size.launch);
      next_id += kCalls;
    }
  }

  check(g_cupti.disable(CUPTI_ACTIVITY_KIND_RUNTIME), "disable runtime");
  check(g_cupti.disable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION), "disable external correlation");
  check(g_cupti.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable concurrent kernel");
  take();
  launch_cost("empty kernel launch, tracing disabled");
  check(g_cupti.finalize(), "cuptiFinalize");
  launch_cost("empty kernel launch, after cuptiFinalize()");

  cudaFree(sink);
  cudaStreamDestroy(stream);
  return 0;
}
