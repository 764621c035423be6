// The device timeline's storage: one append-only log per thread, read and cleared as a whole.
//
// ProfilerStubs::record() appends one record per call (PyTorch reads the op's CPU time right
// around it), so an append takes no lock and allocates nothing but, every few thousand records,
// a chunk: the calling thread owns its log and writes it alone; readers (snapshot(), clear(),
// fork) walk every thread's log under the list's lock. An append takes that lock only the first
// time a thread logs, and its own log's lock once after each clear(). Plain C++ (no torch):
// tests drive it without an interpreter.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "profiler/profiler.h"
#include "runtime/runtime.h"

namespace brick::profiler {

class TimelineLog {
 public:
  struct ThreadLog;
  struct Entry;

  // Where an appended record lives, so its device time can be filled in later (resolve()).
  // Empty when the record was dropped.
  struct Handle {
    ThreadLog* log = nullptr;
    Entry* entry = nullptr;
    uint32_t generation = 0;
    explicit operator bool() const noexcept { return log != nullptr; }
  };

  // Holds at most `max_records` records at a time, over all threads; beyond, appends are
  // counted as dropped. (Threads reserve capacity in blocks of up to kReserveBlock records, so
  // with several threads dropping may begin up to a block per thread short of the cap.)
  explicit TimelineLog(size_t max_records);
  ~TimelineLog();  // no thread may be using it
  TimelineLog(const TimelineLog&) = delete;
  TimelineLog& operator=(const TimelineLog&) = delete;

  // Logs `record` in the calling thread's log, in call order. On an asynchronous device its
  // event may not have completed yet (device_ns -1): pass it as `unresolved`, and its device
  // time is read from it by resolve() (before the event is reused) or by snapshot(), whichever
  // comes first. Never throws; the common path takes no lock and allocates nothing.
  Handle append(const StubRecord& record, runtime::Event* unresolved) noexcept;

  // Reads the device time of `handle`'s record from `event`, its unresolved event, unless a
  // snapshot did already or a clear() discarded the record. Any thread.
  void resolve(const Handle& handle, runtime::Event* event) noexcept;

  // Adds a mark or range to the calling thread's log.
  void annotate(Annotation annotation);

  // Every thread's records (each thread's in call order, threads one after another) and
  // annotations since the last clear(), resolving the device times still unknown. The clock
  // offset is left 0 for the caller.
  TimelineSnapshot snapshot();

  // Discards every record, annotation and dropped count. A live thread's log is emptied (and
  // its memory beyond the first chunk freed) by the thread itself, at its next append; an
  // exited thread's log at once.
  void clear();

  // The threads' logs held: at most as many as threads have been alive at once.
  size_t thread_logs();

  // Blocks every lock a thread takes here, for fork(); after it, the child's logs are empty,
  // those of the parent's other threads free for the child's threads to take over.
  void lock_for_fork();
  void unlock_after_fork(bool in_child);

  // Capacity (records) of a thread's first chunk and the most any chunk holds: chunks double
  // from the first, so a thread that logs little costs little.
  static constexpr size_t kFirstChunk = 256;
  static constexpr size_t kMaxChunk = 16384;
  static constexpr size_t kReserveBlock = 4096;

 private:
  ThreadLog* my_log() noexcept;
  std::shared_ptr<ThreadLog> claim_log();
  ThreadLog* owned_by_this_thread() noexcept;
  uint32_t generation() const noexcept;
  bool reserve(ThreadLog& log) noexcept;
  void renew(ThreadLog& log, uint32_t generation) noexcept;
  static void renew_locked(ThreadLog& log, uint32_t generation) noexcept;
  static void resolve_locked(Entry& entry) noexcept;

  const uint64_t id_;  // unique per instance, never reused: keys each thread's cached log
  const size_t max_records_;
  // The generation (high 32 bits; bumped by clear()) and the records reserved in it (low 32).
  // One word, so a reservation can never land in a generation its log does not belong to.
  std::atomic<uint64_t> budget_{0};
  // Appends that had no log to go to (a thread past its exit, or out of memory), this generation.
  std::atomic<uint64_t> dropped_without_log_{0};
  std::mutex logs_mutex_;  // logs_, and every clear() and snapshot()
  std::vector<std::shared_ptr<ThreadLog>> logs_;
};

}  // namespace brick::profiler
