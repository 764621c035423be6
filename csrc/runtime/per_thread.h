// A per-thread object for the layers' caches and pools (alias pools, event-slot caches, ...):
// built on a thread's first use, destroyed at its exit, and reached through an initial-exec TLS
// pointer, a direct %fs access even inside a dlopen()ed module (the object itself lives in a
// thread_local of its own, outside static TLS). Plain C++.
#pragma once

namespace brick::runtime {

template <typename T>
class PerThread {
 public:
  // The calling thread's object, built if needed; nullptr once it was destroyed (thread exit: a
  // later thread_local destructor must neither rebuild nor touch it).
  static T* get() {
    T* object = current_;
    return object != nullptr ? object : create();
  }
  // The calling thread's object if it has one now (for paths that must not build it).
  static T* get_if_made() noexcept { return current_; }

 private:
  struct Holder {
    T object;
    ~Holder() {  // before `object` is destroyed: what its destruction triggers sees none
      current_ = nullptr;
      gone_ = true;
    }
  };

  [[gnu::noinline]] static T* create() {
    if (gone_) return nullptr;
    thread_local Holder holder;
    current_ = &holder.object;
    return current_;
  }

  [[gnu::tls_model("initial-exec")]] static constinit inline thread_local T* current_ = nullptr;
  [[gnu::tls_model("initial-exec")]] static constinit inline thread_local bool gone_ = false;
};

}  // namespace brick::runtime
