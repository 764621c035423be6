#include "runtime/runtime.h"

#include <cstdlib>
#include <mutex>
#include <string>

namespace brick::runtime {

namespace {

void raise_max(std::atomic<int64_t>& peak, int64_t value) noexcept {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

void MemoryTracker::bump_peaks() noexcept {
  raise_max(peak_allocated_bytes_, allocated_bytes_.load(std::memory_order_relaxed));
  raise_max(peak_allocations_, allocations_.load(std::memory_order_relaxed));
}

void MemoryTracker::on_alloc(int64_t nbytes) noexcept {
  allocated_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
  allocations_.fetch_add(1, std::memory_order_relaxed);
  total_allocations_.fetch_add(1, std::memory_order_relaxed);
  allocated_bytes_total_.fetch_add(nbytes, std::memory_order_relaxed);
  bump_peaks();
}

void MemoryTracker::on_free(int64_t nbytes) noexcept {
  allocated_bytes_.fetch_sub(nbytes, std::memory_order_relaxed);
  allocations_.fetch_sub(1, std::memory_order_relaxed);
  total_frees_.fetch_add(1, std::memory_order_relaxed);
  freed_bytes_total_.fetch_add(nbytes, std::memory_order_relaxed);
}

void MemoryTracker::on_adopt(int64_t nbytes) noexcept {
  adopted_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
  on_alloc(nbytes);
}

void MemoryTracker::on_release_adopted(int64_t nbytes) noexcept {
  adopted_bytes_.fetch_sub(nbytes, std::memory_order_relaxed);
  on_free(nbytes);
}

MemoryStats MemoryTracker::snapshot() const noexcept {
  MemoryStats s;
  s.allocated_bytes = allocated_bytes_.load(std::memory_order_relaxed);
  s.peak_allocated_bytes = peak_allocated_bytes_.load(std::memory_order_relaxed);
  s.allocations = allocations_.load(std::memory_order_relaxed);
  s.peak_allocations = peak_allocations_.load(std::memory_order_relaxed);
  s.total_allocations = total_allocations_.load(std::memory_order_relaxed);
  s.total_frees = total_frees_.load(std::memory_order_relaxed);
  s.allocated_bytes_total = allocated_bytes_total_.load(std::memory_order_relaxed);
  s.freed_bytes_total = freed_bytes_total_.load(std::memory_order_relaxed);
  s.adopted_bytes = adopted_bytes_.load(std::memory_order_relaxed);
  return s;
}

void MemoryTracker::reset_peak() noexcept {
  peak_allocated_bytes_.store(allocated_bytes_.load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
  peak_allocations_.store(allocations_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void Runtime::check_device(DeviceIndex device) const {
  const int count = device_count();
  if (device < 0 || device >= count) {
    throw Error("brick: device index " + std::to_string(device) + " is out of range: this " +
                name() + " runtime has " + std::to_string(count) +
                " brick device(s), valid indices are 0.." + std::to_string(count - 1));
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

const char* backing_kind_name(BackingKind kind) noexcept {
  switch (kind) {
    case BackingKind::Host:
      return "host";
    case BackingKind::Cuda:
      return "cuda";
  }
  return "unknown";
}

Runtime& get() {
  // Leaked on purpose: tensors freed during interpreter shutdown still call into it.
  static Runtime* instance = [] {
    const char* choice = std::getenv("BRICK_RUNTIME");
    const std::string wanted = choice == nullptr || *choice == '\0' ? "auto" : choice;
    if (wanted != "auto" && wanted != "host") {
      throw Error("brick: BRICK_RUNTIME='" + wanted +
                  "' is not supported by this build: expected 'auto' or 'host'");
    }
    return make_host_runtime(host_device_count_from_env()).release();
  }();
  return *instance;
}

}  // namespace brick::runtime
