// Brick memory: the allocator behind brick storages and backing aliases, adopted backing-device
// allocations, statistics and memory info (allocator.h).
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <new>
#include <string>
#include <string_view>

// torch.accelerator's memory API (2.9+) asks the device's allocator for these figures.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#include <c10/core/CachingDeviceAllocator.h>
#define BRICK_HAS_DEVICE_ALLOCATOR 1
#else
#define BRICK_HAS_DEVICE_ALLOCATOR 0
#endif

#include "backend/allocator.h"
#include "backend/backing.h"
#include "backend/device_index.h"
#include "backend/errors.h"
#include "common/hot_path.h"
#include "runtime/launch_observer.h"
#include "runtime/per_thread.h"

namespace brick::backend {

namespace {

// Memory events for PyTorch's profiler (profile_memory=True). Off the hot path: while no
// profiler records memory, an allocation or a free pays one test.
[[gnu::noinline, gnu::cold]] void report_usage(void* ptr, int64_t delta, c10::DeviceIndex device) {
  const auto stats = rt().memory_stats(device);
  c10::reportMemoryUsageToProfiler(ptr, delta, static_cast<size_t>(stats.allocated_bytes),
                                   static_cast<size_t>(stats.allocated_bytes),
                                   c10::Device(kBrick, device));
}

inline void report_to_profiler(void* ptr, int64_t delta, c10::DeviceIndex device) {
  if (c10::memoryProfilingEnabled()) [[unlikely]]
    report_usage(ptr, delta, device);
}

BRICK_HOT_PATH void delete_brick_memory(void* ptr) {
  const auto released = rt().deallocate(ptr);
  if (released.device >= 0) {
    report_to_profiler(ptr, -static_cast<int64_t>(released.nbytes),
                       static_cast<c10::DeviceIndex>(released.device));
  }
}

[[gnu::noinline]] c10::DataPtr allocate_cuda_memory(size_t nbytes, c10::DeviceIndex device,
                                                    c10::Device label);

// The host runtime's allocation, its failure raised as PyTorch's out-of-memory error.
void* allocate_host_memory(c10::DeviceIndex device, size_t nbytes) {
  try {
    return rt().allocate(device, nbytes);
  } catch (const runtime::Error& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  }
}

// Brick memory on the current brick device, labelled `label`'s type (brick for brick storages,
// the backing device for backing aliases' storages).
BRICK_HOT_PATH c10::DataPtr allocate_brick_memory(size_t nbytes, c10::DeviceType label) {
  runtime::count_device_work();  // an op that allocates brick memory ran brick work
  const auto device = static_cast<c10::DeviceIndex>(rt().current_device());
  if (cuda_backing()) [[unlikely]]
    return allocate_cuda_memory(nbytes, device, c10::Device(label));
  void* ptr = allocate_host_memory(device, nbytes);
  if (ptr != nullptr) report_to_profiler(ptr, static_cast<int64_t>(nbytes), device);
  return {ptr, ptr, &delete_brick_memory,
          label == kBrick ? c10::Device(kBrick, device) : c10::Device(c10::DeviceType::CPU)};
}

#if BRICK_HAS_DEVICE_ALLOCATOR
using BrickAllocatorBase = c10::DeviceAllocator;
#else
using BrickAllocatorBase = c10::Allocator;
#endif

class BrickAllocator final : public BrickAllocatorBase {
 public:
  BRICK_HOT_PATH c10::DataPtr allocate(size_t nbytes) override {
    return allocate_brick_memory(nbytes, kBrick);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    // On CUDA backing the memory is PyTorch's CUDA allocator's, behind an adopting context:
    // no raw (context-free) deleter exists for it.
    return cuda_backing() ? nullptr : &delete_brick_memory;
  }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    const int device = rt().current_device();
    BRICK_RUNTIME_CALL(rt().copy(dst, device, src, device, count));
  }

#if BRICK_HAS_DEVICE_ALLOCATOR
  bool initialized() override { return runtime::runtime_created_in_pid() != -1; }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override { empty_brick_cache(); }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    record_stream_use(ptr, stream.device_index(), stream.id());
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    BRICK_RUNTIME_CALL(rt().reset_accumulated_memory_stats(resolve_device_index(device)));
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    BRICK_RUNTIME_CALL(rt().reset_peak_memory_stats(resolve_device_index(device)));
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    return brick_memory_info(resolve_device_index(device));
  }
#endif
};

#if BRICK_HAS_DEVICE_ALLOCATOR
// torch.cuda's statistics, from brick's own accounting: brick holds no cache of its own, so
// what is allocated is what is active, requested and (on the host runtime) reserved. On CUDA
// backing the reserved figures are those of PyTorch's CUDA caching allocator for the GPU, which
// brick and plain cuda tensors share.
c10::CachingDeviceAllocator::DeviceStats BrickAllocator::getDeviceStats(c10::DeviceIndex device) {
  using c10::CachingDeviceAllocator::Stat;
  using c10::CachingDeviceAllocator::StatType;
  const auto index = resolve_device_index(device);
  const auto stats = runtime_call([&] { return rt().memory_stats(index); });
  const auto aggregate = static_cast<size_t>(StatType::AGGREGATE);
  const auto set = [&](Stat& stat, int64_t current, int64_t peak, int64_t allocated,
                       int64_t freed) {
    stat.current = current;
    stat.peak = peak;
    stat.allocated = allocated;
    stat.freed = freed;
  };
  c10::CachingDeviceAllocator::DeviceStats out;
  set(out.allocation[aggregate], stats.allocations, stats.peak_allocations, stats.total_allocations,
      stats.total_frees);
  set(out.allocated_bytes[aggregate], stats.allocated_bytes, stats.peak_allocated_bytes,
      stats.allocated_bytes_total, stats.freed_bytes_total);
  out.active[aggregate] = out.allocation[aggregate];
  out.active_bytes[aggregate] = out.allocated_bytes[aggregate];
  out.requested_bytes[aggregate] = out.allocated_bytes[aggregate];
  if (cuda_backing()) {
    const auto cuda = c10::getDeviceAllocator(c10::DeviceType::CUDA)
                          ->getDeviceStats(backing_device(index).index());
    out.segment = cuda.segment;
    out.reserved_bytes = cuda.reserved_bytes;
    out.num_alloc_retries = cuda.num_alloc_retries;
    out.num_ooms = cuda.num_ooms;
  } else {
    out.segment[aggregate] = out.allocation[aggregate];
    out.reserved_bytes[aggregate] = out.allocated_bytes[aggregate];
  }
  return out;
}
#endif

// Backs the storages of backing aliases, so that a backing-device kernel that grows an out=
// argument allocates brick memory, which the fallback then hands to the brick tensor.
class AliasAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_brick_memory(nbytes, backing_device_type());
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return cuda_backing() ? nullptr : &delete_brick_memory;
  }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    const int device = rt().current_device();
    BRICK_RUNTIME_CALL(rt().copy(dst, device, src, device, count));
  }
};

BrickAllocator g_brick_allocator_object;
AliasAllocator g_alias_allocator;

struct AdoptedContext {
  c10::DataPtr original;
  size_t nbytes;
  c10::DeviceIndex device;
};

// Every op result gets an AdoptedContext, and most die soon after on the same thread: a few
// freed ones are kept per thread for the next results, sparing the heap an allocation and a free
// per op. A context freed on another thread joins that thread's cache.
struct AdoptedContextCache {
  static constexpr size_t kCapacity = 32;
  std::array<void*, kCapacity> free_blocks{};
  size_t count = 0;
  ~AdoptedContextCache() {
    for (size_t i = 0; i < count; ++i) ::operator delete(free_blocks[i]);
  }
};
using ContextCache = runtime::PerThread<AdoptedContextCache>;

BRICK_HOT_PATH AdoptedContext* new_adopted_context(c10::DataPtr original, size_t nbytes,
                                                   c10::DeviceIndex device) {
  AdoptedContextCache* cache = ContextCache::get();  // none after thread exit: the heap
  void* block = cache != nullptr && cache->count > 0 ? cache->free_blocks[--cache->count]
                                                     : ::operator new(sizeof(AdoptedContext));
  return new (block) AdoptedContext{std::move(original), nbytes, device};
}

BRICK_HOT_PATH void delete_adopted(void* ctx) {
  auto* adopted = static_cast<AdoptedContext*>(ctx);
  report_to_profiler(adopted->original.get(), -static_cast<int64_t>(adopted->nbytes),
                     adopted->device);
  rt().release_adopted(adopted->device, adopted->nbytes);
  adopted->~AdoptedContext();  // frees the memory through the backing allocator's own deleter
  AdoptedContextCache* cache = ContextCache::get_if_made();
  if (cache != nullptr && cache->count < AdoptedContextCache::kCapacity) {
    cache->free_blocks[cache->count++] = adopted;
  } else {
    ::operator delete(adopted);
  }
}

}  // namespace

namespace detail {
c10::Allocator* const g_brick_allocator = &g_brick_allocator_object;
}  // namespace detail

c10::Allocator* backing_alias_allocator() { return &g_alias_allocator; }

void empty_brick_cache() {
#if BRICK_HAS_DEVICE_ALLOCATOR
  if (cuda_backing()) c10::getDeviceAllocator(c10::DeviceType::CUDA)->emptyCache();
#endif
}

std::pair<size_t, size_t> brick_memory_info(c10::DeviceIndex device) {
  check_device_index(device, "mem_get_info");
  if (cuda_backing()) {
#if BRICK_HAS_DEVICE_ALLOCATOR
    BackingScope scope(device);
    return c10::getDeviceAllocator(c10::DeviceType::CUDA)
        ->getMemoryInfo(backing_device(device).index());
#else
    TORCH_CHECK(false, "brick: mem_get_info on CUDA backing needs PyTorch 2.9 or later");
#endif
  }
  // The host runtime's memory is the machine's: what Linux says a new allocation can get
  // without swapping (MemAvailable: free pages plus reclaimable cache), of all physical memory.
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t total = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page;
  size_t available = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  constexpr std::string_view kKey = "MemAvailable:";
  while (std::getline(meminfo, line)) {
    if (line.compare(0, kKey.size(), kKey) == 0) {
      available = static_cast<size_t>(std::stoull(line.substr(kKey.size()))) * 1024;  // kB
      break;
    }
  }
  return {available, total};
}

bool is_brick_allocation(const c10::DataPtr& data_ptr) {
  return data_ptr.get_deleter() == &delete_brick_memory ||
         data_ptr.get_deleter() == &delete_adopted;
}

void record_stream_use(const c10::DataPtr& data_ptr, c10::DeviceIndex device,
                       runtime::StreamId stream) {
  if (data_ptr.get() == nullptr) return;
  if (data_ptr.get_deleter() == &delete_brick_memory) {
    BRICK_RUNTIME_CALL(rt().record_stream(data_ptr.get(), device, stream));
  } else if (data_ptr.get_deleter() == &delete_adopted) {
    // Memory of the backing device's own allocator: its record_stream, on the backing stream.
    const auto* adopted = static_cast<const AdoptedContext*>(data_ptr.get_context());
    if (cuda_backing()) {
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
          ->recordDataPtrOnStream(adopted->original, backing_cuda_stream(device, stream));
    }
  }
  // The host runtime completes every op before it returns: nothing to wait for.
}

c10::DataPtr adopt_data_ptr(c10::DataPtr original, size_t nbytes, c10::DeviceIndex device) {
  void* data = original.get();
  if (data == nullptr) return c10::DataPtr(nullptr, c10::Device(kBrick, device));
  auto* ctx = new_adopted_context(std::move(original), nbytes, device);
  rt().record_adopted(device, nbytes);
  report_to_profiler(data, static_cast<int64_t>(nbytes), device);
  return c10::DataPtr(data, ctx, &delete_adopted, c10::Device(kBrick, device));
}

namespace {

// On CUDA backing, brick memory comes from PyTorch's CUDA caching allocator, on the CUDA stream
// behind brick's current stream: the pool op results come from too, so the two never hoard
// memory from each other, and what graph capture, record_stream and torch.cuda's OOM handling
// know applies to all of it. It is adopted: counted in brick's statistics, labelled brick.
[[gnu::noinline]] c10::DataPtr allocate_cuda_memory(size_t nbytes, c10::DeviceIndex device,
                                                    c10::Device label) {
  c10::DataPtr memory;
  {
    BackingScope scope(device);
    memory = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(nbytes);
  }
  c10::DataPtr brick = adopt_data_ptr(std::move(memory), nbytes, device);
  if (label.type() != kBrick) brick.unsafe_set_device(backing_device(device));
  return brick;
}

}  // namespace

BRICK_HOT_PATH c10::DataPtr to_brick_data_ptr(c10::DataPtr data_ptr, size_t nbytes,
                                              c10::DeviceIndex device) {
  if (is_brick_allocation(data_ptr)) {
    data_ptr.unsafe_set_device(c10::Device(kBrick, device));
    return data_ptr;
  }
  return adopt_data_ptr(std::move(data_ptr), nbytes, device);
}

void resize_brick_storage_bytes(const c10::Storage& storage, size_t new_nbytes) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "brick: trying to resize storage that is not resizable");
  const size_t old_nbytes = impl->nbytes();
  if (new_nbytes == old_nbytes) return;
  const int device = impl->device().index();
  c10::DataPtr fresh;
  {
    DeviceScope scope(device);
    fresh = g_brick_allocator_object.allocate(new_nbytes);
  }
  const size_t common = std::min(old_nbytes, new_nbytes);
  if (common > 0) {
    BRICK_RUNTIME_CALL(rt().copy(fresh.get(), device, impl->data_ptr().get(), device, common));
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(new_nbytes);
}

}  // namespace brick::backend
