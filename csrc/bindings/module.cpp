// torch_brickdev._C: the Python view of the brick backend and runtime.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>

#include "backend/allocator.h"
#include "backend/autocast.h"
#include "backend/backing.h"
#include "backend/device_index.h"
#include "backend/errors.h"
#include "backend/generator.h"
#include "backend/registration.h"

namespace py = pybind11;

namespace brick::bindings {
void bind_profiler(py::module_& parent);
#ifdef BRICK_WITH_DISTRIBUTED
void bind_distributed(py::module_& parent);
#endif
}  // namespace brick::bindings

namespace {

using brick::backend::resolve_device_index;
using brick::backend::rt;
using brick::backend::runtime_call;

py::dict memory_stats(int device) {
  const auto stats = runtime_call([&] { return rt().memory_stats(resolve_device_index(device)); });
  py::dict out;
  out["allocated_bytes.all.current"] = stats.allocated_bytes;
  out["allocated_bytes.all.peak"] = stats.peak_allocated_bytes;
  out["allocated_bytes.all.allocated"] = stats.allocated_bytes_total;
  out["allocated_bytes.all.freed"] = stats.freed_bytes_total;
  out["allocation.all.current"] = stats.allocations;
  out["allocation.all.peak"] = stats.peak_allocations;
  out["allocation.all.allocated"] = stats.total_allocations;
  out["allocation.all.freed"] = stats.total_frees;
  out["adopted_bytes.all.current"] = stats.adopted_bytes;
  return out;
}

py::tuple stream_tuple(int device, int64_t stream_id) {
  return py::make_tuple(stream_id, device, static_cast<int>(brick::backend::kBrick));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_brickdev native module";
  brick::backend::ensure_registered();

  m.def("_runtime_name", [] { return std::string(rt().name()); });
  // Whether its work completes after the call that queued it (CUDA; the host runtime with
  // deferred completion): what deferred-mode times then is the launch, not the work.
  m.def("_runtime_asynchronous", [] { return rt().asynchronous(); });
  // Whether this build has the CUDA runtime (built where the CUDA toolkit was found; CI checks
  // that a machine with the toolkit really built it).
#if BRICK_WITH_CUDA
  m.def("_built_with_cuda", [] { return true; });
#else
  m.def("_built_with_cuda", [] { return false; });
#endif
  m.def("_backing_device_type", [] {
    return std::string(
        c10::DeviceTypeName(brick::backend::backing_device_type(), /*lower_case=*/true));
  });
  m.def("_runtime_note", [] { return brick::runtime::runtime_choice_note(); });
  m.def("_runtime_created_in_pid", [] { return brick::runtime::runtime_created_in_pid(); });
  m.def("_backing_stream", [](int device, int64_t stream_id) {
    // The PyTorch CUDA stream behind a brick stream, as (stream id, CUDA device index).
    const auto index = resolve_device_index(device);
    TORCH_CHECK(brick::backend::cuda_backing(), "brick: brick:", static_cast<int>(index),
                " is backed by the host runtime, whose streams have no CUDA stream behind them");
    const c10::Stream cuda = brick::backend::backing_cuda_stream(index, stream_id);
    return py::make_tuple(cuda.id(), static_cast<int>(cuda.device_index()));
  });
  m.def("_autocast_policy_ops", &brick::backend::autocast_policy_ops, py::arg("cuda_backing"));
  m.def("_device_count", [] { return rt().device_count(); });
  m.def("_devices_in_use", &brick::backend::devices_in_use);
  m.def("_current_device", [] { return rt().current_device(); });
  m.def("_set_device", [](int device) {
    brick::backend::check_device_index(static_cast<c10::DeviceIndex>(device));
    rt().set_current_device(device);
  });
  m.def("_synchronize", [](int device) {
    BRICK_RUNTIME_CALL(rt().synchronize_device(resolve_device_index(device)));
  });
  m.def("_memory_stats", &memory_stats);
  m.def("_backing_device_index", [](int device) {
    // The CUDA device behind a brick device on CUDA backing; -1 on the host runtime.
    const auto index = resolve_device_index(device);
    return brick::backend::cuda_backing() ? rt().backing_device_index(index) : -1;
  });
  m.def("_mem_get_info", [](int device) {
    const auto [free_bytes, total_bytes] =
        brick::backend::brick_memory_info(resolve_device_index(device));
    return py::make_tuple(free_bytes, total_bytes);
  });
  m.def("_empty_cache", [] { brick::backend::empty_brick_cache(); });
  m.def("_reset_accumulated_memory_stats", [](int device) {
    BRICK_RUNTIME_CALL(rt().reset_accumulated_memory_stats(resolve_device_index(device)));
  });
  m.def("_reset_peak_memory_stats", [](int device) {
    BRICK_RUNTIME_CALL(rt().reset_peak_memory_stats(resolve_device_index(device)));
  });
  m.def("_default_generator", [](int device) {
    const auto& generator =
        brick::backend::brick_default_generator(static_cast<c10::DeviceIndex>(device));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(generator));
  });
  m.def("_current_stream", [](int device) {
    const auto index = resolve_device_index(device);
    return stream_tuple(index, runtime_call([&] { return rt().current_stream(index); }));
  });
  m.def("_default_stream", [](int device) {
    return stream_tuple(resolve_device_index(device), brick::runtime::kDefaultStream);
  });
  m.def("_set_stream", [](int64_t stream_id, int device) {
    BRICK_RUNTIME_CALL(rt().set_current_stream(resolve_device_index(device), stream_id));
  });
  brick::bindings::bind_profiler(m);
#ifdef BRICK_WITH_DISTRIBUTED
  brick::bindings::bind_distributed(m);
#endif
}
