// GoogleTest suite for the machine samples a profile takes at its start and end
// (profiler/machine_sample.h), without torch: what they read, and that they read only what
// changed.
#include "profiler/machine_sample.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace {

using brick::profiler::machine_sample_open_thread_files;
using brick::profiler::machine_sample_reads;
using brick::profiler::MachineSample;
using brick::profiler::sample_machine;

bool has_schedstat() {
  return ::access(
             ("/proc/self/task/" + std::to_string(::syscall(SYS_gettid)) + "/schedstat").c_str(),
             R_OK) == 0;
}

std::set<int64_t> threads_now() {
  std::set<int64_t> tids;
  DIR* directory = ::opendir("/proc/self/task");
  while (const dirent* entry = ::readdir(directory)) {
    if (entry->d_name[0] != '.') tids.insert(std::strtoll(entry->d_name, nullptr, 10));
  }
  ::closedir(directory);
  return tids;
}

std::set<int64_t> sampled_threads(const MachineSample& sample) {
  std::set<int64_t> tids;
  for (const auto& [tid, wait] : sample.thread_waits) tids.insert(tid);
  return tids;
}

// A thread that waits until released.
class ParkedThread {
 public:
  ParkedThread()
      : thread_([this] {
          std::unique_lock<std::mutex> lock(mutex_);
          tid_ = ::syscall(SYS_gettid);
          started_.notify_all();
          released_.wait(lock, [this] { return release_; });
        }) {
    std::unique_lock<std::mutex> lock(mutex_);
    started_.wait(lock, [this] { return tid_ != 0; });
  }
  ~ParkedThread() { join(); }
  void join() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      release_ = true;
    }
    released_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  int64_t tid() const { return tid_; }

 private:
  std::mutex mutex_;
  std::condition_variable started_, released_;
  bool release_ = false;
  int64_t tid_ = 0;
  std::thread thread_;
};

TEST(MachineSample, ASampleHoldsTheCallingThreadAndEveryThreadOfTheProcess) {
  if (!has_schedstat()) GTEST_SKIP() << "this kernel keeps no schedstat";
  ParkedThread other;
  const MachineSample sample = sample_machine(false);
  ASSERT_TRUE(sample.thread_schedstat.has_value());
  EXPECT_EQ(sampled_threads(sample), threads_now());
  EXPECT_EQ(sampled_threads(sample).count(other.tid()), 1u);
  for (const auto& [tid, wait] : sample.thread_waits) {
    EXPECT_GE(wait, 0);
    if (tid == ::syscall(SYS_gettid)) {
      EXPECT_EQ(wait, sample.thread_schedstat->second);
    }
  }
  EXPECT_EQ(machine_sample_open_thread_files(), static_cast<int>(threads_now().size()));
}

TEST(MachineSample, TheThreadsAreListedAgainOnlyWhenTheyChanged) {
  if (!has_schedstat()) GTEST_SKIP() << "this kernel keeps no schedstat";
  sample_machine(false);
  const int64_t listings = machine_sample_reads().thread_listings;
  EXPECT_EQ(sampled_threads(sample_machine(false)), threads_now());
  EXPECT_EQ(machine_sample_reads().thread_listings, listings);  // nothing changed

  auto first = std::make_unique<ParkedThread>();
  EXPECT_EQ(sampled_threads(sample_machine(false)), threads_now());  // one more thread
  EXPECT_EQ(machine_sample_reads().thread_listings, listings + 1);
  const int64_t ended = first->tid();
  first.reset();
  ParkedThread second;  // one ended, another started: the same count
  const std::set<int64_t> seen = sampled_threads(sample_machine(false));
  EXPECT_EQ(seen, threads_now());
  EXPECT_EQ(seen.count(ended), 0u);
  EXPECT_EQ(seen.count(second.tid()), 1u);
  second.join();
  EXPECT_EQ(sampled_threads(sample_machine(false)), threads_now());
  EXPECT_EQ(machine_sample_open_thread_files(), static_cast<int>(threads_now().size()));
}

TEST(MachineSample, TheMachinesTicksAreReadOnlyWhenAskedFor) {
  if (::access("/proc/stat", R_OK) != 0) GTEST_SKIP() << "no /proc/stat";
  const int64_t reads = machine_sample_reads().stat_reads;
  const MachineSample without = sample_machine(false);
  EXPECT_FALSE(without.busy_ns.has_value());
  EXPECT_FALSE(without.steal_ns.has_value());
  EXPECT_EQ(machine_sample_reads().stat_reads, reads);
  const MachineSample with = sample_machine(true);
  ASSERT_TRUE(with.busy_ns.has_value());
  EXPECT_GT(*with.busy_ns, 0);
  EXPECT_EQ(machine_sample_reads().stat_reads, reads + 1);
  const MachineSample later = sample_machine(true);
  ASSERT_TRUE(later.busy_ns.has_value());
  EXPECT_GE(*later.busy_ns, *with.busy_ns);
}

TEST(MachineSample, TheCountersAdvanceWithTheThreadsWork) {
  const MachineSample before = sample_machine(false);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(30);
  volatile uint64_t spins = 0;
  while (std::chrono::steady_clock::now() < until) spins = spins + 1;
  const MachineSample after = sample_machine(false);
  const int64_t wall = after.wall_ns - before.wall_ns;
  const int64_t thread_cpu = after.thread_cpu_ns - before.thread_cpu_ns;
  EXPECT_GE(wall, 30'000'000);
  EXPECT_GT(thread_cpu, 0);
  EXPECT_LE(thread_cpu, wall + 1'000'000);
  // The process's CPU time holds the thread's (getrusage counts in microseconds or ticks).
  EXPECT_GE(after.process_cpu_ns - before.process_cpu_ns + 10'000'000, thread_cpu);
  EXPECT_GE(after.involuntary_switches, before.involuntary_switches);
  if (before.thread_schedstat && after.thread_schedstat) {
    // The thread's runnable time (on a CPU or waiting for one) is at most the wall time.
    const int64_t on_cpu = after.thread_schedstat->first - before.thread_schedstat->first;
    const int64_t waited = after.thread_schedstat->second - before.thread_schedstat->second;
    EXPECT_GT(on_cpu, 0);
    EXPECT_GE(waited, 0);
    EXPECT_LE(on_cpu + waited, wall + 20'000'000);
  }
}

TEST(MachineSample, AForkedChildReadsItsOwnThreads) {
  if (!has_schedstat()) GTEST_SKIP() << "this kernel keeps no schedstat";
  ParkedThread other;  // the parent's second thread: not the child's
  sample_machine(true);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const MachineSample sample = sample_machine(true);
    const bool own = sample.thread_schedstat.has_value() &&
                     sampled_threads(sample) == threads_now() && threads_now().size() == 1 &&
                     machine_sample_open_thread_files() == 1;
    ::_exit(own ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's sample was not of its own threads";
  EXPECT_EQ(sampled_threads(sample_machine(false)), threads_now());
}

}  // namespace
