// Histograms of per-call durations (their buckets: buckets.h) and the per-call figures of a
// brick derived from them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

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
  double value = 0.0;
  percentiles_ns({&q, 1}, {&value, 1});
  return value;
}

void Histogram::percentiles_ns(std::span<const double> qs, std::span<double> out, int first,
                               int last) const noexcept {
  first = std::clamp(first, 0, kBuckets - 1);
  last = std::clamp(last, first, kBuckets - 1);
  uint64_t total = 0;
  for (int b = first; b <= last; ++b) total += counts[b];
  size_t next = 0;  // the next percentile to find
  const size_t wanted = std::min(qs.size(), out.size());
  if (total == 0) {
    for (; next < wanted; ++next) out[next] = 0.0;
    return;
  }
  // The value of rank ceil(q * total) (1-based); q = 0 asks for the smallest.
  uint64_t below = 0;
  auto rank_of = [total, &below](double q) {
    if (!(q > 0.0)) q = 0.0;  // also NaN
    if (q > 1.0) q = 1.0;
    const auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
    // (never below the bucket being read: a q smaller than the one before it reads there)
    return std::clamp<uint64_t>(rank, below + 1, total);
  };
  for (int b = first; b <= last && next < wanted; ++b) {
    const uint64_t c = counts[b];
    if (c == 0) continue;
    const auto lower = static_cast<double>(bucket_lower(b));
    const auto width = static_cast<double>(bucket_upper(b) - bucket_lower(b));
    for (uint64_t rank = rank_of(qs[next]); below + c >= rank; rank = rank_of(qs[next])) {
      // An exact bucket holds one value; otherwise its c values are taken as spread evenly
      // over it, each at the middle of its 1/c share.
      out[next] = width <= 1.0 ? lower
                               : lower + width * (static_cast<double>(rank - below) - 0.5) /
                                             static_cast<double>(c);
      if (++next == wanted) return;
    }
    below += c;
  }
  for (; next < wanted; ++next) out[next] = static_cast<double>(bucket_lower(last));  // not reached
}

double BrickStats::avg_us() const noexcept {
  if (count == 0) return 0.0;
  return static_cast<double>(total_ns) / static_cast<double>(count) / 1000.0;
}

double BrickStats::percentile_ns(double q) const noexcept {
  double value = 0.0;
  percentiles_ns({&q, 1}, {&value, 1});
  return value;
}

void BrickStats::percentiles_ns(std::span<const double> qs, std::span<double> out) const noexcept {
  const size_t wanted = std::min(qs.size(), out.size());
  if (count == 0 || min_ns > max_ns) {
    for (size_t i = 0; i < wanted; ++i) out[i] = 0.0;
    return;
  }
  histogram.percentiles_ns(qs, out, bucket_index(min_ns), bucket_index(max_ns));
  for (size_t i = 0; i < wanted; ++i) {
    out[i] = std::clamp(out[i], static_cast<double>(min_ns), static_cast<double>(max_ns));
  }
}

}  // namespace brick::registry
