// torch_brickdev._C._distributed: brick's c10d backend as torch.distributed sees it.
#include <torch/csrc/utils/pybind.h>

#include "distributed/collective_work.h"
#include "distributed/collectives.h"
#include "distributed/process_group.h"

namespace py = pybind11;

namespace brick::bindings {

void bind_distributed(py::module_& parent) {
  auto m = parent.def_submodule("_distributed", "brick's c10d backend");
  // The base class's Python type must be known before a subclass is registered.
  py::module_::import("torch._C._distributed_c10d");
  using distributed::BrickProcessGroup;
  py::class_<BrickProcessGroup, c10d::Backend, c10::intrusive_ptr<BrickProcessGroup>>(
      m, "BrickProcessGroup")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& brick_engine,
                       const c10::intrusive_ptr<c10d::Backend>& cpu_engine) {
             return c10::make_intrusive<BrickProcessGroup>(brick_engine, cpu_engine);
           }),
           py::arg("brick_engine"), py::arg("cpu_engine"))
      .def_property_readonly("device", &BrickProcessGroup::device);
  m.def("wait_for_collectives", [] {
    py::gil_scoped_release no_gil;  // engine threads may need the GIL (Python comm hooks)
    return distributed::wait_for_collectives();
  });
  m.def("collective_counters", [] {
    py::list out;
    for (const auto& c : distributed::collective_counters()) {
      out.append(py::make_tuple(c.name, c.calls.load(), c.bytes.load(), c.group_size.load(),
                                c.time_ns.load(), c.timed_calls.load()));
    }
    return out;
  });
}

}  // namespace brick::bindings
