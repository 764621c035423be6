// The process's device timeline: what ProfilerStubs::record() logs, and the marks and ranges put
// on it, read by the trace export (profiler.h's timeline API).
#include "profiler/timeline.h"

#include <ATen/record_function.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>

#include <string>
#include <utility>
#include <vector>

#include "profiler/fork.h"
#include "profiler/host_clock.h"
#include "profiler/profiler.h"

namespace brick::profiler {

namespace {

constexpr size_t kMaxRecords = 8u << 20;  // 8M records (~320 MB): beyond, records are counted

// A thread's open ranges (range_push without its range_pop yet).
thread_local std::vector<std::pair<std::string, int64_t>> tls_ranges;

}  // namespace

TimelineLog& process_timeline() {
  static auto* instance = new TimelineLog(kMaxRecords);  // stub events may resolve at exit
  return *instance;
}

TimelineSnapshot timeline() {
  TimelineSnapshot out = process_timeline().snapshot();
  out.steady_to_cpu_offset_ns = steady_to_unix_offset_ns();  // c10::getTime() is Unix time
  return out;
}

void clear_timeline() { process_timeline().clear(); }

bool has_open_range() noexcept { return !tls_ranges.empty(); }

void mark(const char* name) {
  TORCH_CHECK(name != nullptr && *name != '\0', "brick profiler: mark() needs a non-empty name");
  const int64_t now = c10::getTime();
  process_timeline().annotate(
      Annotation{name, at::RecordFunction::currentThreadId(), now, now, /*is_range=*/false});
}

void range_push(const char* name) {
  TORCH_CHECK(name != nullptr && *name != '\0',
              "brick profiler: range_push() needs a non-empty name");
  tls_ranges.emplace_back(name, c10::getTime());
}

void range_pop() {
  TORCH_CHECK(!tls_ranges.empty(),
              "brick profiler: range_pop() without a matching range_push() on this thread");
  auto [name, start] = std::move(tls_ranges.back());
  tls_ranges.pop_back();
  process_timeline().annotate(Annotation{std::move(name), at::RecordFunction::currentThreadId(),
                                         start, c10::getTime(), /*is_range=*/true});
}

void prepare_timeline_for_fork() { process_timeline().lock_for_fork(); }
void timeline_after_fork(bool in_child) { process_timeline().unlock_after_fork(in_child); }

}  // namespace brick::profiler
