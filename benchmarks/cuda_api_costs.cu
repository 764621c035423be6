// What the CUDA calls on Event mode's op path cost the host, per call, on the machine it runs on:
// the figures the registry's Event-mode overhead is made of (two event records per timed op, a
// capture check, a query and an elapsed-time read per interval), beside an empty kernel's launch.
// Plain CUDA, no PyTorch: built and run by the GPU job (`scripts/run.sh gpu`), nvcc only.
//
//   nvcc -O2 -o cuda_api_costs benchmarks/cuda_api_costs.cu && ./cuda_api_costs
#include <cuda_runtime.h>

#include <cstdio>
#include <utility>
#include <vector>

#include "cuda_host_timing.h"

namespace {

using cuda_host_timing::check;
using cuda_host_timing::ns_per_call;

__global__ void empty_kernel() {}

}  // namespace

int main() {
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  constexpr int kIterations = 20000;
  std::vector<cudaEvent_t> timing(2000), plain(2000);
  for (auto& event : timing) check(cudaEventCreate(&event), "event");
  for (auto& event : plain)
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event");
  empty_kernel<<<1, 1, 0, stream>>>();
  check(cudaGetLastError(), "launch");

  std::printf("cuda_api_costs on %s: host ns per call (best of 3 x %d calls)\n", prop.name,
              kIterations);
  auto report = [](const char* what, double ns) { std::printf("    %-42s %8.0f ns\n", what, ns); };
  // PyTorch's default stream is the legacy one (brick's stream 0 on CUDA backing); streams from
  // its pool are non-blocking ones.
  const std::pair<const char*, cudaStream_t> streams[] = {{"the legacy default stream", nullptr},
                                                          {"a non-blocking stream", stream}};
  for (const auto& labelled : streams) {
    cudaStream_t on = labelled.second;
    std::printf("  on %s:\n", labelled.first);
    report("empty kernel launch",
           ns_per_call(on, kIterations, [&](int) { empty_kernel<<<1, 1, 0, on>>>(); }));
    report("cudaEventRecord (timing event)",
           ns_per_call(on, kIterations, [&](int i) { cudaEventRecord(timing[i % 2000], on); }));
    report("cudaEventRecord (no-timing event)",
           ns_per_call(on, kIterations, [&](int i) { cudaEventRecord(plain[i % 2000], on); }));
    report("cudaStreamIsCapturing", ns_per_call(on, kIterations, [&](int) {
             cudaStreamCaptureStatus status;
             cudaStreamIsCapturing(on, &status);
           }));
    report("kernel + 2 timing event records", ns_per_call(on, kIterations, [&](int i) {
             cudaEventRecord(timing[(2 * i) % 2000], on);
             empty_kernel<<<1, 1, 0, on>>>();
             cudaEventRecord(timing[(2 * i + 1) % 2000], on);
           }));
  }
  report("cudaGetDevice", ns_per_call(stream, kIterations, [&](int) {
           int device = 0;
           cudaGetDevice(&device);
         }));
  report("cudaSetDevice (same device)",
         ns_per_call(stream, kIterations, [&](int) { cudaSetDevice(0); }));
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  report("cudaThreadExchangeStreamCaptureMode", ns_per_call(stream, kIterations, [&](int) {
           cudaThreadExchangeStreamCaptureMode(&mode);
         }));
  for (int i = 0; i < 2000; ++i) check(cudaEventRecord(timing[i], stream), "record");
  check(cudaStreamSynchronize(stream), "synchronize");
  report("cudaEventQuery (completed)",
         ns_per_call(stream, kIterations, [&](int i) { cudaEventQuery(timing[i % 2000]); }));
  report("cudaEventElapsedTime (completed pair)", ns_per_call(stream, kIterations, [&](int i) {
           float ms = 0;
           cudaEventElapsedTime(&ms, timing[i % 1999], timing[i % 1999 + 1]);
         }));
  for (auto event : timing) cudaEventDestroy(event);
  for (auto event : plain) cudaEventDestroy(event);
  cudaStreamDestroy(stream);
  return 0;
}
