// One collective's mechanics (BrickProcessGroup::Call): checks its tensors (all brick on the
// rank's device, or all CPU), maps brick tensors to their backing aliases, scales the inputs of a
// reduction the engine lacks, launches the engine's collective and wraps its Work. For
// process_group.cpp, which forwards each c10d call to one.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "backend/backing.h"
#include "backend/device_index.h"
#include "backend/errors.h"
#include "common/steady_clock.h"
#include "distributed/collective_work.h"
#include "distributed/collectives.h"
#include "distributed/process_group.h"
#include "runtime/launch_observer.h"
#include "runtime/runtime.h"

namespace brick::distributed {

// One collective: checks its tensors (all brick on the rank's device, or all CPU), maps brick
// tensors to their backing aliases, picks the engine and wraps its Work.
struct BrickProcessGroup::Call {
  Call(BrickProcessGroup& group, Collective op) : pg(group), op(op) {}

  // "brick c10d: rank R of N: <collective>", for errors.
  std::string where() const;

  // Checks a tensor and returns what the engine gets: a CPU tensor itself, a brick tensor's
  // backing alias (the tensor held until the collective is done). `counts_as_input`: its bytes
  // count as the rank's contribution.
  at::Tensor map(const at::Tensor& tensor, bool counts_as_input);
  std::vector<at::Tensor> map(const std::vector<at::Tensor>& tensors, bool counts_as_input);
  std::vector<std::vector<at::Tensor>> map(const std::vector<std::vector<at::Tensor>>& lists,
                                           bool counts_as_input);

  // The engine for this collective's tensors (known once they are mapped).
  c10d::Backend& engine() const { return on_brick ? *pg.brick_engine_ : *pg.cpu_engine_; }

  // PREMUL_SUM(f), and AVG on floating tensors, on an engine without them (gloo has no
  // PREMUL_SUM; AVG is new in it): the inputs are scaled by f (1 / group size for AVG, which is
  // how NCCL computes a floating AVG), then the engine sums. `in_place`: the inputs are the
  // outputs (all_reduce); otherwise scaled copies are summed and the caller's inputs stay as
  // they are. Returns the options the engine gets.
  template <typename Options>
  Options premultiplied(const Options& opts, std::vector<at::Tensor>& inputs, bool in_place) {
    const auto op = opts.reduceOp.op_;
    if (op != c10d::ReduceOp::PREMUL_SUM && op != c10d::ReduceOp::AVG) return opts;
    if (engine().getBackendName() == "nccl") return opts;  // NCCL has both
    if (op == c10d::ReduceOp::AVG) {
      for (const auto& t : inputs) {
        if (!at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type())) {
          return opts;  // an integer AVG is the engine's to compute or refuse
        }
      }
    }
    std::optional<double> factor;
    at::Tensor factor_tensor;
    if (op == c10d::ReduceOp::AVG) {
      factor = 1.0 / static_cast<double>(pg.getSize());
    } else {
      const auto* supplement =
          dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(opts.reduceOp.supplement_.get());
      TORCH_CHECK_VALUE(supplement != nullptr, where(), ": ReduceOp.PREMUL_SUM without its factor");
      if (supplement->tensor_factor.defined()) {
        factor_tensor = supplement->tensor_factor.device().is_cpu()
                            ? supplement->tensor_factor
                            : supplement->tensor_factor.to(at::kCPU);
      } else {
        factor = supplement->double_factor;
      }
    }
    std::optional<backend::BackingScope> scope;
    if (on_brick) scope.emplace(brick_device);
    for (auto& t : inputs) {
      const at::Tensor scale = factor ? at::scalar_tensor(*factor, t.options().dtype(at::kDouble))
                                      : factor_tensor.to(t.device());
      if (in_place) {
        t.mul_(scale);
      } else {
        t = t.mul(scale).to(t.scalar_type());
      }
    }
    Options summed = opts;
    summed.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
    return summed;
  }

  // Runs the engine's collective with brick's current device (and, on CUDA backing, its current
  // stream) as the backing device's current ones, and wraps the Work.
  // A collective on brick memory is device work: an activity profiler that records (torch.profiler
  // with brick's device activity) sees it from its enqueue until its engine completes it.
  template <typename EngineCall>
  c10::intrusive_ptr<c10d::Work> run(EngineCall&& engine_call, std::vector<at::Tensor> results) {
    c10d::Backend& engine = this->engine();
    auto& counter = collective_counters()[static_cast<size_t>(op)];
    const runtime::LaunchHooks& hooks = runtime::launch_hooks();
    if (on_brick) runtime::announce_queue(hooks, brick_device);
    runtime::LaunchObserver* observer = on_brick ? hooks.observer : nullptr;
    runtime::Launch launch;
    if (observer != nullptr) {
      launch.name = engine_collective_name(engine.getBackendName(), op);
      launch.kind = runtime::LaunchKind::Collective;
      launch.device = brick_device;
      launch.bytes = bytes;
      launch.group_size = pg.getSize();
      observer->begin(launch);
      observer->queue(launch);
    }
    const bool on_cuda = on_brick && backend::cuda_backing();
    runtime::Event* start = nullptr;
    if (on_cuda) {
      start = backend::runtime_call([&] { return backend::rt().create_event(brick_device, true); });
      BRICK_RUNTIME_CALL(backend::rt().record_event(start, brick_device,
                                                    backend::rt().current_stream(brick_device)));
    }
    const int64_t enqueued_ns = steady_ns();
    c10::intrusive_ptr<c10d::Work> work;
    try {
      std::optional<backend::BackingScope> scope;
      if (on_brick) scope.emplace(brick_device);
      work = engine_call(engine);
    } catch (...) {
      if (start != nullptr) backend::rt().destroy_event(start);
      throw;
    }
    counter.calls.fetch_add(1, std::memory_order_relaxed);
    counter.bytes.fetch_add(bytes, std::memory_order_relaxed);
    counter.group_size.store(pg.getSize(), std::memory_order_relaxed);
    if (!work) return queued_without_work(counter, observer, launch, start);
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
      future = work->getFuture();
    } catch (const c10::Error&) {  // an engine Work without a future: not timed
    }
    if (on_cuda && future && future->completed()) {
      // NCCL: completed at enqueue, with CUDA events on its stream (ProcessGroupNCCL).
      auto timing = std::make_shared<DeviceTiming>(
          DeviceTiming{&counter, observer, launch, brick_device, start, nullptr});
      c10::intrusive_ptr<c10::ivalue::Future> device_future;
      try {
        device_future = order_after_engine(*future, results, *timing);
      } catch (...) {
        backend::rt().destroy_event(start);
        if (timing->done != nullptr) backend::rt().destroy_event(timing->done);
        throw;
      }
      track_in_flight(InFlight{work, nullptr, std::move(timing), std::move(held)});
      return c10::make_intrusive<BrickWork>(
          std::move(work), future, std::move(device_future), std::move(results),
          std::optional<c10::DeviceIndex>(brick_device), pg.getRank(), where());
    }
    if (start != nullptr) backend::rt().destroy_event(start);  // an engine without that future
    // The caller's Work first: its callback on the engine's future (which completes the brick
    // future with the brick tensors) then runs, and is dropped, before the timing callback below
    // completes `timed`; once `timed` has completed the engine's thread holds no brick tensor,
    // so the in-flight entry, released on a caller's thread, holds the last references.
    c10::intrusive_ptr<c10d::Work> caller_work = work;
    if (on_brick) {
      caller_work = c10::make_intrusive<BrickWork>(work, future, nullptr, std::move(results),
                                                   std::optional<c10::DeviceIndex>(brick_device),
                                                   pg.getRank(), where());
    }
    c10::intrusive_ptr<c10::ivalue::Future> timed;
    if (future) {
      // The engine completes the future when the collective is done (gloo: on its thread).
      timed = future->then(
          [&counter, enqueued_ns, observer, launch](c10::ivalue::Future& done) {
            if (!done.hasError()) {
              counter.time_ns.fetch_add(steady_ns() - enqueued_ns, std::memory_order_relaxed);
              counter.timed_calls.fetch_add(1, std::memory_order_relaxed);
              if (observer != nullptr) observer->collective_done(launch);
            }
            return c10::IValue();
          },
          c10::NoneType::get());
    }
    track_in_flight(InFlight{std::move(work), timed, nullptr, std::move(held)});
    return caller_work;
  }

  // An engine that gives no Work: NCCL asked for a synchronous collective (asyncOp false, c10d's
  // default for dist.all_reduce(t) and the like) queues it on the current stream, brick's here
  // (the scope made it the current CUDA stream), and returns none; c10d then waits for nothing,
  // the stream itself orders what follows. Brick answers the same way. On CUDA backing the
  // collective's device time ends at an event on that stream, and its tensors are held until
  // the stream passes it.
  c10::intrusive_ptr<c10d::Work> queued_without_work(CollectiveCounter& counter,
                                                     runtime::LaunchObserver* observer,
                                                     const runtime::Launch& launch,
                                                     runtime::Event* start);

  // CUDA backing: a pooled brick side stream is made to wait for the engine's completion events
  // (no host wait: `engine_future` is complete, its events are on NCCL's stream), and on it
  //  - `timing.done` is recorded (the collective's device time ends there),
  //  - every brick tensor of the collective is recorded as in use (brick's record_stream: the
  //    caching allocator reuses none of their memory before the side stream passes that point,
  //    though the engine's aliases do not own it),
  //  - the returned future, on the brick device, is completed: its wait() or then() orders the
  //    caller's stream after the collective, as ProcessGroupNCCL's future does for cuda tensors.
  c10::intrusive_ptr<c10::ivalue::Future> order_after_engine(c10::ivalue::Future& engine_future,
                                                             const std::vector<at::Tensor>& values,
                                                             DeviceTiming& timing);

  BrickProcessGroup& pg;
  Collective op;
  bool seen = false;
  bool on_brick = false;
  bool device_set = false;
  c10::DeviceIndex brick_device = 0;  // of the brick tensors (barrier: the bound or current one)
  uint64_t bytes = 0;
  std::vector<at::Tensor> held;  // the brick tensors: kept alive until the collective is done
};

}  // namespace brick::distributed
