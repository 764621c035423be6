// The work tracer on CUDA: CUPTI's activity API (kernels, copies, memsets, and the external
// correlation records that name each call's innermost pushed interval). CUPTI is loaded at run
// time, preferring the copy the process has loaded already (PyTorch's, through Kineto): one
// process must not hold two. Its buffers are handed over on CUPTI's own thread; the records are
// kept in brick's form until drained.
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/cupti_api.h"
#include "runtime/launch_observer.h"
#include "runtime/runtime.h"
#include "runtime/work_tracer.h"

namespace brick::runtime {
namespace {

// Brick's kind of external id: Kineto pushes CUSTOM0 (its ops) and CUSTOM1 (annotations).
constexpr CUpti_ExternalCorrelationKind kBrickIntervals = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;
constexpr size_t kBufferBytes = size_t{4} << 20;
constexpr size_t kBufferAlignment = 8;

// The library, loaded once: the process's own copy when it has one, else BRICK_CUPTI_LIBRARY,
// else the loader's search. Empty `why` on success.
struct LoadedCupti {
  cupti::Api api;
  std::string why;
};

LoadedCupti load_cupti() {
  LoadedCupti loaded;
  const std::string versioned = "libcupti.so." + std::to_string(CUDART_VERSION / 1000);
  void* library = nullptr;
  const char* asked = std::getenv("BRICK_CUPTI_LIBRARY");
  if (asked != nullptr && *asked != '\0') {
    library = dlopen(asked, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      loaded.why = std::string("BRICK_CUPTI_LIBRARY=") + asked + " cannot be loaded: " + dlerror();
      return loaded;
    }
  }
  for (const char* name : {versioned.c_str(), "libcupti.so"}) {
    if (library == nullptr) library = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  }
  for (const char* name : {versioned.c_str(), "libcupti.so"}) {
    if (library == nullptr) library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  }
  if (library == nullptr) {
    loaded.why = "CUPTI (" + versioned +
                 ") is neither loaded in this process nor found by the loader; set "
                 "BRICK_CUPTI_LIBRARY to its path (PyTorch's nvidia packages have one)";
    return loaded;
  }
  if (const char* missing = cupti::resolve_api(library, &loaded.api)) {
    loaded.why = std::string(missing) + " is missing from the CUPTI library";
  }
  return loaded;
}

const LoadedCupti& loaded_cupti() {
  static const LoadedCupti loaded = load_cupti();
  return loaded;
}

std::string result_text(CUptiResult status) {
  const char* text = nullptr;
  if (loaded_cupti().api.result_string != nullptr) loaded_cupti().api.result_string(status, &text);
  return text != nullptr ? text : "CUPTI error " + std::to_string(static_cast<int>(status));
}

// What CUPTI's buffer thread hands over, kept until drained, and CUPTI's buffers for reuse.
struct Inbox {
  std::mutex mutex;
  TracedRecords records;
  std::vector<uint8_t*> free_buffers;
};
// Records held beyond this (work of the process that no resolution drains, say) are dropped,
// and counted.
constexpr size_t kMaxHeldRecords = size_t{1} << 22;

// Brick's launches while tracing, counted through the launch hooks (CUPTI itself sees them all).
std::atomic<uint64_t> g_launches{0};
void count_launch() noexcept { g_launches.fetch_add(1, std::memory_order_relaxed); }
void launch_done() noexcept {}
constexpr LaunchTrace kCountLaunches{&count_launch, &launch_done};
Inbox& inbox() {
  static Inbox* const kept = new Inbox();  // CUPTI may call back during exit
  return *kept;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *max_records = 0;
  {
    std::lock_guard<std::mutex> lock(inbox().mutex);
    if (!inbox().free_buffers.empty()) {
      *buffer = inbox().free_buffers.back();
      inbox().free_buffers.pop_back();
      *size = kBufferBytes;
      return;
    }
  }
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignment, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;  // none: CUPTI drops records, and counts them
}

template <typename Record>
void take_work(const Record& record, TracedRecords& into) {
  const auto start = static_cast<int64_t>(record.start);
  const auto end = static_cast<int64_t>(record.end);
  if (record.start == 0 || end < start) {  // an incomplete record (a forced flush's)
    ++into.dropped;
    return;
  }
  into.work.push_back({record.correlationId, start, end});
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t,
                               size_t valid_bytes) {
  const cupti::Api& api = loaded_cupti().api;
  std::lock_guard<std::mutex> lock(inbox().mutex);
  TracedRecords& into = inbox().records;
  try {
    CUpti_Activity* record = nullptr;
    while (api.next_record(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
      if (into.work.size() + into.calls.size() >= kMaxHeldRecords) [[unlikely]] {
        ++into.dropped;
        continue;
      }
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
          take_work(*reinterpret_cast<const CUpti_ActivityKernel10*>(record), into);
          break;
        case CUPTI_ACTIVITY_KIND_MEMCPY:
          take_work(*reinterpret_cast<const CUpti_ActivityMemcpy6*>(record), into);
          break;
        case CUPTI_ACTIVITY_KIND_MEMSET:
          take_work(*reinterpret_cast<const CUpti_ActivityMemset4*>(record), into);
          break;
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto& external =
              *reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
          if (external.externalKind == kBrickIntervals) {
            into.calls.push_back({external.correlationId, external.externalId});
          }
          break;
        }
        default:  // API records: enabled only so that calls get their external records
          break;
      }
    }
  } catch (...) {  // out of memory: what this buffer held is lost, and counted
    ++into.dropped;
  }
  size_t dropped = 0;
  if (api.dropped_records(context, stream_id, &dropped) == CUPTI_SUCCESS) into.dropped += dropped;
  try {
    inbox().free_buffers.push_back(buffer);
  } catch (...) {
    std::free(buffer);
  }
}

// The kinds traced: the work, the calls' external ids, and the API records those are emitted
// with (the runtime's, and the driver's for kernels launched through it: Triton's).
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET,
                                         CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
                                         CUPTI_ACTIVITY_KIND_RUNTIME,
                                         CUPTI_ACTIVITY_KIND_DRIVER};

class CuptiTracer final : public WorkTracer {
 public:
  const char* name() const noexcept override { return "CUPTI"; }

  void start() override {
    const cupti::Api& api = loaded_cupti().api;
    if (const CUptiResult status = api.register_callbacks(buffer_requested, buffer_completed);
        status != CUPTI_SUCCESS) {
      throw Error("brick: CUPTI's activity buffers cannot be registered: " + result_text(status));
    }
    size_t enabled = 0;
    for (const CUpti_ActivityKind kind : kKinds) {
      if (const CUptiResult status = api.enable(kind); status != CUPTI_SUCCESS) {
        for (size_t i = 0; i < enabled; ++i) api.disable(kKinds[i]);
        throw Error("brick: CUPTI activity kind " + std::to_string(static_cast<int>(kind)) +
                    " cannot be enabled: " + result_text(status) +
                    " (is another CUPTI client, such as torch.profiler with CUDA activities, "
                    "profiling this process?)");
      }
      ++enabled;
    }
    g_launches.store(0, std::memory_order_relaxed);
    set_launch_trace(&kCountLaunches);
  }

  uint64_t launches() const noexcept override { return g_launches.load(std::memory_order_relaxed); }

  void stop() noexcept override {
    set_launch_trace(nullptr);
    for (const CUpti_ActivityKind kind : kKinds) loaded_cupti().api.disable(kind);
  }

  void push(uint64_t interval) noexcept override {
    loaded_cupti().api.push(kBrickIntervals, interval);
  }

  void pop() noexcept override {
    uint64_t popped = 0;
    loaded_cupti().api.pop(kBrickIntervals, &popped);
  }

  void drain(TracedRecords* into) override {
    if (const CUptiResult status = loaded_cupti().api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        status != CUPTI_SUCCESS) {
      throw Error("brick: CUPTI's activity buffers cannot be flushed: " + result_text(status));
    }
    std::lock_guard<std::mutex> lock(inbox().mutex);
    TracedRecords& held = inbox().records;
    if (into->work.empty() && into->calls.empty()) {
      std::swap(into->work, held.work);
      std::swap(into->calls, held.calls);
    } else {
      into->work.insert(into->work.end(), held.work.begin(), held.work.end());
      into->calls.insert(into->calls.end(), held.calls.begin(), held.calls.end());
    }
    into->dropped += held.dropped;
    held.work.clear();
    held.calls.clear();
    held.dropped = 0;
  }
};

}  // namespace

std::unique_ptr<WorkTracer> make_cupti_tracer(std::string* why) {
  if (!loaded_cupti().why.empty()) {
    if (why != nullptr) *why = loaded_cupti().why;
    return nullptr;
  }
  return std::make_unique<CuptiTracer>();
}

}  // namespace brick::runtime
