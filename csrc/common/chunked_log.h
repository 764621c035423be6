// An append-only log of trivially copyable records, in blocks mapped straight from the OS: an
// append never copies what the log holds, and the log's memory never lies in the malloc heap
// among the op path's small allocations. (Records growing at the heap's top made each free of an
// op's small allocations merge into the top and consolidate the heap: ~2 µs more per op, and
// stalls of milliseconds, in a long profile.) Not thread-safe: its owner locks.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <new>
#include <type_traits>
#include <vector>

namespace brick {

template <typename T>
class ChunkedLog {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

 public:
  static constexpr size_t kBlockBytes = size_t{1} << 20;
  static constexpr size_t kPerBlock = kBlockBytes / sizeof(T);

  ChunkedLog() = default;
  ChunkedLog(const ChunkedLog&) = delete;
  ChunkedLog& operator=(const ChunkedLog&) = delete;
  ~ChunkedLog() {
    for (T* block : blocks_) munmap(block, kBlockBytes);
  }

  // Throws std::bad_alloc when no block can be had; the log is then as it was.
  void push_back(const T& record) {
    const size_t block = size_ / kPerBlock;
    if (block == blocks_.size()) add_block();
    blocks_[block][size_ % kPerBlock] = record;
    ++size_;
  }

  size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }

  // Appends every record, oldest first, to `out`.
  void append_to(std::vector<T>& out) const {
    out.reserve(out.size() + size_);
    for (size_t block = 0; block * kPerBlock < size_; ++block) {
      const size_t count = std::min(kPerBlock, size_ - block * kPerBlock);
      out.insert(out.end(), blocks_[block], blocks_[block] + count);
    }
  }

  // Forgets every record; keeps the first block for the next ones, returns the rest.
  void clear() noexcept {
    for (size_t block = 1; block < blocks_.size(); ++block) munmap(blocks_[block], kBlockBytes);
    if (blocks_.size() > 1) blocks_.erase(blocks_.begin() + 1, blocks_.end());
    size_ = 0;
  }

 private:
  void add_block() {
    blocks_.reserve(blocks_.size() + 1);  // first: a failure here leaves no block unmapped
    void* block =
        mmap(nullptr, kBlockBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) throw std::bad_alloc();
    blocks_.push_back(static_cast<T*>(block));
  }

  std::vector<T*> blocks_;
  size_t size_ = 0;
};

}  // namespace brick
