// What the standalone CUDA benchmarks (cuda_api_costs.cu, cupti_probe.cu) share: a CUDA error
// check that names the program, and the host time per call of a sequence of CUDA calls.
#pragma once

#include <cuda_runtime.h>
#include <errno.h>  // program_invocation_short_name (glibc)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace cuda_host_timing {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what,
                 cudaGetErrorString(status));
    std::exit(1);
  }
}

using Clock = std::chrono::steady_clock;

inline double elapsed_ns(Clock::time_point start) {
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count();
}

// Host ns per iteration of `body` (called with the iteration's index; best of three rounds of
// `iterations`), the stream drained every 1000 so that a queue filling up never throttles the
// calls measured.
template <typename Body>
double ns_per_call(cudaStream_t stream, int iterations, Body body) {
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    check(cudaStreamSynchronize(stream), "synchronize");
    double total_ns = 0;
    for (int done = 0; done < iterations; done += 1000) {
      const auto start = Clock::now();
      for (int i = 0; i < 1000; ++i) body(done + i);
      total_ns += elapsed_ns(start);
      check(cudaStreamSynchronize(stream), "synchronize");
    }
    best = std::min(best, total_ns / iterations);
  }
  return best;
}

}  // namespace cuda_host_timing
