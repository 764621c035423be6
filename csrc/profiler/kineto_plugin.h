// torch.profiler's brick device activity (kineto_plugin.cpp): built where this PyTorch has
// Kineto's PrivateUse1 child-profiler registry (2.12 and later; CMake defines
// BRICK_HAS_KINETO_PLUGIN=1 then).
#pragma once

#include <cstdint>
#include <string>

#ifndef BRICK_HAS_KINETO_PLUGIN
#define BRICK_HAS_KINETO_PLUGIN 0
#endif

namespace brick::profiler {

// True when brick registered its Kineto child profiler with this PyTorch.
bool kineto_plugin_available() noexcept;

// Counters since the process started, for health reports and tests.
struct KinetoPluginStats {
  uint64_t sessions_processed = 0;
  uint64_t activities_emitted = 0;
  uint64_t activities_unlinked = 0;  // no CPU op to attach to (it was not profiled)
  uint64_t capture_skipped = 0;      // launches on a stream being captured into a CUDA graph
  uint64_t failed = 0;               // launches whose device times could not be read
};
KinetoPluginStats kineto_plugin_stats() noexcept;

// The brick devices' properties for a trace's "deviceProperties" (JSON objects, comma-separated,
// as Kineto writes CUDA's): the bindings supply them from torch.brick, read when a trace is
// processed. None supplied, none written.
using DevicePropertiesSource = std::string (*)();
void set_device_properties_source(DevicePropertiesSource source) noexcept;

}  // namespace brick::profiler
