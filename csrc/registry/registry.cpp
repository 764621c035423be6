// The brick registry: interned call-tree nodes, lock-free per-thread shards, merged snapshots.
//
// Layout
//   Registry::Impl holds the node table (under nodes_mutex) and the list of shards (under
//   shards_mutex). A shard belongs to one thread at a time and holds that thread's figures for
//   every node it recorded, in chunks of kChunkNodes slots that are allocated on demand and never
//   moved or freed while the registry lives, so a snapshot can read them concurrently.
//
// Concurrency
//   Single writer per shard: the owning thread updates its slots with plain loads and stores (no
//   read-modify-write) and publishes each record by storing the slot's count last; a snapshot
//   loads the count first, so a count it sees is backed by the figures of at least that many
//   records (a live snapshot's other figures may also include records completed while it read
//   the slot; once recording stops, snapshots are exact). Counts only grow between resets, so
//   successive snapshots see non-decreasing counts.
//
// Memory order
//   The owner loads its own figures relaxed and stores every figure with release; snapshots load
//   them with acquire. On x86 both are plain moves. Release stores order the owner's earlier
//   writes (in particular the kZeroing marker below) before each figure, so a snapshot that
//   reads any figure written after a zeroing began also sees the marker: a seqlock without
//   standalone fences (which ThreadSanitizer does not model).
//
// Reset
//   reset() bumps the registry generation. A shard whose generation is stale is ignored by
//   snapshots; its owner zeroes it on its next record (a seqlock-style write: the shard's
//   generation is first set to kZeroing, so a snapshot that overlapped the zeroing discards the
//   shard). A record racing a reset either lands in the new generation or stays in the stale
//   one, to be zeroed: never counted twice.
//
// Accounting for resets
//   Nothing is lost silently: a slot's count only ever drops to zero in renew(), which first
//   adds the counts it zeroes to Impl::discarded_by_renewal (one read-modify-write per renewal,
//   off the fast path), and only then publishes the new generation. The records a reset has
//   discarded are that total plus the counts still held by stale shards whose owner has not
//   recorded since (an idle thread, or an exited one whose shard nobody adopted).
//   discarded_by_reset() reads both under shards_mutex, which holds reset() off, so the
//   generation is fixed and renewals run out. It retries until a pass sees no renewal in
//   progress and the same total before and after (a seqlock read over the whole registry), so
//   each renewal's counts are taken once: from the total or from the stale shard. Hence, once
//   recording stops: records made == the counts of a snapshot + discarded_by_reset().
//
// Thread-local lookup
//   Each thread keeps (registry id -> shard) entries; registry ids come from a global counter and
//   are never reused, unlike addresses. The last used entry is cached in a trivially
//   destructible thread_local, the fast path. A thread that exits gives its shards back (they
//   keep their figures); the next thread that first records into that registry adopts one
//   (common/thread_claims.h).
#include "registry/registry.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "common/steady_clock.h"
#include "common/thread_claims.h"
#include "registry/buckets.h"
#include "registry/clock.h"
#include "registry/shard.h"

namespace brick::registry {

using detail::bucket_index;
using detail::clock_now;

namespace {

using detail::Chunk;
using detail::kChunkNodes;
using detail::kMaxNodes;
using detail::kZeroing;
using detail::Shard;
using detail::Slot;

std::atomic<uint64_t> g_next_registry_id{1};

// Each thread records into its own shard of each registry (common/thread_claims.h).
using ShardClaims = ThreadClaims<Shard>;

struct NodeInfo {
  std::string name;
  std::string path;
  NodeId parent;
  int depth;
  Kind kind;
  int device;
};

// A node is a name of a kind under a parent on a device: the same op on two devices is two
// bricks, and so are an op's calls on brick and on the host (Kind::Host).
struct NodeKeyView {
  NodeId parent;
  int device;
  Kind kind;
  std::string_view name;
};

struct NodeKey {
  NodeId parent;
  int device;
  Kind kind;
  std::string name;
  operator NodeKeyView() const noexcept { return {parent, device, kind, name}; }
};

struct NodeKeyHash {
  using is_transparent = void;
  size_t operator()(const NodeKeyView& key) const noexcept {
    return ((std::hash<std::string_view>{}(key.name) * 31 + key.parent) * 31 +
            static_cast<size_t>(key.device)) *
               31 +
           static_cast<size_t>(key.kind);
  }
};

struct NodeKeyEqual {
  using is_transparent = void;
  bool operator()(const NodeKeyView& a, const NodeKeyView& b) const noexcept {
    return a.parent == b.parent && a.device == b.device && a.kind == b.kind && a.name == b.name;
  }
};

// One node's figures read from one shard by a snapshot.
struct SlotCopy {
  NodeId node;
  uint64_t count;
  int64_t total_ns, min_ns, max_ns, last_ns, last_end_ns, first_start_ns;
  int first_bucket, last_bucket;  // the buckets of min_ns and max_ns: the only ones with counts
  Histogram histogram;
};

// What a snapshot reads: the shards at its start, the generation a shard must be at to count
// (older ones are stale: reset since their owner last recorded), and the nodes interned by then.
struct ShardsToRead {
  std::vector<std::shared_ptr<Shard>> shards;
  uint64_t generation;
  uint32_t nodes;
  uint32_t chunks() const { return (nodes + kChunkNodes - 1) / kChunkNodes; }
};

// The recorded slots of the current shards, counted to size a snapshot's vectors (more may be
// recorded meanwhile: they then grow). Histograms are large (kBuckets counts each).
struct RecordedSlots {
  size_t total = 0;
  size_t most_in_a_shard = 0;
};

RecordedSlots count_recorded_slots(const ShardsToRead& read) {
  RecordedSlots recorded;
  for (const auto& shard : read.shards) {
    if (shard->generation.load(std::memory_order_relaxed) != read.generation) continue;
    size_t in_shard = 0;
    for (uint32_t c = 0; c < read.chunks(); ++c) {
      const Chunk* chunk = shard->chunks[c].load(std::memory_order_acquire);
      if (chunk == nullptr) continue;
      for (const Slot& slot : chunk->slots)
        in_shard += slot.count.load(std::memory_order_relaxed) != 0;
    }
    recorded.total += in_shard;
    recorded.most_in_a_shard = std::max(recorded.most_in_a_shard, in_shard);
  }
  return recorded;
}

// Copies the recorded slots of `shard` into `copies` (histograms over their used buckets only).
// A seqlock read: false, with the copies to be ignored, when the shard's generation is not
// current before and after the copy (stale, or zeroed by its owner meanwhile).
bool copy_recorded_slots(const Shard& shard, const ShardsToRead& read,
                         std::vector<SlotCopy>& copies) {
  const uint64_t before = shard.generation.load(std::memory_order_acquire);
  if (before != read.generation) return false;  // stale: reset since its owner last recorded
  copies.clear();
  for (uint32_t c = 0; c < read.chunks(); ++c) {
    const Chunk* chunk = shard.chunks[c].load(std::memory_order_acquire);
    if (chunk == nullptr) continue;
    for (uint32_t i = 0; i < kChunkNodes; ++i) {
      const NodeId node = c * kChunkNodes + i;
      if (node >= read.nodes) break;
      const Slot& slot = chunk->slots[i];
      constexpr auto acquire = std::memory_order_acquire;
      const uint64_t count = slot.count.load(acquire);
      if (count == 0) continue;
      SlotCopy& copy = copies.emplace_back();
      copy.node = node;
      copy.count = count;
      copy.total_ns = slot.total_ns.load(acquire);
      copy.min_ns = slot.min_ns.load(acquire);
      copy.max_ns = slot.max_ns.load(acquire);
      copy.last_ns = slot.last_ns.load(acquire);
      copy.last_end_ns = slot.last_end_ns.load(acquire);
      copy.first_start_ns = slot.first_start_ns.load(acquire);
      // Every counted duration lies between the min and the max read after the count: only
      // their buckets can hold counts (the copy's others stay zero).
      copy.first_bucket = bucket_index(copy.min_ns);
      copy.last_bucket = bucket_index(copy.max_ns);
      for (int b = copy.first_bucket; b <= copy.last_bucket; ++b) {
        copy.histogram.counts[b] = slot.buckets[b].load(acquire);
      }
    }
  }
  // After the acquire loads above: if any of them saw a store made after the owner began
  // zeroing, this load sees the zeroing marker or a later generation.
  return shard.generation.load(std::memory_order_relaxed) == before;
}

// The figures of every shard's copies, merged per node.
class MergedFigures {
 public:
  MergedFigures(uint32_t nodes, size_t expected) : position_(nodes, -1) {
    merged_.reserve(expected);
  }

  void add(const SlotCopy& copy) {
    int32_t& at = position_[copy.node];
    if (at < 0) {
      at = static_cast<int32_t>(merged_.size());
      in_node_order_ = in_node_order_ && (merged_.empty() || merged_.back().node < copy.node);
      BrickStats& stats = merged_.emplace_back();
      stats.node = copy.node;
      stats.count = copy.count;
      stats.total_ns = copy.total_ns;
      stats.min_ns = copy.min_ns;
      stats.max_ns = copy.max_ns;
      stats.last_ns = copy.last_ns;
      stats.last_end_ns = copy.last_end_ns;
      stats.first_start_ns = copy.first_start_ns;
      for (int b = copy.first_bucket; b <= copy.last_bucket; ++b) {
        stats.histogram.counts[b] = copy.histogram.counts[b];
      }
      return;
    }
    BrickStats& stats = merged_[at];
    stats.count += copy.count;
    stats.total_ns += copy.total_ns;
    stats.min_ns = std::min(stats.min_ns, copy.min_ns);
    stats.max_ns = std::max(stats.max_ns, copy.max_ns);
    if (copy.last_end_ns > stats.last_end_ns) {
      stats.last_end_ns = copy.last_end_ns;
      stats.last_ns = copy.last_ns;
    }
    stats.first_start_ns = std::min(stats.first_start_ns, copy.first_start_ns);
    for (int b = copy.first_bucket; b <= copy.last_bucket; ++b) {
      stats.histogram.counts[b] += copy.histogram.counts[b];
    }
  }

  // The merged figures by increasing node (already so when one thread recorded them all).
  std::vector<BrickStats> by_node() && {
    if (in_node_order_) return std::move(merged_);
    std::vector<BrickStats> ordered;
    ordered.reserve(merged_.size());
    for (const int32_t at : position_) {
      if (at >= 0) ordered.emplace_back(std::move(merged_[at]));
    }
    return ordered;
  }

 private:
  std::vector<BrickStats> merged_;
  std::vector<int32_t> position_;  // node -> index in merged_, -1: none yet
  bool in_node_order_ = true;      // merged_'s entries by increasing node
};

}  // namespace

struct Registry::Impl {
  const uint64_t id = g_next_registry_id.fetch_add(1, std::memory_order_relaxed);
  // Read by every record; written by reset() only.
  alignas(64) std::atomic<uint64_t> generation{1};
  std::atomic<uint32_t> node_count{0};  // published after a node is complete (debug checks)
  // Records zeroed by renewals of stale shards (see "Accounting for resets"); on a line of its
  // own so that renewals after a reset do not evict `generation` from every recorder's cache.
  alignas(64) std::atomic<uint64_t> discarded_by_renewal{0};

  alignas(64) std::mutex shards_mutex;
  std::vector<std::shared_ptr<Shard>> shards;

  std::mutex nodes_mutex;
  std::vector<NodeInfo> nodes;
  std::unordered_map<NodeKey, NodeId, NodeKeyHash, NodeKeyEqual> index;

  // The calling thread's shard, created (or adopted) on its first record; null once the
  // thread is exiting. (Allocation failures terminate: noexcept.)
  Shard* shard() noexcept {
    return ShardClaims::mine(id, [this] { return claim_shard(); });
  }

  // A shard whose thread has exited, taken over, or a new one.
  std::shared_ptr<Shard> claim_shard() {
    std::lock_guard<std::mutex> lock(shards_mutex);
    for (const auto& candidate : shards) {
      if (!candidate->owned.load(std::memory_order_acquire)) {  // its thread has exited
        candidate->owned.store(true, std::memory_order_relaxed);
        return candidate;
      }
    }
    shards.push_back(std::make_shared<Shard>(generation.load(std::memory_order_relaxed)));
    return shards.back();
  }

  ShardsToRead shards_to_read() {
    ShardsToRead read;
    {
      std::lock_guard<std::mutex> lock(shards_mutex);
      read.shards = shards;
      read.generation = generation.load(std::memory_order_relaxed);
    }
    read.nodes = node_count.load(std::memory_order_acquire);
    return read;
  }

  // Fills in what the registry knows of each node (name, path, place in the tree).
  void describe_nodes(std::vector<BrickStats>& figures) {
    std::lock_guard<std::mutex> lock(nodes_mutex);
    for (BrickStats& stats : figures) {
      const NodeInfo& info = nodes[stats.node];
      stats.name = info.name;
      stats.path = info.path;
      stats.parent = info.parent;
      stats.depth = info.depth;
      stats.kind = info.kind;
      stats.device = info.device;
    }
  }

  void record_into(Shard& shard, NodeId node, int64_t ns, int64_t end_ns) noexcept {
    const uint64_t gen = generation.load(std::memory_order_relaxed);
    if (shard.generation.load(std::memory_order_relaxed) != gen) [[unlikely]]
      shard.renew(gen, discarded_by_renewal);
    if (ns < 0) ns = 0;
    Slot& slot = shard.slot(node);
    // The owner's own loads are relaxed; its stores are release (see "Memory order" above).
    constexpr auto relaxed = std::memory_order_relaxed;
    constexpr auto release = std::memory_order_release;
    const uint64_t count = slot.count.load(relaxed);
    const int64_t start_ns = end_ns - ns;
    if (count == 0) {
      slot.min_ns.store(ns, release);
      slot.max_ns.store(ns, release);
      slot.first_start_ns.store(start_ns, release);
    } else {
      if (ns < slot.min_ns.load(relaxed)) slot.min_ns.store(ns, release);
      if (ns > slot.max_ns.load(relaxed)) slot.max_ns.store(ns, release);
      if (start_ns < slot.first_start_ns.load(relaxed))
        slot.first_start_ns.store(start_ns, release);
    }
    slot.total_ns.store(slot.total_ns.load(relaxed) + ns, release);
    // The latest completion, not the latest record(): a caller may record out of order.
    if (count == 0 || end_ns >= slot.last_end_ns.load(relaxed)) {
      slot.last_ns.store(ns, release);
      slot.last_end_ns.store(end_ns, release);
    }
    std::atomic<uint64_t>& bucket = slot.buckets[bucket_index(ns)];
    bucket.store(bucket.load(relaxed) + 1, release);
    slot.count.store(count + 1, release);  // last: publishes the record
  }
};

// ---------------------------------------------------------------------------------------------
// Registry

Registry::Registry() : impl_(std::make_unique<Impl>()) {
  (void)now_ns();  // calibrate the clock now rather than inside the first timed brick
}

Registry::~Registry() = default;

NodeId Registry::intern(NodeId parent, std::string_view name, Kind kind, int device) {
  if (name.empty()) {
    throw Error("brick registry: intern(): a brick name must not be empty (parent " +
                (parent == kNoParent ? std::string("none") : std::to_string(parent)) + ")");
  }
  std::lock_guard<std::mutex> lock(impl_->nodes_mutex);
  return intern_locked(parent, name, kind, device);
}

NodeId Registry::twin(NodeId node, Kind kind) {
  std::lock_guard<std::mutex> lock(impl_->nodes_mutex);
  if (node >= impl_->nodes.size()) {
    throw Error("brick registry: twin(): node " + std::to_string(node) + " does not exist (" +
                std::to_string(impl_->nodes.size()) + " nodes interned)");
  }
  const NodeInfo& info = impl_->nodes[node];
  if (info.kind == kind) return node;
  const std::string name = info.name;  // (interning may move the node table)
  return intern_locked(info.parent, name, kind, info.device);
}

NodeId Registry::intern_locked(NodeId parent, std::string_view name, Kind kind, int device) {
  Impl& impl = *impl_;
  if (parent != kNoParent && parent >= impl.nodes.size()) {
    throw Error("brick registry: intern(): parent node " + std::to_string(parent) +
                " does not exist (" + std::to_string(impl.nodes.size()) +
                " nodes interned) while interning '" + std::string(name) + "'");
  }
  if (auto it = impl.index.find(NodeKeyView{parent, device, kind, name}); it != impl.index.end()) {
    return it->second;
  }
  if (impl.nodes.size() >= kMaxNodes) {
    throw Error("brick registry: intern(): the node table is full (" + std::to_string(kMaxNodes) +
                " nodes) while interning '" + std::string(name) + "'");
  }
  const auto node = static_cast<NodeId>(impl.nodes.size());
  NodeInfo info{std::string(name), std::string(), parent, 0, kind, device};
  if (parent == kNoParent) {
    info.path = info.name;
  } else {
    const NodeInfo& up = impl.nodes[parent];
    info.path.reserve(up.path.size() + 1 + name.size());
    info.path.append(up.path).append("/").append(name);
    info.depth = up.depth + 1;
  }
  impl.index.emplace(NodeKey{parent, device, kind, info.name}, node);
  impl.nodes.push_back(std::move(info));
  impl.node_count.store(node + 1, std::memory_order_release);
  return node;
}

size_t Registry::node_count() const {
  std::lock_guard<std::mutex> lock(impl_->nodes_mutex);
  return impl_->nodes.size();
}

void Registry::record(NodeId node, int64_t ns) noexcept {
  // `node` must come from intern() on this registry; only debug builds check.
  assert(node < impl_->node_count.load(std::memory_order_relaxed));
  Shard* shard = impl_->shard();
  if (shard == nullptr) [[unlikely]]
    return;
  impl_->record_into(*shard, node, ns, clock_now());
}

void Registry::record(NodeId node, int64_t ns, int64_t end_ns) noexcept {
  assert(node < impl_->node_count.load(std::memory_order_relaxed));
  Shard* shard = impl_->shard();
  if (shard == nullptr) [[unlikely]]
    return;
  impl_->record_into(*shard, node, ns, end_ns);
}

void Registry::prepare_thread() noexcept { ShardClaims::prepare_thread(); }

Snapshot Registry::snapshot() const {
  const ShardsToRead read = impl_->shards_to_read();
  const RecordedSlots recorded = count_recorded_slots(read);
  MergedFigures merged(read.nodes, std::min<size_t>(recorded.total, read.nodes));
  std::vector<SlotCopy> copies;
  copies.reserve(recorded.most_in_a_shard);
  for (const auto& shard : read.shards) {
    if (!copy_recorded_slots(*shard, read, copies)) continue;
    for (const SlotCopy& copy : copies) merged.add(copy);
  }
  Snapshot result;
  result.nodes = std::move(merged).by_node();
  impl_->describe_nodes(result.nodes);
  return result;
}

void Registry::reset() {
  std::lock_guard<std::mutex> lock(impl_->shards_mutex);
  impl_->generation.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Registry::discarded_by_reset() const {
  Impl& impl = *impl_;
  // The lock holds reset() and new shards off: the generation and the shard list stay fixed, so
  // only renewals (to at most this generation) can interleave, and they run out.
  std::lock_guard<std::mutex> lock(impl.shards_mutex);
  const uint64_t gen = impl.generation.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t renewed = impl.discarded_by_renewal.load(std::memory_order_acquire);
    uint64_t in_stale_shards = 0;
    bool consistent = true;
    for (const auto& shard : impl.shards) {
      const uint64_t before = shard->generation.load(std::memory_order_acquire);
      if (before == gen) continue;  // current: its figures are live, not discarded
      if (before == kZeroing) {     // its counts are on their way into the total
        consistent = false;
        break;
      }
      const uint64_t held = shard->recorded();
      // As in snapshot(): had a count load seen the zeroing, this load would see it too.
      if (shard->generation.load(std::memory_order_relaxed) != before) {
        consistent = false;
        break;
      }
      in_stale_shards += held;
    }
    // An unchanged total: no renewal moved counts between the shards read and the total.
    if (consistent && impl.discarded_by_renewal.load(std::memory_order_acquire) == renewed) {
      return renewed + in_stale_shards;
    }
    std::this_thread::yield();  // a renewal is running; it finishes without any lock
  }
}

}  // namespace brick::registry
