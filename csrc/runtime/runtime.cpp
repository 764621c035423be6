#include "runtime/runtime.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/thread_state.h"
#include "runtime/work_tracer.h"

namespace brick::runtime {

namespace detail {

namespace {

// Per-thread state of every runtime the thread has used.
thread_local std::vector<std::unique_ptr<ThreadState>> tls_thread_states;
std::atomic<uint64_t> runtime_ids{1};

}  // namespace

[[gnu::tls_model("initial-exec")]] constinit thread_local ThreadState* tls_last_thread_state =
    nullptr;

uint64_t next_runtime_id() noexcept { return runtime_ids.fetch_add(1, std::memory_order_relaxed); }

ThreadState& thread_state_slow(uint64_t owner) {
  for (auto& state : tls_thread_states) {
    if (state->owner == owner) return *(tls_last_thread_state = state.get());
  }
  auto fresh = std::make_unique<ThreadState>();
  fresh->owner = owner;
  tls_thread_states.push_back(std::move(fresh));
  return *(tls_last_thread_state = tls_thread_states.back().get());
}

}  // namespace detail

MemoryTracker::Live MemoryTracker::live() const noexcept {
  const int64_t frees = frees_.load(std::memory_order_acquire);
  const int64_t freed_bytes = freed_bytes_.load(std::memory_order_acquire);
  return {allocated_bytes_made_.load(std::memory_order_acquire) - freed_bytes,
          allocations_made_.load(std::memory_order_acquire) - frees};
}

void MemoryTracker::on_adopt(int64_t nbytes) noexcept {
  on_alloc(nbytes);
  adopted_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
}

void MemoryTracker::on_release_adopted(int64_t nbytes) noexcept {
  adopted_bytes_.fetch_sub(nbytes, std::memory_order_relaxed);
  on_free(nbytes);
}

MemoryStats MemoryTracker::snapshot() const noexcept {
  MemoryStats s;
  const Live now = live();
  s.allocated_bytes = now.bytes;
  s.allocations = now.allocations;
  s.peak_allocated_bytes = peak_allocated_bytes_.load(std::memory_order_relaxed);
  s.peak_allocations = peak_allocations_.load(std::memory_order_relaxed);
  s.total_allocations = allocations_made_.load(std::memory_order_relaxed) -
                        allocations_base_.load(std::memory_order_relaxed);
  s.total_frees =
      frees_.load(std::memory_order_relaxed) - frees_base_.load(std::memory_order_relaxed);
  s.allocated_bytes_total = allocated_bytes_made_.load(std::memory_order_relaxed) -
                            allocated_bytes_base_.load(std::memory_order_relaxed);
  s.freed_bytes_total = freed_bytes_.load(std::memory_order_relaxed) -
                        freed_bytes_base_.load(std::memory_order_relaxed);
  // Read apart from the live bytes: an allocation racing the snapshot may show in one and not
  // the other (as in any figure of a snapshot taken while other threads allocate).
  s.adopted_bytes =
      std::clamp<int64_t>(adopted_bytes_.load(std::memory_order_relaxed), 0, now.bytes);
  return s;
}

void MemoryTracker::reset_peak() noexcept {
  const Live now = live();
  peak_allocated_bytes_.store(now.bytes, std::memory_order_relaxed);
  peak_allocations_.store(now.allocations, std::memory_order_relaxed);
}

void MemoryTracker::reset_accumulated() noexcept {
  // The totals restart from zero; the live figures, derived from the same counters, do not move.
  allocations_base_.store(allocations_made_.load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
  frees_base_.store(frees_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  allocated_bytes_base_.store(allocated_bytes_made_.load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
  freed_bytes_base_.store(freed_bytes_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

DeviceIndex Runtime::current_device_slow() const noexcept { return detail::current_device_of(id_); }

void Runtime::throw_device_out_of_range(DeviceIndex device) const {
  const int count = device_count();
  throw Error("brick: device index " + std::to_string(device) + " is out of range: this " + name() +
              " runtime has " + std::to_string(count) + " brick device(s), valid indices are 0.." +
              std::to_string(count - 1));
}

void Runtime::check_copy(void* dst, DeviceIndex dst_device, const void* src, DeviceIndex src_device,
                         size_t nbytes) const {
  if (src_device >= 0) check_device(src_device);
  if (dst_device < 0) {
    throw Error("brick: copy: the destination must be brick memory (a brick device index), got " +
                std::to_string(dst_device));
  }
  check_device(dst_device);
  if (src_device >= 0 && src_device != dst_device) {
    throw Error("brick: copy from brick:" + std::to_string(src_device) +
                " to brick:" + std::to_string(dst_device) +
                ": the runtime copies within one brick device or from host memory (source "
                "device -1); copies between devices run as backing-device kernels");
  }
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  if (nbytes != 0 && d < s + nbytes && s < d + nbytes) {
    throw Error("brick: copy of " + std::to_string(nbytes) +
                " bytes on brick:" + std::to_string(dst_device) +
                ": the source and destination ranges overlap; they must be disjoint");
  }
}

MemoryStats Runtime::memory_stats(DeviceIndex device) const {
  check_device(device);
  return trackers_[device].snapshot();
}

void Runtime::reset_peak_memory_stats(DeviceIndex device) {
  check_device(device);
  trackers_[device].reset_peak();
}

void Runtime::reset_accumulated_memory_stats(DeviceIndex device) {
  check_device(device);
  trackers_[device].reset_accumulated();
}

void Runtime::record_adopted(DeviceIndex device, size_t nbytes) noexcept {
  trackers_[device].on_adopt(static_cast<int64_t>(nbytes));
}

void Runtime::release_adopted(DeviceIndex device, size_t nbytes) noexcept {
  trackers_[device].on_release_adopted(static_cast<int64_t>(nbytes));
}

int host_device_count_from_env() {
  const char* text = std::getenv("BRICK_HOST_DEVICES");
  if (text == nullptr || *text == '\0') return 2;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 1 || value > kMaxDevices) {
    throw Error(std::string("brick: BRICK_HOST_DEVICES='") + text +
                "' is not valid: expected an integer from 1 to " + std::to_string(kMaxDevices));
  }
  return static_cast<int>(value);
}

HostCompletion host_completion_from_env() {
  const char* text = std::getenv("BRICK_HOST_COMPLETION");
  if (text == nullptr || *text == '\0' || std::string(text) == "immediate") {
    return HostCompletion::Immediate;
  }
  if (std::string(text) == "deferred") return HostCompletion::Deferred;
  throw Error(std::string("brick: BRICK_HOST_COMPLETION='") + text +
              "' is not valid: expected 'immediate' (the default) or 'deferred'");
}

namespace {

// Set by the layer above; read when a runtime is chosen.
std::atomic<CudaBackingCheck> g_cuda_backing_check{nullptr};

// Why the layer above cannot run CUDA kernels, or empty when it can.
std::string cuda_backing_refusal() {
  const CudaBackingCheck check = g_cuda_backing_check.load(std::memory_order_acquire);
  if (check == nullptr) return {};
  const std::optional<std::string> reason = check();
  if (!reason) return {};
  return reason->empty() ? "CUDA backing was disallowed by the layer above the runtime" : *reason;
}

#if BRICK_WITH_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

// An error message without its "brick: " prefix, for quoting inside another message.
std::string without_prefix(const char* message) {
  const std::string text = message;
  constexpr std::string_view kPrefix = "brick: ";
  return text.starts_with(kPrefix) ? text.substr(kPrefix.size()) : text;
}

struct Chosen {
  Runtime* runtime;
  std::string note;
};

std::atomic<int> g_created_in_pid{-1};

// In a child forked after a CUDA runtime was created: CUDA cannot be used there, so the runtime
// is replaced by one that refuses every device call with a clear error (the parent's is leaked:
// its contexts do not exist in the child).
void refuse_cuda_in_forked_child() {
  Runtime* parent = detail::g_runtime.load(std::memory_order_acquire);
  if (parent == nullptr || parent->backing_kind() != BackingKind::Cuda) return;
  detail::g_runtime.store(make_forked_child_runtime(*parent).release(), std::memory_order_release);
}

Chosen& chosen() {
  // Leaked on purpose: tensors freed during interpreter shutdown still call into the runtime.
  static Chosen* instance = [] {
    RuntimeChoice choice = make_runtime_from_env();
    auto* made = new Chosen{choice.runtime.release(), std::move(choice.note)};
    g_created_in_pid.store(static_cast<int>(getpid()), std::memory_order_release);
    detail::g_runtime.store(made->runtime, std::memory_order_release);
    if (made->runtime->backing_kind() == BackingKind::Cuda) {
      (void)pthread_atfork(nullptr, nullptr, &refuse_cuda_in_forked_child);
    }
    return made;
  }();
  return *instance;
}

}  // namespace

RuntimeChoice make_runtime_from_env() {
  const char* variable = std::getenv("BRICK_RUNTIME");
  const std::string wanted = variable == nullptr || *variable == '\0' ? "auto" : variable;
  if (wanted != "auto" && wanted != "host" && wanted != "cuda") {
    throw Error("brick: BRICK_RUNTIME='" + wanted +
                "' is not valid: expected 'auto' (the default), 'host' or 'cuda'");
  }
  if (wanted == "host") {
    return {make_host_runtime(host_device_count_from_env(), host_completion_from_env()),
            "BRICK_RUNTIME=host chose the host runtime"};
  }

  // Why the CUDA runtime cannot be had, or empty when it can.
  std::string unavailable = cuda_backing_refusal();
  if (unavailable.empty()) {
    std::string why;
    if (!cuda_runtime_usable(&why)) unavailable = kBuiltWithCuda ? "no GPU is usable: " + why : why;
  }
  if (unavailable.empty()) {
    try {
      std::unique_ptr<Runtime> cuda = make_cuda_runtime();
      std::string note = "BRICK_RUNTIME=" + wanted + " chose the cuda runtime (" +
                         std::to_string(cuda->device_count()) + " CUDA device(s))";
      return {std::move(cuda), std::move(note)};
    } catch (const Error& error) {
      unavailable = "the CUDA runtime failed to start: " + without_prefix(error.what());
    }
  }
  if (wanted == "cuda") {
    throw Error("brick: BRICK_RUNTIME=cuda was asked for but " + unavailable +
                "; unset it or use BRICK_RUNTIME=host");
  }
  return {make_host_runtime(host_device_count_from_env(), host_completion_from_env()),
          "BRICK_RUNTIME=auto chose the host runtime because " + unavailable};
}

namespace detail {
std::atomic<Runtime*> g_runtime{nullptr};
Runtime& create_runtime() { return *chosen().runtime; }
}  // namespace detail

void set_cuda_backing_check(CudaBackingCheck check) {
  g_cuda_backing_check.store(check, std::memory_order_release);
}

int runtime_created_in_pid() noexcept { return g_created_in_pid.load(std::memory_order_acquire); }

void validate_runtime_environment() {
  const char* variable = std::getenv("BRICK_RUNTIME");
  const std::string wanted = variable == nullptr || *variable == '\0' ? "auto" : variable;
  if (wanted != "auto" && wanted != "host" && wanted != "cuda") {
    throw Error("brick: BRICK_RUNTIME='" + wanted +
                "' is not valid: expected 'auto' (the default), 'host' or 'cuda'");
  }
  (void)host_device_count_from_env();
  (void)host_completion_from_env();
}

const std::string& runtime_choice_note() { return chosen().note; }

#if !BRICK_WITH_CUDA
namespace {
constexpr const char* kNoCudaInThisBuild =
    "this build of torch_brickdev has no CUDA runtime (built without the CUDA toolkit)";
}  // namespace

std::unique_ptr<Runtime> make_cuda_runtime() {
  throw Error(std::string("brick: cannot create the CUDA runtime: ") + kNoCudaInThisBuild);
}

bool cuda_runtime_usable(std::string* why) {
  if (why != nullptr) *why = kNoCudaInThisBuild;
  return false;
}

std::unique_ptr<WorkTracer> make_cupti_tracer(std::string* why) {
  if (why != nullptr) *why = kNoCudaInThisBuild;
  return nullptr;
}
#endif

}  // namespace brick::runtime
