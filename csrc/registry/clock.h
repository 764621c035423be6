// The registry's clock: TSC ticks scaled to steady_clock nanoseconds where the TSC is invariant.
//
// Internal to the registry (its sources and tests); callers use Registry::now_ns(). The
// calibration is clock.cpp's; the read, inlined into every record, is clock_now() below.
#pragma once

#include <atomic>
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

// The calibrated scale, published once: g_tsc's fields first, then g_tsc_mult with release.
// g_tsc_mult == 0: not calibrated yet, or no usable TSC (steady_clock then). Hidden: the read
// below reaches them directly, not through the module's symbol table.
[[gnu::visibility("hidden")]] extern constinit TscScale g_tsc;
[[gnu::visibility("hidden")]] extern constinit std::atomic<uint64_t> g_tsc_mult;
#endif

// The first reads (they calibrate) and every read without a usable TSC.
[[gnu::visibility("hidden"), gnu::noinline]] int64_t clock_slow() noexcept;

// Inlined into record().
[[gnu::always_inline]] inline int64_t clock_now() noexcept {
#if BRICK_REGISTRY_HAS_TSC
  const uint64_t mult = g_tsc_mult.load(std::memory_order_acquire);
  if (mult != 0) [[likely]] {
    const TscScale scale{g_tsc.base_tsc, g_tsc.base_ns, mult};
    return scale.to_ns(read_tsc());
  }
#endif
  return clock_slow();
}

}  // namespace brick::registry::detail
