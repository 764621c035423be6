// The registry's clock: the TSC's calibration against steady_clock, once, and the reads that
// precede it or do without a usable TSC. The fast read is clock.h's clock_now().
#include "registry/clock.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/steady_clock.h"
#include "registry/registry.h"

namespace brick::registry {

namespace detail {

#if BRICK_REGISTRY_HAS_TSC
constinit TscScale g_tsc{};
constinit std::atomic<uint64_t> g_tsc_mult{0};
#endif

namespace {

#if BRICK_REGISTRY_HAS_TSC

// One (tsc, steady ns) pair: the steady reading bracketed by two TSC reads, the tightest of a
// few tries, the TSC taken at the middle of the bracket.
struct ClockPair {
  uint64_t tsc = 0;
  int64_t ns = 0;
};

ClockPair read_clock_pair() noexcept {
  ClockPair best;
  uint64_t best_window = UINT64_MAX;
  for (int i = 0; i < 16; ++i) {
    const uint64_t before = read_tsc();
    const int64_t ns = steady_ns();
    const uint64_t after = read_tsc();
    if (after >= before && after - before < best_window) {
      best_window = after - before;
      best = {before + (after - before) / 2, ns};
    }
  }
  return best;
}

bool invariant_tsc() {
  std::ifstream file("/proc/cpuinfo");
  if (!file) return false;
  std::ostringstream text;
  text << file.rdbuf();
  return cpuinfo_has_invariant_tsc(text.str());
}
#endif

// Returns whether the TSC is used; runs once.
bool calibrate_clock() noexcept {
#if BRICK_REGISTRY_HAS_TSC
  try {
    if (!invariant_tsc()) return false;
  } catch (...) {
    return false;
  }
  const ClockPair first = read_clock_pair();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const ClockPair second = read_clock_pair();
  if (second.tsc <= first.tsc || second.ns <= first.ns) return false;
  const double ns_per_tick =
      static_cast<double>(second.ns - first.ns) / static_cast<double>(second.tsc - first.tsc);
  // Anything outside 50 MHz .. 20 GHz is a broken counter: keep steady_clock.
  if (!(ns_per_tick > 0.05 && ns_per_tick < 20.0)) return false;
  const auto mult = static_cast<uint64_t>(std::llround(std::ldexp(ns_per_tick, TscScale::kShift)));
  if (mult == 0) return false;
  g_tsc.base_tsc = second.tsc;
  g_tsc.base_ns = second.ns;
  g_tsc.mult = mult;
  g_tsc_mult.store(mult, std::memory_order_release);
  return true;
#else
  return false;
#endif
}

}  // namespace

// The first reads (they calibrate) and every read without a usable TSC.
[[gnu::noinline]] int64_t clock_slow() noexcept {
  static const bool use_tsc = calibrate_clock();
#if BRICK_REGISTRY_HAS_TSC
  if (use_tsc) return g_tsc.to_ns(read_tsc());
#else
  (void)use_tsc;
#endif
  return steady_ns();
}

}  // namespace detail

int64_t Registry::now_ns() noexcept { return detail::clock_now(); }

}  // namespace brick::registry
