#include "distributed/process_group.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "backend/allocator.h"
#include "backend/backing.h"
#include "backend/backing_alias.h"
#include "backend/device_index.h"
#include "backend/errors.h"
#include "common/steady_clock.h"
#include "runtime/launch_observer.h"

namespace brick::distributed {

namespace {

constexpr std::array<const char*, static_cast<size_t>(Collective::Count)> kNames = {
    "broadcast",
    "all_reduce",
    "all_reduce_coalesced",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "all_gather_into_tensor_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "send",
    "recv"};

// "<engine>:<collective>" (the engine's own range names, e.g. "gloo:all_reduce"): the name of a
// collective's device activity. Made once; launch names must outlive every profile.
const char* engine_collective_name(const std::string& engine, Collective op) {
  static const auto* names = [] {
    auto* made = new std::array<std::array<std::string, kNames.size()>, 3>();
    const char* engines[] = {"gloo", "nccl", "c10d"};
    for (size_t e = 0; e < made->size(); ++e) {
      for (size_t i = 0; i < kNames.size(); ++i)
        (*made)[e][i] = c10::str(engines[e], ":", kNames[i]);
    }
    return made;
  }();
  const size_t e = engine == "gloo" ? 0 : engine == "nccl" ? 1 : 2;
  return (*names)[e][static_cast<size_t>(op)].c_str();
}

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
std::mutex g_in_flight_mutex;
std::vector<InFlight> g_in_flight;

void track_in_flight(InFlight in_flight) {
  std::vector<InFlight> finished;  // released after the lock (see InFlight::held)
  {
    std::lock_guard<std::mutex> lock(g_in_flight_mutex);
    for (auto it = g_in_flight.begin(); it != g_in_flight.end();) {
      bool done = false;
      try {
        done = it->done();
      } catch (...) {  // a failed collective: reported by its own Work, settled here
        done = true;
      }
      if (!done) {
        ++it;
        continue;
      }
      if (it->device_timing) it->device_timing->settle();
      finished.push_back(std::move(*it));
      it = g_in_flight.erase(it);
    }
    g_in_flight.push_back(std::move(in_flight));
  }
}

}  // namespace

size_t wait_for_collectives() {
  std::vector<InFlight> works;
  {
    std::lock_guard<std::mutex> lock(g_in_flight_mutex);
    works.swap(g_in_flight);
  }
  for (const auto& in_flight : works) {
    try {
      if (in_flight.work) in_flight.work->wait();
      if (in_flight.timed) in_flight.timed->wait();
      if (in_flight.device_timing) backend::rt().synchronize_event(in_flight.device_timing->done);
    } catch (...) {  // the collective's failure is reported by its own Work
    }
    if (in_flight.device_timing) in_flight.device_timing->settle();
  }
  return works.size();
}

std::array<CollectiveCounter, static_cast<size_t>(Collective::Count)>& collective_counters() {
  static auto* counters = [] {
    auto* made = new std::array<CollectiveCounter, static_cast<size_t>(Collective::Count)>();
    for (size_t i = 0; i < made->size(); ++i) (*made)[i].name = kNames[i];
    return made;
  }();
  return *counters;
}

// One collective: checks its tensors (all brick on the rank's device, or all CPU), maps brick
// tensors to their backing aliases, picks the engine and wraps its Work.
struct BrickProcessGroup::Call {
  Call(BrickProcessGroup& group, Collective op) : pg(group), op(op) {}

  std::string where() const {
    return c10::str("brick c10d: rank ", pg.getRank(), " of ", pg.getSize(), ": ",
                    kNames[static_cast<size_t>(op)]);
  }

  at::Tensor map(const at::Tensor& tensor, bool counts_as_input) {
    TORCH_CHECK_VALUE(tensor.defined(), where(), ": got an undefined tensor");
    const bool brick = tensor.device().type() == c10::DeviceType::PrivateUse1;
    TORCH_CHECK_VALUE(brick || tensor.device().is_cpu(), where(), ": got a tensor on ",
                      tensor.device(), "; the brick backend takes brick and CPU tensors");
    if (!seen) {
      on_brick = brick;
      seen = true;
    } else {
      TORCH_CHECK_VALUE(brick == on_brick, where(),
                        ": mixes brick and CPU tensors; expected all of them on one brick device "
                        "or all on the CPU");
    }
    if (counts_as_input) bytes += tensor.nbytes();
    if (!brick) return tensor;
    // The engine gets aliases that do not own brick memory: the tensors themselves are held
    // until the collective is done (see run()), whatever the caller drops meanwhile.
    held.push_back(tensor);
    const c10::DeviceIndex device = tensor.device().index();
    if (!device_set) {
      // The rank's device is fixed by its first collective on brick tensors (as NCCL binds a
      // communicator to the device of its first use).
      c10::DeviceIndex unbound = -1;
      pg.device_.compare_exchange_strong(unbound, device);
      device_set = true;
    }
    const c10::DeviceIndex bound = pg.device_.load();
    TORCH_CHECK_VALUE(device == bound, where(), ": a tensor is on brick:", static_cast<int>(device),
                      " but this rank's collectives run on brick:", static_cast<int>(bound),
                      " (one brick device per rank, fixed by its first collective, as with NCCL: "
                      "call torch.brick.set_device(local_rank) before the first collective)");
    brick_device = device;
    return backend::make_backing_alias(tensor);
  }

  std::vector<at::Tensor> map(const std::vector<at::Tensor>& tensors, bool counts_as_input) {
    std::vector<at::Tensor> aliases;
    aliases.reserve(tensors.size());
    for (const auto& t : tensors) aliases.push_back(map(t, counts_as_input));
    return aliases;
  }

  std::vector<std::vector<at::Tensor>> map(const std::vector<std::vector<at::Tensor>>& lists,
                                           bool counts_as_input) {
    std::vector<std::vector<at::Tensor>> aliases;
    aliases.reserve(lists.size());
    for (const auto& list : lists) aliases.push_back(map(list, counts_as_input));
    return aliases;
  }

  // Runs the engine's collective with brick's current device (and, on CUDA backing, its current
  // stream) as the backing device's current ones, and wraps the Work.
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

  // A collective on brick memory is device work: an activity profiler that records (torch.profiler
  // with brick's device activity) sees it from its enqueue until its engine completes it.
  template <typename EngineCall>
  c10::intrusive_ptr<c10d::Work> run(EngineCall&& engine_call, std::vector<at::Tensor> results) {
    c10d::Backend& engine = this->engine();
    auto& counter = collective_counters()[static_cast<size_t>(op)];
    if (on_brick) runtime::announce_queue(brick_device);
    runtime::LaunchObserver* observer = on_brick ? runtime::launch_observer() : nullptr;
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
                                                     runtime::Event* start) {
    if (start == nullptr) return {};
    auto timing = std::make_shared<DeviceTiming>(
        DeviceTiming{&counter, observer, launch, brick_device, start, nullptr});
    try {
      auto& rt = backend::rt();
      timing->done = backend::runtime_call([&] { return rt.create_event(brick_device, true); });
      BRICK_RUNTIME_CALL(
          rt.record_event(timing->done, brick_device, rt.current_stream(brick_device)));
    } catch (...) {
      backend::rt().destroy_event(start);
      if (timing->done != nullptr) backend::rt().destroy_event(timing->done);
      throw;
    }
    track_in_flight(InFlight{nullptr, nullptr, std::move(timing), std::move(held)});
    return {};
  }

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
                                                             DeviceTiming& timing) {
    auto& rt = backend::rt();
    const runtime::StreamId side = backend::pooled_brick_stream(brick_device, false);
    const c10::Device device(backend::kBrick, brick_device);
    // Brick's current stream (through brick's guard) and, in the scope, PyTorch's current CUDA
    // stream are the side stream.
    c10::StreamGuard on_side(c10::Stream(c10::Stream::UNSAFE, device, side));
    {
      backend::BackingScope scope(brick_device);
      engine_future.wait();  // completed: the current CUDA stream waits for its events
    }
    timing.done = backend::runtime_call([&] { return rt.create_event(brick_device, true); });
    BRICK_RUNTIME_CALL(rt.record_event(timing.done, brick_device, side));
    for (const at::Tensor& tensor : held) {
      backend::record_stream_use(tensor.storage().data_ptr(), brick_device, side);
    }
    auto device_future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors(),
                                                                  std::vector<c10::Device>{device});
    device_future->markCompleted(c10::IValue(values));  // brick events on the side stream
    return device_future;
  }

  BrickProcessGroup& pg;
  Collective op;
  bool seen = false;
  bool on_brick = false;
  bool device_set = false;
  c10::DeviceIndex brick_device = 0;  // of the brick tensors (barrier: the bound or current one)
  uint64_t bytes = 0;
  std::vector<at::Tensor> held;  // the brick tensors: kept alive until the collective is done
};

namespace {
std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& list : lists) out.insert(out.end(), list.begin(), list.end());
  return out;
}
}  // namespace

BrickProcessGroup::BrickProcessGroup(c10::intrusive_ptr<c10d::Backend> brick_engine,
                                     c10::intrusive_ptr<c10d::Backend> cpu_engine)
    : Backend(brick_engine->getRank(), brick_engine->getSize()),
      brick_engine_(std::move(brick_engine)),
      cpu_engine_(std::move(cpu_engine)) {
  TORCH_CHECK_VALUE(cpu_engine_->getRank() == getRank() && cpu_engine_->getSize() == getSize(),
                    "brick c10d: the CPU engine is rank ", cpu_engine_->getRank(), " of ",
                    cpu_engine_->getSize(), ", the brick engine rank ", getRank(), " of ",
                    getSize(), ": expected the same group");
}

void BrickProcessGroup::setTimeout(std::chrono::milliseconds timeout) {
  brick_engine_->setTimeout(timeout);
  if (cpu_engine_ != brick_engine_) cpu_engine_->setTimeout(timeout);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  Call call(*this, Collective::Broadcast);
  auto aliases = call.map(tensors, true);
  return call.run([&](c10d::Backend& e) { return e.broadcast(aliases, opts); }, tensors);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  Call call(*this, Collective::AllReduce);
  auto aliases = call.map(tensors, true);
  const auto engine_opts = call.premultiplied(opts, aliases, /*in_place=*/true);
  return call.run([&](c10d::Backend& e) { return e.allreduce(aliases, engine_opts); }, tensors);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  Call call(*this, Collective::AllReduceCoalesced);
  auto aliases = call.map(tensors, true);
  const auto engine_opts = call.premultiplied(opts, aliases, /*in_place=*/true);
  return call.run([&](c10d::Backend& e) { return e.allreduce_coalesced(aliases, engine_opts); },
                  tensors);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  Call call(*this, Collective::Reduce);
  auto aliases = call.map(tensors, true);
  return call.run([&](c10d::Backend& e) { return e.reduce(aliases, opts); }, tensors);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  Call call(*this, Collective::AllGather);
  auto in = call.map(inputs, true);
  auto out = call.map(outputs, false);
  return call.run([&](c10d::Backend& e) { return e.allgather(out, in, opts); }, flatten(outputs));
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  Call call(*this, Collective::AllGatherIntoTensor);
  auto in = call.map(input, true);
  auto out = call.map(output, false);
  return call.run([&](c10d::Backend& e) { return e._allgather_base(out, in, opts); }, {output});
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  Call call(*this, Collective::AllGatherCoalesced);
  auto in = call.map(inputs, true);
  auto out = call.map(outputs, false);
  return call.run([&](c10d::Backend& e) { return e.allgather_coalesced(out, in, opts); },
                  flatten(outputs));
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  Call call(*this, Collective::AllGatherIntoTensorCoalesced);
  auto in = call.map(inputs, true);
  auto out = call.map(outputs, false);
  return call.run(
      [&](c10d::Backend& e) { return e.allgather_into_tensor_coalesced(out, in, opts); }, outputs);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  Call call(*this, Collective::Gather);
  auto in = call.map(inputs, true);
  auto out = call.map(outputs, false);
  return call.run([&](c10d::Backend& e) { return e.gather(out, in, opts); }, flatten(outputs));
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  Call call(*this, Collective::Scatter);
  auto in = call.map(inputs, true);
  auto out = call.map(outputs, false);
  return call.run([&](c10d::Backend& e) { return e.scatter(out, in, opts); }, outputs);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  Call call(*this, Collective::ReduceScatter);
  auto in = call.map(inputs, true);
  auto out = call.map(outputs, false);
  auto engine_opts = opts;
  for (auto& list : in) engine_opts = call.premultiplied(opts, list, /*in_place=*/false);
  return call.run([&](c10d::Backend& e) { return e.reduce_scatter(out, in, engine_opts); },
                  outputs);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  Call call(*this, Collective::ReduceScatterTensor);
  std::vector<at::Tensor> in{call.map(input, true)};
  auto out = call.map(output, false);
  const auto engine_opts = call.premultiplied(opts, in, /*in_place=*/false);
  return call.run([&](c10d::Backend& e) { return e._reduce_scatter_base(out, in[0], engine_opts); },
                  {output});
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  Call call(*this, Collective::ReduceScatterTensorCoalesced);
  auto in = call.map(inputs, true);
  auto out = call.map(outputs, false);
  const auto engine_opts = call.premultiplied(opts, in, /*in_place=*/false);
  return call.run(
      [&](c10d::Backend& e) { return e.reduce_scatter_tensor_coalesced(out, in, engine_opts); },
      outputs);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  Call call(*this, Collective::AllToAllSingle);
  auto in = call.map(input, true);
  auto out = call.map(output, false);
  return call.run(
      [&](c10d::Backend& e) {
        return e.alltoall_base(out, in, output_split_sizes, input_split_sizes, opts);
      },
      {output});
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  Call call(*this, Collective::AllToAll);
  auto in = call.map(inputs, true);
  auto out = call.map(outputs, false);
  return call.run([&](c10d::Backend& e) { return e.alltoall(out, in, opts); }, outputs);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::barrier(const c10d::BarrierOptions& opts) {
  Call call(*this, Collective::Barrier);
  // No tensors: the engine of brick tensors synchronizes the ranks (on CUDA backing NCCL's
  // barrier, which also orders the device).
  call.on_brick = true;
  const c10::DeviceIndex bound = device_.load();
  call.brick_device =
      bound >= 0 ? bound : static_cast<c10::DeviceIndex>(backend::rt().current_device());
  return call.run([&](c10d::Backend& e) { return e.barrier(opts); }, {});
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::send(std::vector<at::Tensor>& tensors,
                                                       int dst_rank, int tag) {
  Call call(*this, Collective::Send);
  auto aliases = call.map(tensors, true);
  return call.run([&](c10d::Backend& e) { return e.send(aliases, dst_rank, tag); }, tensors);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::recv(std::vector<at::Tensor>& tensors,
                                                       int src_rank, int tag) {
  Call call(*this, Collective::Recv);
  auto aliases = call.map(tensors, false);
  return call.run([&](c10d::Backend& e) { return e.recv(aliases, src_rank, tag); }, tensors);
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                int tag) {
  Call call(*this, Collective::Recv);
  auto aliases = call.map(tensors, false);
  return call.run([&](c10d::Backend& e) { return e.recvAnysource(aliases, tag); }, tensors);
}

}  // namespace brick::distributed
