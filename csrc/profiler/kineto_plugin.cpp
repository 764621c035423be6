// torch.profiler's view of brick: a Kineto child profiler for the PrivateUse1 device.
//
// `torch.profiler.profile(activities=[CPU, PrivateUse1])` runs Kineto in state KINETO_PRIVATEUSE1,
// which configures this profiler's session around each recording window. While it records, the
// device-activity recorder (device_activity.h) observes every kernel and copy brick launches;
// Kineto pushes each CPU op's correlation id on the op's thread, so every launch knows its op.
// At the end the session hands Kineto, per launch:
//   - a runtime activity on the launching thread (PRIVATEUSE1_RUNTIME "brickLaunchKernel" /
//     "brickMemcpy": from when brick started preparing the launch until it was queued), the
//     start of an `ac2g` flow;
//   - the device activity (CONCURRENT_KERNEL / GPU_MEMCPY, "brick::<op>") on its brick
//     device and stream, from the runtime events recorded around the work, the end of that flow;
// both linked to the CPU op, which is what gives key_averages() its Self BRICK / BRICK total.
// A collective of brick's c10d backend ("brickLaunchCollective", then "brick::gloo:all_reduce"
// and so on) lies on its device's "collectives" track, from its enqueue until its engine completed
// it, with its bytes and group size: what trace tools read as communication kernels.
// Timestamps are Unix-epoch nanoseconds, PyTorch's profiler clock.
#include "profiler/kineto_plugin.h"

#if BRICK_HAS_KINETO_PLUGIN

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <array>
#include <charconv>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "profiler/device_activity.h"
#include "profiler/device_timer.h"
#include "runtime/runtime.h"

namespace brick::profiler {

namespace {

using libkineto::ActivityType;

std::atomic<uint64_t> g_sessions_processed{0};
// Per launch, unique in the process, as CUPTI's correlation ids are. Starts at 2^32: HTA (0.5)
// downcasts the column to the smallest integer type that holds its values, then stores row
// numbers in a column of that type, which fails for small ids in a trace of more rows.
std::atomic<uint64_t> g_next_launch_id{uint64_t{1} << 32};
std::atomic<uint64_t> g_activities_emitted{0};
std::atomic<uint64_t> g_activities_unlinked{0};
std::atomic<uint64_t> g_failed{0};
std::atomic<DevicePropertiesSource> g_device_properties{nullptr};

// A launch's row for Kineto, its metadata (the integers trace tools read: HTA pairs a launch with
// its device work by "correlation" and places the work by "stream" and "device") kept as numbers
// and written as JSON when asked. PyTorch asks every activity of the trace for its JSON when the
// trace ends (to find the ones it made itself), and the base class's string map and stringstream
// cost ~10,000 instructions per activity there: most of what brick's rows added to the exit.
class BrickTraceActivity final : public libkineto::GenericTraceActivity {
 public:
  using GenericTraceActivity::GenericTraceActivity;

  void add(const char* key, int64_t value) noexcept {
    if (count_ < entries_.size()) entries_[count_++] = {key, value};
  }

  // As GenericTraceActivity writes it: `"key": value` pairs joined by ", ".
  const std::string metadataJson() const override {
    std::string json;
    json.reserve(24 * count_);
    for (size_t i = 0; i < count_; ++i) {
      if (i > 0) json += ", ";
      json += '"';
      json += entries_[i].first;
      json += "\": ";
      char digits[24];
      const auto written = std::to_chars(digits, digits + sizeof(digits), entries_[i].second);
      json.append(digits, written.ptr);
    }
    return json;
  }

  const std::string getMetadataValue(const std::string& key) const override {
    for (size_t i = 0; i < count_; ++i) {
      if (key == entries_[i].first) return std::to_string(entries_[i].second);
    }
    return "";
  }

 private:
  std::array<std::pair<const char*, int64_t>, 5> entries_{};
  size_t count_ = 0;
};

class BrickActivitySession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    ActivityRecorder::instance().start();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    ActivityRecorder::instance().stop();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  // Kineto writes these into the trace's "deviceProperties", beside CUDA's: viewers (TensorBoard's
  // profiler plugin, HTA) name the device from them.
  std::string getDeviceProperties() override {
    const DevicePropertiesSource source = g_device_properties.load(std::memory_order_acquire);
    return source != nullptr ? source() : std::string();
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(
        logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked_activity, int64_t window_start_ns,
                    int64_t window_end_ns) override {
    CollectedActivities collected = ActivityRecorder::instance().collect();
    g_failed.fetch_add(collected.failed, std::memory_order_relaxed);
    if (collected.capture_skipped > 0) {
      errors_.push_back("brick: " + std::to_string(collected.capture_skipped) +
                        " launches on streams being captured into a CUDA graph were not timed");
    }
    int64_t first = window_start_ns;
    int64_t last = window_end_ns;
    uint32_t flow_id = 0;
    // The device rows' names, made once per op name (launches carry the op's name pointer).
    std::unordered_map<const char*, std::string> device_names;
    for (const DeviceActivity& activity : collected.activities) {
      const libkineto::ITraceActivity* cpu_op =
          activity.correlation != 0 ? linked_activity(static_cast<int32_t>(activity.correlation))
                                    : nullptr;
      if (cpu_op == nullptr) g_activities_unlinked.fetch_add(1, std::memory_order_relaxed);
      ++flow_id;
      const bool is_copy = activity.kind == runtime::LaunchKind::Memcpy;
      const bool is_collective = activity.kind == runtime::LaunchKind::Collective;

      auto& launch = emplace(is_copy         ? "brickMemcpy"
                             : is_collective ? "brickLaunchCollective"
                                             : "brickLaunchKernel",
                             ActivityType::PRIVATEUSE1_RUNTIME);
      launch.startTime = activity.launch_begin_ns;
      launch.endTime = std::max(activity.launch_end_ns, activity.launch_begin_ns);
      launch.device = libkineto::processId();
      launch.resource = static_cast<int32_t>(activity.thread_id);
      launch.threadId = static_cast<int32_t>(activity.thread_id);
      // One id per launch on its runtime row and its device row, as CUPTI's correlation id on
      // cudaLaunchKernel and its kernel: trace tools (HTA) pair the two by it.
      const uint64_t launch_id = g_next_launch_id.fetch_add(1, std::memory_order_relaxed);
      launch.add("correlation", static_cast<int64_t>(launch_id));
      link(launch, activity, cpu_op, flow_id, /*flow_start=*/true);
      logger.handleActivity(launch);

      // Named apart from the CPU op ("brick::aten::mm" beside "aten::mm"): key_averages() groups
      // rows by name, and a device row under the op's own name would read as a second op.
      auto [named, made] = device_names.try_emplace(activity.name);
      if (made) named->second = std::string("brick::") + activity.name;
      auto& work = emplace(named->second,
                           is_copy ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL);
      work.startTime = activity.start_ns;
      work.endTime = activity.end_ns;
      work.device = activity.device;
      work.resource = static_cast<int32_t>(activity.stream);
      work.threadId = static_cast<int32_t>(activity.stream);
      work.add("device", activity.device);
      work.add("stream", activity.stream);
      work.add("correlation", static_cast<int64_t>(launch_id));
      if (is_collective) {
        work.add("bytes", static_cast<int64_t>(activity.bytes));
        work.add("group size", activity.group_size);
      }
      link(work, activity, cpu_op, flow_id, /*flow_start=*/false);
      logger.handleActivity(work);

      streams_.emplace(activity.device, activity.stream);
      first = first == 0 ? activity.launch_begin_ns : std::min(first, activity.launch_begin_ns);
      last = std::max(last, activity.end_ns);
      g_activities_emitted.fetch_add(1, std::memory_order_relaxed);
    }
    buffer_.span = libkineto::TraceSpan(first, last, "brick");
    g_sessions_processed.fetch_add(1, std::memory_order_relaxed);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // Kineto takes one device per session: the first brick device that ran work (its process
    // row is named); the rows of other devices carry their named stream tracks.
    const int device = streams_.empty() ? 0 : streams_.begin()->first;
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, libkineto::kExceedMaxPid + device, "brick",
        "brick:" + std::to_string(device) + " (" + runtime::get().name() + " runtime)"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> resources;
    for (const auto& [device, stream] : streams_) {
      resources.push_back(libkineto::ResourceInfo{
          static_cast<int32_t>(stream), stream, device,
          "brick:" + std::to_string(device) +
              (stream == runtime::kCollectiveStream ? std::string(" collectives")
                                                    : " stream " + std::to_string(stream))});
    }
    return resources;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    auto out = std::make_unique<libkineto::CpuTraceBuffer>();
    out->span = buffer_.span;
    out->gpuOpCount = -1;
    out->activities = std::move(buffer_.activities);
    return out;
  }

  void pushCorrelationId(uint64_t id) override { ActivityRecorder::push_correlation(id); }
  void popCorrelationId() override { ActivityRecorder::pop_correlation(); }

 private:
  BrickTraceActivity& emplace(const std::string& name, ActivityType type) {
    auto activity = std::make_unique<BrickTraceActivity>(buffer_.span, type, name);
    BrickTraceActivity& out = *activity;
    buffer_.activities.push_back(std::move(activity));
    return out;
  }

  static void link(libkineto::GenericTraceActivity& out, const DeviceActivity& activity,
                   const libkineto::ITraceActivity* cpu_op, uint32_t flow_id, bool flow_start) {
    out.id = static_cast<int32_t>(activity.correlation);
    out.linked = cpu_op;
    out.flow.id = flow_id;
    out.flow.type = libkineto::kLinkAsyncCpuGpu;
    out.flow.start = flow_start ? 1 : 0;
  }

  libkineto::CpuTraceBuffer buffer_;
  std::set<std::pair<int, int64_t>> streams_;
  std::vector<std::string> errors_;
};

class BrickActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return types_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& activity_types, const libkineto::Config& /*config*/) override {
    // Kineto configures child profilers for every trace, CPU-only ones too: brick records only
    // when device activity was asked for.
    if (activity_types.count(ActivityType::CONCURRENT_KERNEL) == 0) return nullptr;
    return std::make_unique<BrickActivitySession>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"brick"};
  std::set<ActivityType> types_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                ActivityType::PRIVATEUSE1_RUNTIME};
};

}  // namespace

REGISTER_PRIVATEUSE1_PROFILER(BrickActivityProfiler);

bool kineto_plugin_available() noexcept { return true; }

void set_device_properties_source(DevicePropertiesSource source) noexcept {
  g_device_properties.store(source, std::memory_order_release);
}

KinetoPluginStats kineto_plugin_stats() noexcept {
  return {g_sessions_processed.load(std::memory_order_relaxed),
          g_activities_emitted.load(std::memory_order_relaxed),
          g_activities_unlinked.load(std::memory_order_relaxed),
          capture_skipped(TimingClient::DeviceActivity), g_failed.load(std::memory_order_relaxed)};
}

}  // namespace brick::profiler

#else  // !BRICK_HAS_KINETO_PLUGIN

namespace brick::profiler {

bool kineto_plugin_available() noexcept { return false; }
KinetoPluginStats kineto_plugin_stats() noexcept { return {}; }
void set_device_properties_source(DevicePropertiesSource /*source*/) noexcept {}

}  // namespace brick::profiler

#endif
