// The device timeline's per-thread logs.
//
// Ownership
//   A ThreadLog belongs to one thread at a time (`owned`). The owner alone appends: it writes the
//   entry at `count`, then publishes it by storing count + 1 (release); readers load count
//   (acquire) and read only entries below it, so they never see a half-written one. A thread
//   that exits gives its log up, records kept; the next thread that first logs takes it over
//   (common/thread_claims.h).
//   So the logs number at most the threads alive at once, and an exited thread's records stay
//   readable until cleared.
//
// Storage
//   Entries live in a list of chunks that are never moved, linked (release) before the first
//   entry in them is published. Chunks double from kFirstChunk to kMaxChunk entries and are
//   freed only when the log is renewed.
//
// Generations
//   clear() bumps the generation. Snapshots read only logs of the current generation. A log
//   whose owner is alive is renewed (emptied) by its owner, under the log's mutex, when it next
//   logs; an ownerless one by clear() itself. The per-log mutex also serializes filling in a
//   record's device time (resolve(), a snapshot): PyTorch may release a stub event on any thread.
//
// Capacity
//   budget_ holds the generation and the records reserved in it; a log reserves kReserveBlock
//   at a time (one compare-and-swap per block), so the process-wide cap costs the append path
//   one shared load.
#include "profiler/timeline_log.h"

#include <algorithm>
#include <new>
#include <stdexcept>
#include <string>

#include "common/thread_claims.h"

namespace brick::profiler {

// A StubRecord as logged (40 bytes, as the record itself): until its device time is known, the
// event it is to be read from takes its place.
struct TimelineLog::Entry {
  uint64_t thread;
  int64_t cpu_ns;
  union {
    int64_t device_ns;           // when !is_unresolved
    runtime::Event* unresolved;  // when is_unresolved
  };
  int64_t stream;
  int32_t device;
  bool is_unresolved;

  StubRecord record() const noexcept {
    return StubRecord{thread, cpu_ns, is_unresolved ? -1 : device_ns, device, stream};
  }
};
static_assert(sizeof(TimelineLog::Entry) == sizeof(StubRecord));

namespace {

struct Chunk {
  explicit Chunk(size_t n) : capacity(n), entries(new TimelineLog::Entry[n]) {}
  std::atomic<Chunk*> next{nullptr};
  const size_t capacity;
  const std::unique_ptr<TimelineLog::Entry[]> entries;  // left untouched until written
};

}  // namespace

struct TimelineLog::ThreadLog {
  ThreadLog() : head(new Chunk(kFirstChunk)), tail(head) {}
  ~ThreadLog();
  ThreadLog(const ThreadLog&) = delete;
  ThreadLog& operator=(const ThreadLog&) = delete;

  std::atomic<bool> owned{true};
  std::mutex mutex;  // renewal, annotations, filling in device times
  std::atomic<uint32_t> generation{0};
  std::atomic<size_t> count{0};      // published entries
  std::atomic<uint64_t> dropped{0};  // appends beyond the cap (written by the owner alone)
  Chunk* const head;
  std::vector<Annotation> annotations;  // under mutex
  // The owner's: where the next entry goes, and the records it may still log.
  Chunk* tail;
  size_t tail_start = 0;  // index of tail's first entry
  size_t reserved = 0;    // count may grow up to this without reserving more
};

namespace {

std::atomic<uint64_t> g_next_timeline_id{1};

// Each thread appends to its own log of each timeline (common/thread_claims.h).
using LogClaims = ThreadClaims<TimelineLog::ThreadLog>;

constexpr uint32_t generation_of(uint64_t budget) { return static_cast<uint32_t>(budget >> 32); }
constexpr uint64_t reserved_of(uint64_t budget) { return budget & 0xffffffffu; }

void free_chain(Chunk* chunk) noexcept {
  while (chunk != nullptr) {
    Chunk* next = chunk->next.load(std::memory_order_relaxed);
    delete chunk;
    chunk = next;
  }
}

}  // namespace

TimelineLog::ThreadLog::~ThreadLog() { free_chain(head); }

TimelineLog::TimelineLog(size_t max_records)
    : id_(g_next_timeline_id.fetch_add(1, std::memory_order_relaxed)), max_records_(max_records) {
  if (max_records == 0 || max_records > 0xffffffffu) {
    throw std::invalid_argument("brick profiler: a timeline holds 1 to 2^32 - 1 records, not " +
                                std::to_string(max_records));
  }
}

// A thread that logged here keeps only a weak reference to its log, under an id never reused.
TimelineLog::~TimelineLog() = default;

TimelineLog::ThreadLog* TimelineLog::owned_by_this_thread() noexcept {
  return LogClaims::held(id_);
}

uint32_t TimelineLog::generation() const noexcept {
  return generation_of(budget_.load(std::memory_order_acquire));
}

TimelineLog::ThreadLog* TimelineLog::my_log() noexcept {
  try {
    return LogClaims::mine(id_, [this] { return claim_log(); });
  } catch (...) {
    return nullptr;  // out of memory: the caller counts the record as dropped
  }
}

// A log an exited thread gave up, taken over, or a new one.
std::shared_ptr<TimelineLog::ThreadLog> TimelineLog::claim_log() {
  std::lock_guard<std::mutex> lock(logs_mutex_);
  for (const auto& candidate : logs_) {
    bool free = false;
    if (candidate->owned.compare_exchange_strong(free, true, std::memory_order_acq_rel)) {
      return candidate;
    }
  }
  auto log = std::make_shared<ThreadLog>();
  log->generation.store(generation(), std::memory_order_relaxed);
  logs_.push_back(log);
  return log;
}

void TimelineLog::renew_locked(ThreadLog& log, uint32_t generation) noexcept {
  free_chain(log.head->next.exchange(nullptr, std::memory_order_relaxed));
  log.tail = log.head;
  log.tail_start = 0;
  log.reserved = 0;
  log.count.store(0, std::memory_order_relaxed);
  log.dropped.store(0, std::memory_order_relaxed);
  log.annotations.clear();
  log.generation.store(generation, std::memory_order_release);
}

void TimelineLog::renew(ThreadLog& log, uint32_t generation) noexcept {
  std::lock_guard<std::mutex> lock(log.mutex);
  renew_locked(log, generation);
}

// Reserves capacity for `log` in the current generation (renewing the log first if a clear()
// came in between). False once the cap is reached.
bool TimelineLog::reserve(ThreadLog& log) noexcept {
  uint64_t budget = budget_.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t gen = generation_of(budget);
    if (log.generation.load(std::memory_order_relaxed) != gen) {
      renew(log, gen);
      budget = budget_.load(std::memory_order_acquire);
      continue;
    }
    const uint64_t used = reserved_of(budget);
    if (used >= max_records_) return false;
    const uint64_t take = std::min<uint64_t>(kReserveBlock, max_records_ - used);
    if (budget_.compare_exchange_weak(budget, budget + take, std::memory_order_acq_rel)) {
      log.reserved += take;
      return true;
    }
  }
}

TimelineLog::Handle TimelineLog::append(const StubRecord& record,
                                        runtime::Event* unresolved) noexcept {
  ThreadLog* log = my_log();
  if (log == nullptr) [[unlikely]] {
    dropped_without_log_.fetch_add(1, std::memory_order_relaxed);
    return {};
  }
  const uint32_t current = generation();
  if (log->generation.load(std::memory_order_relaxed) != current) [[unlikely]]
    renew(*log, current);
  size_t n = log->count.load(std::memory_order_relaxed);
  if (n == log->reserved) [[unlikely]] {
    if (!reserve(*log)) {
      log->dropped.store(log->dropped.load(std::memory_order_relaxed) + 1,
                         std::memory_order_relaxed);
      return {};
    }
    n = log->count.load(std::memory_order_relaxed);  // 0 if reserve() renewed the log
  }
  if (n == log->tail_start + log->tail->capacity) [[unlikely]] {
    Chunk* next = new (std::nothrow) Chunk(std::min(log->tail->capacity * 2, kMaxChunk));
    if (next == nullptr) {
      log->dropped.store(log->dropped.load(std::memory_order_relaxed) + 1,
                         std::memory_order_relaxed);
      return {};
    }
    log->tail->next.store(next, std::memory_order_release);
    log->tail_start += log->tail->capacity;
    log->tail = next;
  }
  Entry* entry = &log->tail->entries[n - log->tail_start];
  entry->thread = record.thread;
  entry->cpu_ns = record.cpu_ns;
  entry->stream = record.stream;
  entry->device = record.device;
  entry->is_unresolved = unresolved != nullptr;
  if (unresolved != nullptr) {
    entry->unresolved = unresolved;
  } else {
    entry->device_ns = record.device_ns;
  }
  log->count.store(n + 1, std::memory_order_release);
  return {log, entry, log->generation.load(std::memory_order_relaxed)};
}

void TimelineLog::resolve_locked(Entry& entry) noexcept {
  auto& rt = runtime::get();
  int64_t device_ns = -1;
  try {
    rt.synchronize_event(entry.unresolved);
    device_ns = rt.event_host_time_ns(entry.unresolved);
  } catch (...) {
    // Left unknown (-1): the trace shows the op without a device interval.
  }
  entry.device_ns = device_ns;
  entry.is_unresolved = false;
}

void TimelineLog::resolve(const Handle& handle, runtime::Event* event) noexcept {
  if (!handle) return;
  std::lock_guard<std::mutex> lock(handle.log->mutex);
  // A renewed log may have reused the entry's memory: the generation tells.
  if (handle.log->generation.load(std::memory_order_relaxed) != handle.generation) return;
  if (handle.entry->is_unresolved && handle.entry->unresolved == event) {
    resolve_locked(*handle.entry);
  }
}

void TimelineLog::annotate(Annotation annotation) {
  ThreadLog* log = my_log();
  if (log == nullptr) {
    throw std::runtime_error("brick profiler: annotation '" + annotation.name +
                             "' not logged: this thread is exiting (or out of memory)");
  }
  const uint32_t current = generation();
  std::lock_guard<std::mutex> lock(log->mutex);
  if (log->generation.load(std::memory_order_relaxed) != current) renew_locked(*log, current);
  log->annotations.push_back(std::move(annotation));
}

TimelineSnapshot TimelineLog::snapshot() {
  TimelineSnapshot out;
  std::lock_guard<std::mutex> logs_lock(logs_mutex_);
  const uint32_t current = generation();
  size_t total = 0;
  for (const auto& log : logs_) total += log->count.load(std::memory_order_relaxed);
  out.records.reserve(total);
  for (const auto& log : logs_) {
    std::lock_guard<std::mutex> lock(log->mutex);
    if (log->generation.load(std::memory_order_acquire) != current) continue;
    size_t left = log->count.load(std::memory_order_acquire);
    for (Chunk* chunk = log->head; left > 0; chunk = chunk->next.load(std::memory_order_acquire)) {
      const size_t n = std::min(left, chunk->capacity);
      for (size_t i = 0; i < n; ++i) {
        Entry& entry = chunk->entries[i];
        if (entry.is_unresolved) resolve_locked(entry);
        out.records.push_back(entry.record());
      }
      left -= n;
    }
    out.annotations.insert(out.annotations.end(), log->annotations.begin(), log->annotations.end());
    out.dropped_records += log->dropped.load(std::memory_order_relaxed);
  }
  out.dropped_records += dropped_without_log_.load(std::memory_order_relaxed);
  return out;
}

void TimelineLog::clear() {
  std::lock_guard<std::mutex> logs_lock(logs_mutex_);
  const uint32_t next = generation() + 1;
  budget_.store(static_cast<uint64_t>(next) << 32, std::memory_order_release);
  dropped_without_log_.store(0, std::memory_order_relaxed);
  for (const auto& log : logs_) {
    // An owned log is renewed by its owner; taking it over needs logs_mutex_, held here.
    if (!log->owned.load(std::memory_order_acquire)) renew(*log, next);
  }
}

size_t TimelineLog::thread_logs() {
  std::lock_guard<std::mutex> lock(logs_mutex_);
  return logs_.size();
}

void TimelineLog::lock_for_fork() {
  logs_mutex_.lock();
  for (const auto& log : logs_) log->mutex.lock();
}

void TimelineLog::unlock_after_fork(bool in_child) {
  if (in_child) {
    // Only this thread exists here: every other thread's log is free, and every log is emptied
    // (the parent's records are the parent's).
    ThreadLog* mine = owned_by_this_thread();
    const uint32_t next = generation() + 1;
    budget_.store(static_cast<uint64_t>(next) << 32, std::memory_order_release);
    dropped_without_log_.store(0, std::memory_order_relaxed);
    for (const auto& log : logs_) {
      if (log.get() != mine) log->owned.store(false, std::memory_order_relaxed);
      renew_locked(*log, next);
    }
  }
  for (const auto& log : logs_) log->mutex.unlock();
  logs_mutex_.unlock();
}

}  // namespace brick::profiler
