// Brick memory: the allocator behind every brick storage, backing-device allocations adopted as
// brick memory without a copy, and their statistics.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <cstddef>
#include <utility>

#include "runtime/runtime.h"

namespace brick::backend {

namespace detail {
extern c10::Allocator* const g_brick_allocator;
}  // namespace detail
// The allocator behind every brick storage. Reports to PyTorch's memory profiler. Inline: each
// op result asks.
inline c10::Allocator* brick_allocator() { return detail::g_brick_allocator; }
// The allocator behind backing aliases' storages (backing_alias.h): a backing-device kernel that
// grows an out= argument gets brick memory from it, labelled as the backing device's.
c10::Allocator* backing_alias_allocator();
// Brick memory: from brick's allocator, or adopted.
bool is_brick_allocation(const c10::DataPtr& data_ptr);

// Frees what brick's allocator caches: nothing on the host runtime (allocations are returned to
// the system when freed); PyTorch's CUDA caching allocator's unused blocks on CUDA backing.
void empty_brick_cache();
// (free, total) bytes of the memory behind brick device `device`: the host's physical memory on
// the host runtime, the GPU's on CUDA backing.
std::pair<size_t, size_t> brick_memory_info(c10::DeviceIndex device);

// Brick memory `data_ptr` is used by work queued on `stream` of brick `device`: its free waits
// for that work (record_stream). Memory of any other kind is left alone.
void record_stream_use(const c10::DataPtr& data_ptr, c10::DeviceIndex device,
                       runtime::StreamId stream);

// Turns a DataPtr allocated by the backing device's allocator into brick memory without copying:
// relabels its device and counts its bytes in brick's statistics until it is freed.
c10::DataPtr adopt_data_ptr(c10::DataPtr original, size_t nbytes, c10::DeviceIndex device);

// Relabels brick memory (brick allocator or adopted) as belonging to `device`; anything else is
// adopted first.
c10::DataPtr to_brick_data_ptr(c10::DataPtr data_ptr, size_t nbytes, c10::DeviceIndex device);

// Resizes a brick storage to `new_nbytes`, keeping the common prefix of its bytes.
void resize_brick_storage_bytes(const c10::Storage& storage, size_t new_nbytes);

}  // namespace brick::backend
