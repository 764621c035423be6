// Histograms of per-call durations (their buckets: buckets.h) and the per-call figures of a
// brick derived from them.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "registry/buckets.h"
#include "registry/registry.h"

namespace brick::registry {

using detail::bucket_index;

int Histogram::bucket_of(int64_t ns) noexcept { return bucket_index(ns); }

int64_t Histogram::bucket_lower(int bucket) noexcept {
  bucket = std::clamp(bucket, 0, kBuckets - 1);
  if (bucket < 16) return bucket;
  const int p = 4 + (bucket - 16) / kSubBuckets;
  const int sub = (bucket - 16) % kSubBuckets;
  return static_cast<int64_t>(kSubBuckets + sub) << (p - 3);
}

int64_t Histogram::bucket_upper(int bucket) noexcept {
  bucket = std::clamp(bucket, 0, kBuckets - 1);
  if (bucket < 16) return bucket + 1;
  const int p = 4 + (bucket - 16) / kSubBuckets;
  return bucket_lower(bucket) + (int64_t{1} << (p - 3));
}

void Histogram::add(const Histogram& other) noexcept {
  for (int b = 0; b < kBuckets; ++b) counts[b] += other.counts[b];
}

uint64_t Histogram::total() const noexcept {
  uint64_t sum = 0;
  for (uint64_t c : counts) sum += c;
  return sum;
}

double Histogram::percentile_ns(double q) const noexcept {
  const uint64_t total = this->total();
  if (total == 0) return 0.0;
  if (!(q > 0.0)) q = 0.0;  // also NaN
  if (q > 1.0) q = 1.0;
  // The value of rank ceil(q * total) (1-based); q = 0 asks for the smallest.
  auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  rank = std::clamp<uint64_t>(rank, 1, total);
  uint64_t below = 0;
  for (int b = 0; b < kBuckets; ++b) {
    const uint64_t c = counts[b];
    if (c == 0) continue;
    if (below + c >= rank) {
      const auto lower = static_cast<double>(bucket_lower(b));
      const auto width = static_cast<double>(bucket_upper(b) - bucket_lower(b));
      if (width <= 1.0) return lower;  // an exact bucket
      // The c values are taken as spread evenly over the bucket, each at the middle of its
      // 1/c share.
      const double position = (static_cast<double>(rank - below) - 0.5) / static_cast<double>(c);
      return lower + width * position;
    }
    below += c;
  }
  return static_cast<double>(bucket_lower(kBuckets - 1));  // not reached
}

double BrickStats::avg_us() const noexcept {
  if (count == 0) return 0.0;
  return static_cast<double>(total_ns) / static_cast<double>(count) / 1000.0;
}

double BrickStats::percentile_ns(double q) const noexcept {
  if (count == 0) return 0.0;
  return std::clamp(histogram.percentile_ns(q), static_cast<double>(min_ns),
                    static_cast<double>(max_ns));
}

}  // namespace brick::registry
