// A collective's completion: the Work the caller sees (BrickWork), its device timing on CUDA
// backing (DeviceTiming), and the collectives in flight that wait_for_collectives() waits for.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "backend/backing.h"
#include "backend/device_index.h"
#include "distributed/collectives.h"
#include "runtime/launch_observer.h"
#include "runtime/runtime.h"

namespace brick::distributed {

// A collective's Work as the caller sees it: the engine's Work over the aliases, answering with
// the brick tensors the caller passed (result(), the future's value), so DDP's comm hooks and
// functional collectives get brick tensors back.
class BrickWork final : public c10d::Work {
 public:
  // `inner_future`: the engine Work's future, null for a Work without one (getFuture() then
  // says so when asked).
  // `device_future`: on CUDA backing, the collective's future on the brick device, already
  // completed on a brick stream that waits for the engine (see order_after_engine); otherwise
  // null, and the future completes when the engine's does.
  BrickWork(c10::intrusive_ptr<c10d::Work> inner,
            const c10::intrusive_ptr<c10::ivalue::Future>& inner_future,
            c10::intrusive_ptr<c10::ivalue::Future> device_future, std::vector<at::Tensor> outputs,
            std::optional<c10::DeviceIndex> brick_device, int rank, std::string where)
      : Work(rank, inner->retrieveOpType()),
        inner_(std::move(inner)),
        outputs_(std::move(outputs)),
        brick_device_(brick_device),
        where_(std::move(where)),
        future_(std::move(device_future)) {
    if (future_ || !inner_future) return;
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    inner_future->addCallback([future = future_, outputs = outputs_](c10::ivalue::Future& done) {
      if (done.hasError()) {
        future->setError(done.exception_ptr());
      } else {
        future->markCompleted(c10::IValue(outputs));
      }
    });
  }

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {
    std::optional<backend::BackingScope> scope;
    if (brick_device_) scope.emplace(*brick_device_);
    inner_->synchronize();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    // On CUDA backing the engine makes the current CUDA stream wait: brick's current stream.
    std::optional<backend::BackingScope> scope;
    if (brick_device_) scope.emplace(*brick_device_);
    try {
      return inner_->wait(timeout);
    } catch (const c10::DistBackendError& error) {
      // The engine's message names a socket or a timeout; say which rank and collective.
      C10_THROW_ERROR(DistBackendError,
                      c10::str(where_, " failed: ", error.what_without_backtrace()));
    } catch (const c10::Error& error) {
      TORCH_CHECK(false, where_, " failed: ", error.what_without_backtrace());
    } catch (const std::exception& error) {  // gloo's own (a closed connection, a timeout)
      C10_THROW_ERROR(DistBackendError, c10::str(where_, " failed: ", error.what()));
    }
  }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_ ? future_ : inner_->getFuture();
  }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::vector<at::Tensor> outputs_;
  std::optional<c10::DeviceIndex> brick_device_;
  std::string where_;  // "brick c10d: rank R of N: <collective>", for errors
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A collective on CUDA backing, timed on the device: NCCL completes its Work's future when it
// enqueues, so the time from enqueue to that completion would be the enqueue's. Two brick events
// bound it instead: `start` on the caller's stream before the enqueue (NCCL's stream waits for
// that stream), `done` on a side stream that waits for NCCL's own completion events.
struct DeviceTiming {
  CollectiveCounter* counter;
  runtime::LaunchObserver* observer;  // (with `launch`) the device activity to report, if any
  runtime::Launch launch;
  c10::DeviceIndex device;
  runtime::Event* start;
  runtime::Event* done;

  bool completed() const { return backend::rt().query_event(done); }
  // Accounts the collective (its counter, its device activity) and frees the events. Once.
  void settle() noexcept {
    try {
      const double ms = backend::rt().elapsed_ms(start, done);
      const auto ns = static_cast<int64_t>(ms * 1e6);
      counter->time_ns.fetch_add(ns, std::memory_order_relaxed);
      counter->timed_calls.fetch_add(1, std::memory_order_relaxed);
      if (observer != nullptr) observer->collective_done(launch, ns);
    } catch (...) {  // a failed collective: its Work reports it; it is just not timed
    }
    backend::rt().destroy_event(start);
    backend::rt().destroy_event(done);
  }
};

// The engine Works not known to be finished: what wait_for_collectives() waits for. A lock per
// collective (milliseconds of communication each), never per op.
struct InFlight {
  c10::intrusive_ptr<c10d::Work> work;  // none: the engine queued it on a stream and gave none
  c10::intrusive_ptr<c10::ivalue::Future> timed;  // completes once the collective is accounted
  std::shared_ptr<DeviceTiming> device_timing;    // CUDA backing: settled once done
  // The collective's brick tensors: the engine works on aliases that do not own their memory.
  // Released once it is done, on a thread that calls into brick (never on the engine's own:
  // the last reference to a tensor can drop its Python object, which needs the interpreter).
  std::vector<at::Tensor> held;
  bool done() const {
    return (!work || work->isCompleted()) && (!timed || timed->completed()) &&
           (!device_timing || device_timing->completed());
  }
};

// Tracks a collective until it is done, settling (and releasing) those in flight that are.
void track_in_flight(InFlight in_flight);

// Waits until every collective brick's process groups have started so far has finished,
// including its engine's own completion steps (gloo ends its profiling range after completing
// the future DDP waits on) and brick's accounting of it (its time, its device activity). Errors
// are left to the collective's own Work; returns how many collectives it waited for.
size_t wait_for_collectives();

}  // namespace brick::distributed
