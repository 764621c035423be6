// The registry's clock: TSC ticks scaled to steady_clock nanoseconds where the TSC is invariant.
//
// Internal to the registry (registry.cpp and its tests); callers use Registry::now_ns().
#pragma once

#include <cstdint>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <x86intrin.h>
#define BRICK_REGISTRY_HAS_TSC 1
#else
#define BRICK_REGISTRY_HAS_TSC 0
#endif

namespace brick::registry::detail {

// True when the first "flags" line of /proc/cpuinfo text lists both constant_tsc (fixed rate
// across frequency changes) and nonstop_tsc (keeps counting in deep C-states).
inline bool cpuinfo_has_invariant_tsc(std::string_view cpuinfo) noexcept {
  size_t pos = 0;
  while (pos < cpuinfo.size()) {
    size_t end = cpuinfo.find('\n', pos);
    if (end == std::string_view::npos) end = cpuinfo.size();
    std::string_view line = cpuinfo.substr(pos, end - pos);
    pos = end + 1;
    if (line.substr(0, 5) != "flags") continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    bool constant = false, nonstop = false;
    std::string_view rest = line.substr(colon + 1);
    while (!rest.empty()) {
      const size_t start = rest.find_first_not_of(" \t");
      if (start == std::string_view::npos) break;
      rest.remove_prefix(start);
      const size_t stop = rest.find_first_of(" \t");
      const std::string_view flag = rest.substr(0, stop);
      constant = constant || flag == "constant_tsc";
      nonstop = nonstop || flag == "nonstop_tsc";
      rest.remove_prefix(stop == std::string_view::npos ? rest.size() : stop);
    }
    return constant && nonstop;  // the first flags line decides (all CPUs list the same flags)
  }
  return false;
}

// ns = base_ns + (tsc - base_tsc) * mult / 2^kShift, in 128-bit fixed point: exact to well below
// a nanosecond per second and a handful of instructions.
struct TscScale {
  static constexpr int kShift = 32;
  uint64_t base_tsc = 0;
  int64_t base_ns = 0;
  uint64_t mult = 0;  // nanoseconds per tick, times 2^kShift

  int64_t to_ns(uint64_t tsc) const noexcept {
    // Signed: a core whose counter reads a few ticks behind the calibrating one stays sane.
    const auto ticks = static_cast<int64_t>(tsc - base_tsc);
    const __int128 scaled = static_cast<__int128>(ticks) * static_cast<__int128>(mult);
    return base_ns + static_cast<int64_t>(scaled >> kShift);
  }
};

#if BRICK_REGISTRY_HAS_TSC
inline uint64_t read_tsc() noexcept { return __rdtsc(); }
#endif

}  // namespace brick::registry::detail
