// What the machine's counters say now, for the calling thread and its process: the readings
// profiler/machine.py turns into a profiled region's figures (what the machine denied it).
//
// Plain C++ over Linux's /proc (no torch). A profile samples at its start and at its end, and
// right after a garbage collection each Python step of a sample cost more than its system call:
// one native call per sample (the 2-core VM, cold: 180 -> 72 us at the start of a profile).
// The /proc files stay open and are read again from their start (pread): opening one walks its
// path anew, which costs about as much as reading it.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace brick::profiler {

struct MachineSample {
  int64_t wall_ns = 0;               // CLOCK_MONOTONIC: Python's time.perf_counter_ns()
  int64_t thread_cpu_ns = 0;         // the calling thread's CPU time
  int64_t process_cpu_ns = 0;        // the process's user + system time (getrusage)
  int64_t involuntary_switches = 0;  // times the process was preempted (getrusage)
  // The calling thread's schedstat: (CPU ns, run-queue wait ns); none where the kernel keeps no
  // schedstat.
  std::optional<std::pair<int64_t, int64_t>> thread_schedstat;
  // (thread id, run-queue wait ns) for each thread of the process.
  std::vector<std::pair<int64_t, int64_t>> thread_waits;
  // Every CPU of the machine together since boot (/proc/stat's first line, counted in clock
  // ticks, here in ns): busy is user, nice, system, irq and softirq time (guest time is inside
  // user). None when not asked for, or where /proc/stat does not hold them.
  std::optional<int64_t> busy_ns;
  std::optional<int64_t> steal_ns;
};

// The counters now. `ticks` false leaves out /proc/stat (busy_ns, steal_ns): its tick counts
// tell nothing over a short region, and its read is a sample's costliest. The threads of the
// process are listed again only when their number (the task directory's link count less 2)
// differs from the last listing's, or a listed thread could not be read (it ended): listing
// costs several reads. Thread-safe; after a fork the child opens its own files.
MachineSample sample_machine(bool ticks);

// How often the samples of this process read /proc/stat and listed the process's threads:
// what a test checks the savings above with.
struct MachineSampleReads {
  int64_t stat_reads = 0;
  int64_t thread_listings = 0;
};
MachineSampleReads machine_sample_reads();

// The /proc/self/task/*/schedstat files the samples hold open (one per live thread listed).
int machine_sample_open_thread_files();

// The Linux thread ids of the intra-op pool of `threads` threads (the OpenMP team a parallel
// kernel runs on, the caller among them), sorted: the threads whose run-queue waits delay a
// parallel op as the caller's own do. Only the caller where PyTorch's OpenMP runtime is not
// GNU's (or compatible), in a forked child, or for one thread.
std::vector<int64_t> intra_op_thread_ids(int threads);

}  // namespace brick::profiler
