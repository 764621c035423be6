// One thread's figures in a registry: a shard of slots, one per node, in chunks allocated on
// demand and never moved or freed while the registry lives. Internal to csrc/registry; the
// protocol (single writer, release stores, the seqlock-style renewal after a reset) is described
// at the top of registry.cpp.
#pragma once

#include <atomic>
#include <cstdint>

#include "registry/buckets.h"
#include "registry/registry.h"

namespace brick::registry::detail {

constexpr uint32_t kChunkBits = 6;
constexpr uint32_t kChunkNodes = 1u << kChunkBits;  // slots per chunk
constexpr uint32_t kMaxChunks = 4096;
constexpr uint32_t kMaxNodes = kChunkNodes * kMaxChunks;  // 262144 nodes per registry
constexpr uint64_t kZeroing = UINT64_MAX;                 // a shard generation while zeroing

// One node's figures in one shard. Written by the shard's owner only; read by snapshots.
struct alignas(64) Slot {
  std::atomic<uint64_t> count{0};  // stored last, with release: publishes the record
  std::atomic<int64_t> total_ns{0};
  std::atomic<int64_t> min_ns{0};  // meaningful once count > 0
  std::atomic<int64_t> max_ns{0};
  std::atomic<int64_t> last_ns{0};
  std::atomic<int64_t> last_end_ns{0};     // clock at the last record's completion: orders last_ns
  std::atomic<int64_t> first_start_ns{0};  // the earliest start among its records (end - ns)
  std::atomic<uint64_t> buckets[Histogram::kBuckets]{};

  // Owner only, between its own records. A slot never recorded since it was last zeroed is all
  // zeros already; a recorded one holds counts only in the buckets of its durations, which all
  // lie between the buckets of its min and max: only those are written (a reset after a profile
  // touches a few cache lines per slot, not its whole histogram).
  void zero() noexcept {
    constexpr auto relaxed = std::memory_order_relaxed;
    constexpr auto release = std::memory_order_release;  // see "Memory order" in registry.cpp
    if (count.load(relaxed) == 0) return;
    const int first = bucket_index(min_ns.load(relaxed));
    const int last = bucket_index(max_ns.load(relaxed));
    count.store(0, release);
    total_ns.store(0, release);
    min_ns.store(0, release);
    max_ns.store(0, release);
    last_ns.store(0, release);
    last_end_ns.store(0, release);
    first_start_ns.store(0, release);
    for (int bucket = first; bucket <= last; ++bucket) buckets[bucket].store(0, release);
  }
};

struct Chunk {
  Slot slots[kChunkNodes];
};

struct Shard {
  explicit Shard(uint64_t gen) : generation(gen) {}
  ~Shard() {
    for (auto& chunk : chunks) delete chunk.load(std::memory_order_relaxed);
  }
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  // The registry generation these figures belong to; kZeroing while the owner zeroes them.
  std::atomic<uint64_t> generation;
  // False once the owning thread has exited; an adopting thread sets it back under the
  // registry's shards_mutex.
  std::atomic<bool> owned{true};
  std::atomic<Chunk*> chunks[kMaxChunks]{};

  Slot& slot(NodeId node) noexcept {
    std::atomic<Chunk*>& entry = chunks[node >> kChunkBits];
    Chunk* chunk = entry.load(std::memory_order_relaxed);  // the owner wrote it
    if (chunk == nullptr) [[unlikely]]
      chunk = allocate(entry);
    return chunk->slots[node & (kChunkNodes - 1)];
  }

  [[gnu::noinline]] static Chunk* allocate(std::atomic<Chunk*>& entry) noexcept {
    auto* chunk = new Chunk();  // zeroed; bad_alloc terminates (record is noexcept)
    entry.store(chunk, std::memory_order_release);
    return chunk;
  }

  // Zeroes the figures of a stale generation, adds the records zeroed to `discarded`, and moves
  // the shard to `gen` (owner only).
  [[gnu::noinline]] void renew(uint64_t gen, std::atomic<uint64_t>& discarded) noexcept {
    generation.store(kZeroing, std::memory_order_relaxed);  // ordered by the release stores after
    uint64_t zeroed = 0;
    for (auto& entry : chunks) {
      Chunk* chunk = entry.load(std::memory_order_relaxed);
      if (chunk == nullptr) continue;
      for (Slot& s : chunk->slots) {
        zeroed += s.count.load(std::memory_order_relaxed);
        s.zero();
      }
    }
    // Release: a reader whose load of the total sees this addition also sees kZeroing, so it
    // cannot count these records again from the shard. The new generation is published after
    // it: a reader that sees the shard renewed finds the addition in the total.
    if (zeroed != 0) discarded.fetch_add(zeroed, std::memory_order_release);
    generation.store(gen, std::memory_order_release);
  }

  // The sum of the counts of every slot (any thread; a live shard's sum may race its owner).
  uint64_t recorded() const noexcept {
    uint64_t sum = 0;
    for (const auto& entry : chunks) {
      const Chunk* chunk = entry.load(std::memory_order_acquire);
      if (chunk == nullptr) continue;
      for (const Slot& s : chunk->slots) sum += s.count.load(std::memory_order_acquire);
    }
    return sum;
  }
};

}  // namespace brick::registry::detail
