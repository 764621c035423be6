// Objects a thread writes alone, one per thread and owner: a registry's shards, a timeline's
// logs. A thread finds its own in a one-entry cache (the fast path: one trivial initial-exec
// thread_local, so no initialization guard and a direct %fs access even inside a dlopen()ed
// module), else among the claims it holds, else claims one from the owner (one that an exited
// thread gave back, or a new one). When the thread exits it gives every claim back (the object's
// `owned` flag goes false, for another thread to take over) and claims nothing more. Owners are
// told apart by ids never reused, and hold their objects by std::shared_ptr; a thread's claim is
// weak, so an owner that dies first leaves it expired. Plain C++, the floor below every layer.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace brick {

// T has `std::atomic<bool> owned`: true while a thread holds it.
template <typename T>
class ThreadClaims {
 public:
  // The calling thread's object of owner `owner_id`; nullptr once the thread is exiting. A
  // thread with none yet gets `claim()`'s: a std::shared_ptr<T> the owner keeps, marked owned
  // (what claim() throws propagates, and nothing is recorded).
  template <typename Claim>
  static T* mine(uint64_t owner_id, Claim&& claim) {
    const Cache cache = cache_;
    if (cache.owner_id == owner_id) [[likely]]
      return cache.object;
    return mine_slow(owner_id, claim);
  }

  // The object the calling thread holds of owner `owner_id` (none is claimed), or nullptr.
  static T* held(uint64_t owner_id) noexcept {
    if (cache_.exiting) return nullptr;
    if (cache_.owner_id == owner_id) return cache_.object;
    for (const Claim& claim : claims().list) {
      if (claim.owner_id == owner_id) return claim.object;
    }
    return nullptr;
  }

  // Constructs the calling thread's claim list now: thread_locals die in reverse order of
  // construction, so one constructed after this can still record while it is destroyed.
  static void prepare_thread() { (void)claims(); }

 private:
  struct Cache {
    uint64_t owner_id;  // 0: none
    T* object;
    bool exiting;  // the thread's claims were given back: nothing more is claimed
  };
  struct Claim {
    uint64_t owner_id;
    T* object;  // valid while the owner with that id lives
    std::weak_ptr<T> object_alive;
  };
  struct Claims {
    std::vector<Claim> list;
    Claims() = default;
    Claims(const Claims&) = delete;
    Claims& operator=(const Claims&) = delete;
    ~Claims() {
      cache_ = {0, nullptr, true};  // a thread_local destructor that records later is ignored
      for (const Claim& claim : list) {
        if (auto object = claim.object_alive.lock()) {
          object->owned.store(false, std::memory_order_release);
        }
      }
    }
  };

  static Claims& claims() {
    thread_local Claims claims;
    return claims;
  }

  template <typename MakeClaim>
  [[gnu::noinline]] static T* mine_slow(uint64_t owner_id, MakeClaim& claim) {
    if (cache_.exiting) return nullptr;
    Claims& mine = claims();
    for (const Claim& held : mine.list) {
      if (held.owner_id == owner_id) {
        cache_ = {owner_id, held.object, false};
        return held.object;
      }
    }
    std::erase_if(mine.list, [](const Claim& held) { return held.object_alive.expired(); });
    mine.list.reserve(mine.list.size() + 1);  // so that the object claimed below is recorded
    std::shared_ptr<T> object = claim();
    mine.list.push_back({owner_id, object.get(), object});
    cache_ = {owner_id, object.get(), false};
    return object.get();
  }

  [[gnu::tls_model("initial-exec")]] static inline constinit thread_local Cache cache_{0, nullptr,
                                                                                       false};
};

}  // namespace brick
