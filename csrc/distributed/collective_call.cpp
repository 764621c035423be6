// One collective's mechanics, out of line: where(), mapping tensors to aliases, and completing
// a collective on CUDA backing (queued_without_work, order_after_engine).
#include "distributed/collective_call.h"

#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <memory>
#include <utility>
#include <vector>

#include "backend/allocator.h"
#include "backend/backing.h"
#include "backend/backing_alias.h"
#include "backend/device_index.h"
#include "backend/errors.h"
#include "distributed/collective_work.h"
#include "distributed/collectives.h"

namespace brick::distributed {

std::string BrickProcessGroup::Call::where() const {
  return c10::str("brick c10d: rank ", pg.getRank(), " of ", pg.getSize(), ": ",
                  collective_name(op));
}

at::Tensor BrickProcessGroup::Call::map(const at::Tensor& tensor, bool counts_as_input) {
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

std::vector<at::Tensor> BrickProcessGroup::Call::map(const std::vector<at::Tensor>& tensors,
                                                     bool counts_as_input) {
  std::vector<at::Tensor> aliases;
  aliases.reserve(tensors.size());
  for (const auto& t : tensors) aliases.push_back(map(t, counts_as_input));
  return aliases;
}

std::vector<std::vector<at::Tensor>> BrickProcessGroup::Call::map(
    const std::vector<std::vector<at::Tensor>>& lists, bool counts_as_input) {
  std::vector<std::vector<at::Tensor>> aliases;
  aliases.reserve(lists.size());
  for (const auto& list : lists) aliases.push_back(map(list, counts_as_input));
  return aliases;
}

c10::intrusive_ptr<c10d::Work> BrickProcessGroup::Call::queued_without_work(
    CollectiveCounter& counter, runtime::LaunchObserver* observer, const runtime::Launch& launch,
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

c10::intrusive_ptr<c10::ivalue::Future> BrickProcessGroup::Call::order_after_engine(
    c10::ivalue::Future& engine_future, const std::vector<at::Tensor>& values,
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

}  // namespace brick::distributed
