// Pinned host memory for the host runtime: `t.pin_memory()`, DataLoader(pin_memory=True).
//
// On CUDA backing pinned memory is page-locked memory from PyTorch's CUDA host allocator (see the
// hooks). On the host runtime the backing device reads host memory directly, so page-locking
// buys nothing (no DMA engine copies it); what users rely on is the contract: pin_memory() gives
// a tensor whose is_pinned() is true, and a copy of it to the device may be non_blocking. Brick
// serves such tensors from this allocator, which knows its blocks so `isPinnedPtr` can answer for
// any address inside one, as cudaPointerGetAttributes does. Pinning is per batch, not per op:
// a lock here costs nothing that matters.
#include "backend/pinned_memory.h"

#include <c10/core/CPUAllocator.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/device_index.h"

namespace brick::backend {

namespace {

std::mutex g_pinned_mutex;
std::map<std::uintptr_t, size_t> g_pinned_blocks;  // start address -> size in bytes

void delete_pinned(void* ctx) {
  auto* memory = static_cast<c10::DataPtr*>(ctx);
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_blocks.erase(reinterpret_cast<std::uintptr_t>(memory->get()));
  }
  delete memory;  // frees through the CPU allocator's own deleter
}

class HostPinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr memory = c10::GetCPUAllocator()->allocate(nbytes);
    void* data = memory.get();
    if (data == nullptr) return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
    {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned_blocks[reinterpret_cast<std::uintptr_t>(data)] = nbytes;
    }
    return c10::DataPtr(data, new c10::DataPtr(std::move(memory)), &delete_pinned,
                        c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    std::memcpy(dst, src, count);
  }
};

HostPinnedAllocator g_host_pinned_allocator;

}  // namespace

c10::Allocator* host_pinned_allocator() { return &g_host_pinned_allocator; }

bool is_host_pinned(const void* data) {
  if (data == nullptr) return false;
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto next = g_pinned_blocks.upper_bound(address);
  if (next == g_pinned_blocks.begin()) return false;
  const auto& [start, nbytes] = *std::prev(next);
  return address < start + nbytes;
}

}  // namespace brick::backend
