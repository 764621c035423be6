// The plain-C++ floor every layer shares (csrc/common).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/chunked_log.h"
#include "common/steady_clock.h"
#include "common/thread_claims.h"

namespace {

TEST(SteadyClockTest, NeverGoesBackAndMeasuresASleep) {
  int64_t previous = brick::steady_ns();
  for (int i = 0; i < 100000; ++i) {
    const int64_t now = brick::steady_ns();
    ASSERT_GE(now, previous) << "read " << i;
    previous = now;
  }
  const int64_t before = brick::steady_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const int64_t slept = brick::steady_ns() - before;
  EXPECT_GE(slept, 5'000'000);
  EXPECT_LT(slept, 5'000'000'000) << "a 5 ms sleep read as " << slept << " ns";
}

TEST(SteadyClockTest, OneClockForEveryThread) {
  // A stamp taken on one thread after another thread's stamp is published is not earlier.
  std::atomic<int64_t> published{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      published.store(brick::steady_ns(), std::memory_order_release);
    }
  });
  for (int i = 0; i < 100000; ++i) {
    const int64_t seen = published.load(std::memory_order_acquire);
    ASSERT_GE(brick::steady_ns(), seen) << "read " << i;
  }
  stop = true;
  writer.join();
}

// An owner of per-thread objects, as a registry owns shards: claims hand back one an exited
// thread gave up, else a new one.
struct Item {
  std::atomic<bool> owned{true};
  int writes = 0;
};
using ItemClaims = brick::ThreadClaims<Item>;

struct Owner {
  explicit Owner(uint64_t owner_id) : id(owner_id) {}
  uint64_t id;
  std::mutex mutex;
  std::vector<std::shared_ptr<Item>> items;
  int made = 0;
  Item* mine() {
    return ItemClaims::mine(id, [this] {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& item : items) {
        bool free = false;
        if (item->owned.compare_exchange_strong(free, true)) return item;
      }
      ++made;
      return items.emplace_back(std::make_shared<Item>());
    });
  }
};

TEST(ThreadClaimsTest, EachThreadWritesItsOwnObjectAndAnExitedThreadsIsTakenOver) {
  Owner owner(101);
  Item* main_item = owner.mine();
  EXPECT_EQ(owner.mine(), main_item) << "the same object on every call of one thread";
  EXPECT_EQ(ItemClaims::held(owner.id), main_item);
  Item* first = nullptr;
  std::thread([&] {
    first = owner.mine();
    first->writes += 1;
  }).join();
  EXPECT_NE(first, main_item) << "another thread, another object";
  EXPECT_FALSE(first->owned.load()) << "given back when its thread exited";
  Item* second = nullptr;
  std::thread([&] { second = owner.mine(); }).join();
  EXPECT_EQ(second, first) << "the next thread takes over what an exited one gave back";
  EXPECT_EQ(second->writes, 1) << "with what was written in it";
  EXPECT_EQ(owner.made, 2);
}

TEST(ThreadClaimsTest, OwnersAreToldApartAndAThreadHoldsOneObjectOfEach) {
  Owner a(201), b(202);
  Item* from_a = a.mine();
  Item* from_b = b.mine();
  EXPECT_NE(from_a, from_b);
  EXPECT_EQ(a.mine(), from_a) << "past the one-entry cache, found among the thread's claims";
  EXPECT_EQ(b.mine(), from_b);
  EXPECT_EQ(ItemClaims::held(303), nullptr) << "nothing is claimed by asking";
}

TEST(ThreadClaimsTest, AThreadClaimsNothingOnceItsClaimsWereGivenBack) {
  // A thread_local constructed before the thread's claim list is destroyed after it: what its
  // destructor asks for is refused (nullptr), never claimed again after the hand-back.
  static Owner owner(401);
  static std::atomic<Item*> asked_at_exit{reinterpret_cast<Item*>(1)};
  struct AtExit {
    ~AtExit() { asked_at_exit.store(owner.mine()); }
  };
  std::thread([] {
    thread_local AtExit at_exit;
    (void)&at_exit;
    ItemClaims::prepare_thread();
    EXPECT_NE(owner.mine(), nullptr);
  }).join();
  EXPECT_EQ(asked_at_exit.load(), nullptr);
  EXPECT_EQ(owner.made, 1);
}

}  // namespace

namespace chunked_log_test {

struct Record {
  uint64_t id;
  int64_t value;
};

TEST(ChunkedLog, KeepsEveryRecordInOrderAcrossBlocksAndReusesItsFirstBlockAfterClear) {
  brick::ChunkedLog<Record> log;
  EXPECT_TRUE(log.empty());
  const size_t count = 2 * brick::ChunkedLog<Record>::kPerBlock + 7;  // three blocks
  for (size_t i = 0; i < count; ++i) log.push_back({i, -static_cast<int64_t>(i)});
  EXPECT_EQ(log.size(), count);
  std::vector<Record> out = {{999, 999}};
  log.append_to(out);
  ASSERT_EQ(out.size(), count + 1);
  EXPECT_EQ(out[0].id, 999u) << "appended after what was there";
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(out[i + 1].id, i);
    ASSERT_EQ(out[i + 1].value, -static_cast<int64_t>(i));
  }
  log.clear();
  EXPECT_TRUE(log.empty());
  log.push_back({5, 6});
  out.clear();
  log.append_to(out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].id, 5u);
}

}  // namespace chunked_log_test
