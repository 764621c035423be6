// The brick registry: a low-overhead stats engine for "bricks" (ops and ranges).
//
// Plain C++ with no torch and no runtime dependency. Callers intern a brick once per call site
// (a node of the call tree: parent node + name), time it themselves (the profiler's observer
// keeps the stack of open bricks), then report completed durations. Recording is lock-free: each
// thread writes its own shard; a snapshot merges the shards once, and every view of the figures
// (by call path, by name) derives from that one reading.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace brick::registry {

// Host: calls of an op that ran no brick work (a CPU op): their host time, never device time.
enum class Kind : uint8_t { Op, Range, Host };
const char* kind_name(Kind kind) noexcept;

// How a brick's start and stop are timed (the profiler layer implements them).
enum class SyncMode : uint8_t {
  Immediate,  // synchronize the device, then read the clock: device execution, perturbs overlap
  Deferred,   // read the CPU clock only: launch cost on an asynchronous device
  Event,      // record a device event on the current stream; resolve later: no synchronization
};
const char* sync_mode_name(SyncMode mode) noexcept;
// Throws std::invalid_argument naming the text and the valid names.
SyncMode parse_sync_mode(std::string_view text);

using NodeId = uint32_t;
constexpr NodeId kNoParent = UINT32_MAX;

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Log-linear histogram of durations in ns: exact below 16 ns, then 8 buckets per power of two
// (bucket width <= 12.5% of its value). Percentiles interpolate within a bucket.
class Histogram {
 public:
  static constexpr int kSubBuckets = 8;
  static constexpr int kBuckets = 16 + 40 * kSubBuckets;  // up to 2^44 ns (~4.9 hours)
  static int bucket_of(int64_t ns) noexcept;
  static int64_t bucket_lower(int bucket) noexcept;  // smallest value in the bucket
  static int64_t bucket_upper(int bucket) noexcept;  // one past the largest value
  uint64_t counts[kBuckets] = {};
  void add(const Histogram& other) noexcept;
  uint64_t total() const noexcept;
  // q in [0, 1]; 0 when empty.
  double percentile_ns(double q) const noexcept;
  // The percentiles qs (ascending, each clamped to [0, 1]) into out, in one pass over the
  // buckets [first, last], which must hold every count; 0 each when empty.
  void percentiles_ns(std::span<const double> qs, std::span<double> out, int first = 0,
                      int last = kBuckets - 1) const noexcept;
};

// A brick's figures, as merged by a snapshot.
struct BrickStats {
  NodeId node = 0;
  std::string name;
  std::string path;  // ancestor names and this name joined by '/'
  NodeId parent = kNoParent;
  int depth = 0;  // 0 for a top-level brick
  Kind kind = Kind::Op;
  int device = -1;
  uint64_t count = 0;
  int64_t total_ns = 0;
  int64_t min_ns = 0;
  int64_t max_ns = 0;
  int64_t last_ns = 0;      // the most recently completed call (by completion time)
  int64_t last_end_ns = 0;  // when that call completed (Registry::now_ns()): orders last_ns
  // The earliest start among its calls: a call's completion on that clock less its duration
  // (an asynchronous device's event-timed call: when its events were read, less its device time).
  int64_t first_start_ns = 0;
  Histogram histogram;
  // The canonical per-call figure: total_ns / count / 1000.
  double avg_us() const noexcept;
  double percentile_ns(double q) const noexcept;
  // The percentiles qs (ascending) into out, clamped to [min_ns, max_ns], in one pass over the
  // buckets between min_ns's and max_ns's, which hold every count of a snapshot's figures.
  void percentiles_ns(std::span<const double> qs, std::span<double> out) const noexcept;
};

// One reading of the registry: every node with count > 0 (none omitted), in node order, and the
// views derived from exactly those figures, so that they always agree.
struct Snapshot {
  std::vector<BrickStats> nodes;  // one entry per call-tree node (per call path and device)

  // The nodes that share a name and kind merged into one entry, in order of first appearance:
  // counts, totals and histograms add, min and max combine, last_ns is the most recently
  // completed call across them (by last_end_ns), first_start_ns the earliest, depth is the
  // smallest, device is -1 when they were recorded on several devices. path is the name, parent
  // kNoParent, node the first node.
  std::vector<BrickStats> by_name() const;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The node for `name` of `kind` under `parent` (kNoParent for top level) on `device`; created
  // on first use.
  // Thread safe; takes a lock, so callers cache the result per call site.
  NodeId intern(NodeId parent, std::string_view name, Kind kind, int device);
  // The node of `node`'s name, parent and device of kind `kind` (interned as intern() does):
  // where the calls of one call site that ran on the host are kept apart from its op's.
  NodeId twin(NodeId node, Kind kind);
  size_t node_count() const;

  // Adds one completed call of `ns` nanoseconds to `node` (lock-free; the calling thread's
  // shard). Negative durations are recorded as 0. `node` must come from intern() on this
  // registry. `end_ns` (now_ns() when the call completed; read here when not given) orders
  // `last_ns`: the call with the latest end time, on any thread, whatever the order of the
  // record() calls. Callers that already read the clock pass it and save a read.
  void record(NodeId node, int64_t ns) noexcept;
  void record(NodeId node, int64_t ns, int64_t end_ns) noexcept;

  // Constructs the calling thread's registry state (shared by every registry) now, if not yet.
  // Thread-locals are destroyed in reverse order of construction, and a thread records nothing
  // once its registry state is destroyed; a caller whose own thread_local records from its
  // destructor (the observer, for the device work a thread still owes at exit) calls this
  // before constructing it, so those last records land.
  static void prepare_thread() noexcept;

  // Merges every thread's figures (a live reading while threads record: see registry.cpp).
  Snapshot snapshot() const;
  // Zeroes all counts; interned nodes stay valid. A record that races a reset lands on one side
  // of it: in the figures after the reset, or among those it discarded (discarded_by_reset());
  // none is counted twice. (A brick its caller opened before a reset and completes after it is
  // recorded after it, whole: the registry only sees completed calls.)
  void reset();

  // The records (completed calls) that resets have discarded since the registry was created.
  // Never decreases. The guarantee: with no record() or reset() running during or between the
  // two reads (recording has stopped),
  //   records made == sum of `count` over snapshot().nodes + discarded_by_reset()
  // exactly, where records made counts every record() that returned, on every thread, exited or
  // not. (A record() made after the thread's registry state was destroyed at exit is ignored,
  // not made: see prepare_thread().)
  // While threads record, the figure is a consistent reading that may miss records racing it.
  // Takes the lock reset() takes and may wait for a thread zeroing its shard: not for hot paths.
  uint64_t discarded_by_reset() const;

  // Monotonic nanoseconds of the registry's clock (TSC-based where invariant, else steady_clock).
  static int64_t now_ns() noexcept;

 private:
  NodeId intern_locked(NodeId parent, std::string_view name, Kind kind, int device);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace brick::registry
