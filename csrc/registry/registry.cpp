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
#include "registry/clock.h"

namespace brick::registry {

// ---------------------------------------------------------------------------------------------
// Names

const char* kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::Op:
      return "op";
    case Kind::Range:
      return "range";
  }
  return "unknown";
}

const char* sync_mode_name(SyncMode mode) noexcept {
  switch (mode) {
    case SyncMode::Immediate:
      return "immediate";
    case SyncMode::Deferred:
      return "deferred";
    case SyncMode::Event:
      return "event";
  }
  return "unknown";
}

SyncMode parse_sync_mode(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) {
    return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  });
  for (SyncMode mode : {SyncMode::Immediate, SyncMode::Deferred, SyncMode::Event}) {
    if (lower == sync_mode_name(mode)) return mode;
  }
  throw std::invalid_argument("brick registry: invalid sync mode '" + std::string(text) +
                              "' (valid: immediate, deferred, event)");
}

// ---------------------------------------------------------------------------------------------
// Histogram
//
// Buckets 0..15 hold the values 0..15 exactly. From 16 on, the values [2^p, 2^(p+1)) (p >= 4)
// are split into 8 buckets of width 2^(p-3): bucket 16 + 8 * (p - 4) + the three bits below the
// leading one. The last bucket (p = 43) also takes everything from 2^44 up.

namespace {

[[gnu::always_inline]] inline int bucket_index(int64_t ns) noexcept {
  constexpr int kSub = Histogram::kSubBuckets;
  if (ns < 16) return ns < 0 ? 0 : static_cast<int>(ns);
  const int p = std::bit_width(static_cast<uint64_t>(ns)) - 1;  // >= 4
  if (p >= 44) [[unlikely]]
    return Histogram::kBuckets - 1;
  const int sub = static_cast<int>((ns >> (p - 3)) & (kSub - 1));
  return 16 + (p - 4) * kSub + sub;
}

}  // namespace

int Histogram::bucket_of(int64_t ns) noexcept { return bucket_index(ns); }

int64_t Histogram::bucket_lower(int bucket) noexcept {
  bucket = std::clamp(bucket, 0, kBuckets - 1);
  if (bucket < 16) return bucket;
  const int p = 4 + (bucket - 16) / kSubBuckets;
  const int sub = (bucket - 16) % kSubBuckets;
  return static_cast<int64_t>(kSubBuckets + sub) << (p - 3);
}

int64_t Histogram::bucket_upper(int bucket) noexcept {
  bucket = std::clamp(bucket, 0, kBuckets - 1);
  if (bucket < 16) return bucket + 1;
  const int p = 4 + (bucket - 16) / kSubBuckets;
  return bucket_lower(bucket) + (int64_t{1} << (p - 3));
}

void Histogram::add(const Histogram& other) noexcept {
  for (int b = 0; b < kBuckets; ++b) counts[b] += other.counts[b];
}

uint64_t Histogram::total() const noexcept {
  uint64_t sum = 0;
  for (uint64_t c : counts) sum += c;
  return sum;
}

double Histogram::percentile_ns(double q) const noexcept {
  const uint64_t total = this->total();
  if (total == 0) return 0.0;
  if (!(q > 0.0)) q = 0.0;  // also NaN
  if (q > 1.0) q = 1.0;
  // The value of rank ceil(q * total) (1-based); q = 0 asks for the smallest.
  auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  rank = std::clamp<uint64_t>(rank, 1, total);
  uint64_t below = 0;
  for (int b = 0; b < kBuckets; ++b) {
    const uint64_t c = counts[b];
    if (c == 0) continue;
    if (below + c >= rank) {
      const auto lower = static_cast<double>(bucket_lower(b));
      const auto width = static_cast<double>(bucket_upper(b) - bucket_lower(b));
      if (width <= 1.0) return lower;  // an exact bucket
      // The c values are taken as spread evenly over the bucket, each at the middle of its
      // 1/c share.
      const double position = (static_cast<double>(rank - below) - 0.5) / static_cast<double>(c);
      return lower + width * position;
    }
    below += c;
  }
  return static_cast<double>(bucket_lower(kBuckets - 1));  // not reached
}

double BrickStats::avg_us() const noexcept {
  if (count == 0) return 0.0;
  return static_cast<double>(total_ns) / static_cast<double>(count) / 1000.0;
}

double BrickStats::percentile_ns(double q) const noexcept {
  if (count == 0) return 0.0;
  return std::clamp(histogram.percentile_ns(q), static_cast<double>(min_ns),
                    static_cast<double>(max_ns));
}

// ---------------------------------------------------------------------------------------------
// Views of a snapshot

std::vector<BrickStats> Snapshot::by_name() const {
  std::vector<BrickStats> merged;
  // (name, kind) -> index in merged; the names point into `nodes`, which outlives the map.
  std::map<std::pair<std::string_view, Kind>, size_t> index;
  for (const BrickStats& node : nodes) {
    const auto [it, first] = index.try_emplace({node.name, node.kind}, merged.size());
    if (first) {
      BrickStats& into = merged.emplace_back(node);
      into.path = node.name;
      into.parent = kNoParent;
      continue;
    }
    BrickStats& into = merged[it->second];
    into.count += node.count;
    into.total_ns += node.total_ns;
    into.min_ns = std::min(into.min_ns, node.min_ns);
    into.max_ns = std::max(into.max_ns, node.max_ns);
    if (node.last_end_ns > into.last_end_ns) {  // completed later, whatever the node order
      into.last_end_ns = node.last_end_ns;
      into.last_ns = node.last_ns;
    }
    into.depth = std::min(into.depth, node.depth);
    into.histogram.add(node.histogram);
    if (into.device != node.device) into.device = -1;  // seen on several devices
  }
  return merged;
}

// ---------------------------------------------------------------------------------------------
// Clock

namespace {

#if BRICK_REGISTRY_HAS_TSC
// The calibrated scale, published once: g_tsc's fields first, then g_tsc_mult with release.
// g_tsc_mult == 0: not calibrated yet, or no usable TSC (steady_clock then).
constinit detail::TscScale g_tsc{};
constinit std::atomic<uint64_t> g_tsc_mult{0};

// One (tsc, steady ns) pair: the steady reading bracketed by two TSC reads, the tightest of a
// few tries, the TSC taken at the middle of the bracket.
struct ClockPair {
  uint64_t tsc = 0;
  int64_t ns = 0;
};

ClockPair read_clock_pair() noexcept {
  ClockPair best;
  uint64_t best_window = UINT64_MAX;
  for (int i = 0; i < 16; ++i) {
    const uint64_t before = detail::read_tsc();
    const int64_t ns = steady_ns();
    const uint64_t after = detail::read_tsc();
    if (after >= before && after - before < best_window) {
      best_window = after - before;
      best = {before + (after - before) / 2, ns};
    }
  }
  return best;
}

bool invariant_tsc() {
  std::ifstream file("/proc/cpuinfo");
  if (!file) return false;
  std::ostringstream text;
  text << file.rdbuf();
  return detail::cpuinfo_has_invariant_tsc(text.str());
}
#endif

// Returns whether the TSC is used; runs once.
bool calibrate_clock() noexcept {
#if BRICK_REGISTRY_HAS_TSC
  try {
    if (!invariant_tsc()) return false;
  } catch (...) {
    return false;
  }
  const ClockPair first = read_clock_pair();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const ClockPair second = read_clock_pair();
  if (second.tsc <= first.tsc || second.ns <= first.ns) return false;
  const double ns_per_tick =
      static_cast<double>(second.ns - first.ns) / static_cast<double>(second.tsc - first.tsc);
  // Anything outside 50 MHz .. 20 GHz is a broken counter: keep steady_clock.
  if (!(ns_per_tick > 0.05 && ns_per_tick < 20.0)) return false;
  const auto mult =
      static_cast<uint64_t>(std::llround(std::ldexp(ns_per_tick, detail::TscScale::kShift)));
  if (mult == 0) return false;
  g_tsc.base_tsc = second.tsc;
  g_tsc.base_ns = second.ns;
  g_tsc.mult = mult;
  g_tsc_mult.store(mult, std::memory_order_release);
  return true;
#else
  return false;
#endif
}

// The first reads (they calibrate) and every read without a usable TSC.
[[gnu::noinline]] int64_t clock_slow() noexcept {
  static const bool use_tsc = calibrate_clock();
#if BRICK_REGISTRY_HAS_TSC
  if (use_tsc) return g_tsc.to_ns(detail::read_tsc());
#else
  (void)use_tsc;
#endif
  return steady_ns();
}

// Inlined into record().
[[gnu::always_inline]] inline int64_t clock_now() noexcept {
#if BRICK_REGISTRY_HAS_TSC
  const uint64_t mult = g_tsc_mult.load(std::memory_order_acquire);
  if (mult != 0) [[likely]] {
    const detail::TscScale scale{g_tsc.base_tsc, g_tsc.base_ns, mult};
    return scale.to_ns(detail::read_tsc());
  }
#endif
  return clock_slow();
}

}  // namespace

int64_t Registry::now_ns() noexcept { return clock_now(); }

// ---------------------------------------------------------------------------------------------
// Shards

namespace {

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
  std::atomic<int64_t> last_end_ns{0};  // clock at the last record's completion: orders last_ns
  std::atomic<uint64_t> buckets[Histogram::kBuckets]{};

  void zero() noexcept {
    constexpr auto release = std::memory_order_release;  // see "Memory order" above
    count.store(0, release);
    total_ns.store(0, release);
    min_ns.store(0, release);
    max_ns.store(0, release);
    last_ns.store(0, release);
    last_end_ns.store(0, release);
    for (auto& bucket : buckets) bucket.store(0, release);
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

// A node is a name under a parent on a device: the same op on two devices is two bricks.
struct NodeKeyView {
  NodeId parent;
  int device;
  std::string_view name;
};

struct NodeKey {
  NodeId parent;
  int device;
  std::string name;
  operator NodeKeyView() const noexcept { return {parent, device, name}; }
};

struct NodeKeyHash {
  using is_transparent = void;
  size_t operator()(const NodeKeyView& key) const noexcept {
    return (std::hash<std::string_view>{}(key.name) * 31 + key.parent) * 31 +
           static_cast<size_t>(key.device);
  }
};

struct NodeKeyEqual {
  using is_transparent = void;
  bool operator()(const NodeKeyView& a, const NodeKeyView& b) const noexcept {
    return a.parent == b.parent && a.device == b.device && a.name == b.name;
  }
};

// One node's figures read from one shard by a snapshot.
struct SlotCopy {
  NodeId node;
  uint64_t count;
  int64_t total_ns, min_ns, max_ns, last_ns, last_end_ns;
  Histogram histogram;
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
    if (count == 0) {
      slot.min_ns.store(ns, release);
      slot.max_ns.store(ns, release);
    } else {
      if (ns < slot.min_ns.load(relaxed)) slot.min_ns.store(ns, release);
      if (ns > slot.max_ns.load(relaxed)) slot.max_ns.store(ns, release);
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
  Impl& impl = *impl_;
  std::lock_guard<std::mutex> lock(impl.nodes_mutex);
  if (parent != kNoParent && parent >= impl.nodes.size()) {
    throw Error("brick registry: intern(): parent node " + std::to_string(parent) +
                " does not exist (" + std::to_string(impl.nodes.size()) +
                " nodes interned) while interning '" + std::string(name) + "'");
  }
  if (auto it = impl.index.find(NodeKeyView{parent, device, name}); it != impl.index.end()) {
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
  impl.index.emplace(NodeKey{parent, device, info.name}, node);
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
  Impl& impl = *impl_;
  std::vector<std::shared_ptr<Shard>> shards;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(impl.shards_mutex);
    shards = impl.shards;
    gen = impl.generation.load(std::memory_order_relaxed);
  }
  const uint32_t nodes = impl.node_count.load(std::memory_order_acquire);
  const uint32_t chunks = (nodes + kChunkNodes - 1) / kChunkNodes;

  std::vector<BrickStats> merged;
  std::vector<int32_t> position(nodes, -1);  // node -> index in merged
  std::vector<SlotCopy> copies;
  for (const auto& shard : shards) {
    // A seqlock read: the shard counts only if its generation is current before and after.
    const uint64_t before = shard->generation.load(std::memory_order_acquire);
    if (before != gen) continue;  // stale: reset since its owner last recorded
    copies.clear();
    for (uint32_t c = 0; c < chunks; ++c) {
      const Chunk* chunk = shard->chunks[c].load(std::memory_order_acquire);
      if (chunk == nullptr) continue;
      for (uint32_t i = 0; i < kChunkNodes; ++i) {
        const NodeId node = c * kChunkNodes + i;
        if (node >= nodes) break;
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
        for (int b = 0; b < Histogram::kBuckets; ++b) {
          copy.histogram.counts[b] = slot.buckets[b].load(acquire);
        }
      }
    }
    // After the acquire loads above: if any of them saw a store made after the owner began
    // zeroing, this load sees the zeroing marker or a later generation.
    if (shard->generation.load(std::memory_order_relaxed) != before) continue;  // zeroed meanwhile

    for (SlotCopy& copy : copies) {
      int32_t& at = position[copy.node];
      if (at < 0) {
        at = static_cast<int32_t>(merged.size());
        BrickStats& stats = merged.emplace_back();
        stats.node = copy.node;
        stats.count = copy.count;
        stats.total_ns = copy.total_ns;
        stats.min_ns = copy.min_ns;
        stats.max_ns = copy.max_ns;
        stats.last_ns = copy.last_ns;
        stats.last_end_ns = copy.last_end_ns;
        stats.histogram = copy.histogram;
        continue;
      }
      BrickStats& stats = merged[at];
      stats.count += copy.count;
      stats.total_ns += copy.total_ns;
      stats.min_ns = std::min(stats.min_ns, copy.min_ns);
      stats.max_ns = std::max(stats.max_ns, copy.max_ns);
      if (copy.last_end_ns > stats.last_end_ns) {
        stats.last_end_ns = copy.last_end_ns;
        stats.last_ns = copy.last_ns;
      }
      stats.histogram.add(copy.histogram);
    }
  }

  Snapshot result;
  result.nodes.reserve(merged.size());
  std::lock_guard<std::mutex> lock(impl.nodes_mutex);
  for (uint32_t node = 0; node < nodes; ++node) {
    if (position[node] < 0) continue;
    BrickStats& stats = result.nodes.emplace_back(std::move(merged[position[node]]));
    const NodeInfo& info = impl.nodes[node];
    stats.name = info.name;
    stats.path = info.path;
    stats.parent = info.parent;
    stats.depth = info.depth;
    stats.kind = info.kind;
    stats.device = info.device;
  }
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
