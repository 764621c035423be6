// The histogram's bucket of a duration (internal to the registry: its histograms, and each
// record into a shard, where it is inlined).
//
// Buckets 0..15 hold the values 0..15 exactly. From 16 on, the values [2^p, 2^(p+1)) (p >= 4)
// are split into 8 buckets of width 2^(p-3): bucket 16 + 8 * (p - 4) + the three bits below the
// leading one. The last bucket (p = 43) also takes everything from 2^44 up.
#pragma once

#include <bit>
#include <cstdint>

#include "registry/registry.h"

namespace brick::registry::detail {

[[gnu::always_inline]] inline int bucket_index(int64_t ns) noexcept {
  constexpr int kSub = Histogram::kSubBuckets;
  if (ns < 16) return ns < 0 ? 0 : static_cast<int>(ns);
  const int p = std::bit_width(static_cast<uint64_t>(ns)) - 1;  // >= 4
  if (p >= 44) [[unlikely]]
    return Histogram::kBuckets - 1;
  const int sub = static_cast<int>((ns >> (p - 3)) & (kSub - 1));
  return 16 + (p - 4) * kSub + sub;
}

}  // namespace brick::registry::detail
