// Samples of the machine's counters from Linux's /proc (machine_sample.h).
#include "profiler/machine_sample.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

namespace brick::profiler {

namespace {

int64_t clock_ns(clockid_t clock) {
  timespec now{};
  clock_gettime(clock, &now);
  return static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

int64_t timeval_ns(const timeval& value) {
  return static_cast<int64_t>(value.tv_sec) * 1'000'000'000 +
         static_cast<int64_t>(value.tv_usec) * 1'000;
}

int open_read_only(const char* path, int flags = 0) {
  int fd;
  do {
    fd = ::open(path, O_RDONLY | O_CLOEXEC | flags);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

void close_fd(int fd) {
  if (fd >= 0) ::close(fd);
}

// The file's first bytes, NUL-terminated in `buffer`; false where it cannot be read (for a
// thread's file: the thread ended). The files read are small, or only their first line is
// wanted (/proc/stat, whose other lines grow with the CPUs and interrupts).
template <size_t N>
bool read_start(int fd, std::array<char, N>& buffer) {
  if (fd < 0) return false;
  ssize_t n;
  do {
    n = ::pread(fd, buffer.data(), N - 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  buffer[static_cast<size_t>(n)] = '\0';
  return true;
}

// The next unsigned decimal at `*cursor` (after spaces), advancing it; nullopt for none.
std::optional<int64_t> next_number(const char** cursor) {
  const char* p = *cursor;
  while (*p == ' ') ++p;
  if (*p < '0' || *p > '9') return std::nullopt;
  char* end = nullptr;
  const long long value = std::strtoll(p, &end, 10);
  *cursor = end;
  return static_cast<int64_t>(value);
}

struct ThreadFile {
  int64_t tid;
  int fd;
};

// The files the samples keep open, for the process that opened them.
class ProcFiles {
 public:
  MachineSample sample(bool ticks) {
    MachineSample out;
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    out.process_cpu_ns = timeval_ns(usage.ru_utime) + timeval_ns(usage.ru_stime);
    out.involuntary_switches = usage.ru_nivcsw;

    std::lock_guard<std::mutex> lock(mutex_);
    forget_if_forked();
    if (ticks) read_cpu_times(out);
    read_schedstats(out);
    out.wall_ns = clock_ns(CLOCK_MONOTONIC);
    out.thread_cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    return out;
  }

  MachineSampleReads reads() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reads_;
  }

  int open_thread_files() {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_if_forked();
    return static_cast<int>(threads_.size());
  }

 private:
  // In a forked child the parent's descriptors name the parent's tasks: closed, read anew.
  void forget_if_forked() {
    const pid_t pid = ::getpid();
    if (pid == pid_) return;
    close_fd(stat_fd_);
    close_fd(task_fd_);
    stat_fd_ = task_fd_ = -1;
    for (const ThreadFile& thread : threads_) close_fd(thread.fd);
    threads_.clear();
    listed_ = false;
    pid_ = pid;
  }

  void read_cpu_times(MachineSample& out) {
    if (stat_fd_ < 0) stat_fd_ = open_read_only("/proc/stat");
    ++reads_.stat_reads;
    std::array<char, 512> text{};
    if (!read_start(stat_fd_, text) || std::string_view(text.data(), 4) != "cpu ") return;
    const char* cursor = text.data() + 4;
    std::array<int64_t, 8> fields{};  // user nice system idle iowait irq softirq steal
    size_t count = 0;
    for (; count < fields.size(); ++count) {
      const auto value = next_number(&cursor);
      if (!value.has_value()) break;
      fields[count] = *value;
    }
    const int64_t tick_ns = 1'000'000'000 / std::max<long>(sysconf(_SC_CLK_TCK), 1);
    if (count >= 7)
      out.busy_ns = (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) * tick_ns;
    if (count >= 8) out.steal_ns = fields[7] * tick_ns;
  }

  // The number of threads of the process (the task directory's link count less 2), or -1.
  int64_t thread_count() {
    if (task_fd_ < 0) task_fd_ = open_read_only("/proc/self/task", O_DIRECTORY);
    struct stat status {};
    if (task_fd_ < 0 || ::fstat(task_fd_, &status) != 0) return -1;
    return static_cast<int64_t>(status.st_nlink) - 2;
  }

  // Lists the process's threads: keeps the files of those still alive, opens the new ones'.
  void list_threads() {
    ++reads_.thread_listings;
    listed_ = true;
    std::vector<ThreadFile> listed;
    DIR* directory = ::opendir("/proc/self/task");
    if (directory != nullptr) {
      while (const dirent* entry = ::readdir(directory)) {
        if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
        const int64_t tid = std::strtoll(entry->d_name, nullptr, 10);
        int fd = -1;
        for (ThreadFile& known : threads_) {
          if (known.tid == tid) std::swap(fd, known.fd);
        }
        if (fd < 0) {
          fd = open_read_only(
              ("/proc/self/task/" + std::string(entry->d_name) + "/schedstat").c_str());
        }
        if (fd >= 0) listed.push_back({tid, fd});
      }
      ::closedir(directory);
    }
    for (const ThreadFile& ended : threads_) close_fd(ended.fd);
    threads_ = std::move(listed);
  }

  // Reads every listed thread's schedstat into `out`; false if one could not be read.
  bool read_listed(MachineSample& out, int64_t self) {
    out.thread_schedstat.reset();
    out.thread_waits.clear();
    out.thread_waits.reserve(threads_.size());
    bool complete = true;
    std::array<char, 128> text{};
    for (const ThreadFile& thread : threads_) {
      if (!read_start(thread.fd, text)) {
        complete = false;  // the thread ended (or the kernel keeps no schedstat)
        continue;
      }
      const char* cursor = text.data();
      const auto cpu = next_number(&cursor);
      const auto wait = next_number(&cursor);
      if (!cpu.has_value() || !wait.has_value()) {
        complete = false;
        continue;
      }
      out.thread_waits.emplace_back(thread.tid, *wait);
      if (thread.tid == self) out.thread_schedstat.emplace(*cpu, *wait);
    }
    return complete && out.thread_schedstat.has_value();
  }

  void read_schedstats(MachineSample& out) {
    const int64_t self = static_cast<int64_t>(::syscall(SYS_gettid));
    const int64_t count = thread_count();
    bool listed_now = false;
    if (!listed_ || count < 0 || count != static_cast<int64_t>(threads_.size())) {
      list_threads();
      listed_now = true;
    }
    // A thread that could not be read ended: when the count is unchanged, another started.
    if (!read_listed(out, self) && !listed_now) {
      list_threads();
      read_listed(out, self);
    }
  }

  std::mutex mutex_;
  pid_t pid_ = -1;
  int stat_fd_ = -1;
  int task_fd_ = -1;
  bool listed_ = false;
  std::vector<ThreadFile> threads_;
  MachineSampleReads reads_;
};

ProcFiles& proc_files() {
  static auto* files = new ProcFiles();  // never destroyed: samples may run at exit
  return *files;
}

}  // namespace

MachineSample sample_machine(bool ticks) { return proc_files().sample(ticks); }

MachineSampleReads machine_sample_reads() { return proc_files().reads(); }

int machine_sample_open_thread_files() { return proc_files().open_thread_files(); }

namespace {

// libgomp's entry points, from the OpenMP runtime PyTorch loaded (this module is built without
// OpenMP: at::parallel_for's pragmas would compile to nothing here). Weak: null where it is absent.
extern "C" {
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags)
    __attribute__((weak));
int omp_get_thread_num() __attribute__((weak));
}

// A forked child's OpenMP runtime still thinks it has the parent's team, whose threads did
// not survive the fork: a parallel region there never ends. A child asks for none.
std::atomic<bool> g_forked{false};
const bool g_fork_watch = [] {
  ::pthread_atfork(nullptr, nullptr, [] { g_forked.store(true, std::memory_order_relaxed); });
  return true;
}();

}  // namespace

std::vector<int64_t> intra_op_thread_ids(int threads) {
  const auto self = static_cast<int64_t>(::syscall(SYS_gettid));
  if (GOMP_parallel == nullptr || omp_get_thread_num == nullptr || threads <= 1 ||
      g_forked.load(std::memory_order_relaxed)) {
    return {self};
  }
  std::vector<int64_t> ids(static_cast<size_t>(threads), -1);
  GOMP_parallel(
      [](void* data) {
        auto& slots = *static_cast<std::vector<int64_t>*>(data);
        const int index = omp_get_thread_num();
        if (index >= 0 && static_cast<size_t>(index) < slots.size()) {
          slots[static_cast<size_t>(index)] = static_cast<int64_t>(::syscall(SYS_gettid));
        }
      },
      &ids, static_cast<unsigned>(threads), 0);
  ids.push_back(self);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  ids.erase(std::remove(ids.begin(), ids.end(), int64_t{-1}), ids.end());
  return ids;
}

}  // namespace brick::profiler
