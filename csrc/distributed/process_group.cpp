// Brick's c10d backend, the API c10d calls: each collective is forwarded to one Call
// (collective_call.h), which maps its tensors, runs the engine and wraps its Work.
#include "distributed/process_group.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <utility>
#include <vector>

#include "backend/device_index.h"
#include "distributed/collective_call.h"
#include "distributed/collectives.h"

namespace brick::distributed {

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
