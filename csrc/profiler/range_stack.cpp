#include "profiler/range_stack.h"

#include <ATen/record_function.h>

#include <memory>
#include <vector>

namespace brick::profiler {
namespace {

struct OpenRange {
  std::string name;  // outlives the RecordFunction, which may keep a view of it
  at::RecordFunction record{at::RecordScope::USER_SCOPE};
};

std::vector<std::unique_ptr<OpenRange>>& open_ranges() {
  thread_local std::vector<std::unique_ptr<OpenRange>> ranges;
  return ranges;
}

}  // namespace

std::size_t push_range(const std::string& name) {
  auto& ranges = open_ranges();
  const std::size_t depth = ranges.size();
  auto range = std::make_unique<OpenRange>();
  range->name = name;
  if (range->record.isActive()) range->record.before(range->name.c_str());
  ranges.push_back(std::move(range));
  return depth;
}

void pop_ranges(std::size_t depth) {
  auto& ranges = open_ranges();
  while (ranges.size() > depth) {
    ranges.back()->record.end();
    ranges.pop_back();
  }
}

std::size_t range_depth() noexcept { return open_ranges().size(); }

}  // namespace brick::profiler
