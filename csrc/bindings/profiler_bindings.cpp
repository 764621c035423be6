// torch_brickdev._C._profiler: the Python view of the registry, the observer and the timeline.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <tuple>

#include "profiler/profiler.h"

namespace py = pybind11;

namespace brick::bindings {

namespace {

using registry::BrickStats;

py::dict to_dict(const BrickStats& s) {
  py::dict d;
  d["name"] = s.name;
  d["path"] = s.path;
  d["depth"] = s.depth;
  d["kind"] = registry::kind_name(s.kind);
  d["device"] = s.device;
  d["count"] = s.count;
  d["total_ns"] = s.total_ns;
  d["min_ns"] = s.min_ns;
  d["max_ns"] = s.max_ns;
  d["last_ns"] = s.last_ns;
  d["p50_ns"] = s.percentile_ns(0.50);
  d["p90_ns"] = s.percentile_ns(0.90);
  d["p99_ns"] = s.percentile_ns(0.99);
  return d;
}

// Merges call-tree nodes that share a name and kind (the "by name" view): counts and totals
// add, extremes combine, histograms add, so percentiles stay exact to the histogram.
std::vector<BrickStats> by_name(const std::vector<BrickStats>& nodes) {
  std::map<std::pair<std::string, int>, size_t> index;
  std::vector<BrickStats> merged;
  for (const BrickStats& node : nodes) {
    const auto key = std::make_pair(node.name, static_cast<int>(node.kind));
    auto it = index.find(key);
    if (it == index.end()) {
      index.emplace(key, merged.size());
      merged.push_back(node);
      merged.back().path = node.name;
      continue;
    }
    BrickStats& into = merged[it->second];
    into.count += node.count;
    into.total_ns += node.total_ns;
    into.min_ns = std::min(into.min_ns, node.min_ns);
    into.max_ns = std::max(into.max_ns, node.max_ns);
    into.last_ns = node.last_ns;
    into.depth = std::min(into.depth, node.depth);
    into.histogram.add(node.histogram);
    if (into.device != node.device) into.device = -1;  // seen on several devices
  }
  return merged;
}

}  // namespace

void bind_profiler(py::module_& parent) {
  profiler::register_profiler_stubs();
  py::module_ m = parent.def_submodule("_profiler", "brick profiler internals");
  m.def("enable", &profiler::enable);
  m.def("disable", &profiler::disable);
  m.def("is_enabled", &profiler::is_enabled);
  m.def("reset", &profiler::reset);
  m.def("set_sync_mode",
        [](const std::string& mode) { profiler::set_sync_mode(registry::parse_sync_mode(mode)); });
  m.def("sync_mode", [] { return std::string(registry::sync_mode_name(profiler::sync_mode())); });
  m.def(
      "stats",
      [](bool merge_by_name) {
        const auto nodes = profiler::snapshot();
        py::list out;
        for (const BrickStats& s : merge_by_name ? by_name(nodes) : nodes) out.append(to_dict(s));
        return out;
      },
      py::arg("by_name") = true);
  m.def("health", [] {
    const auto h = profiler::health();
    py::dict d;
    d["unbalanced_exits"] = h.unbalanced_exits;
    d["timing_failures"] = h.timing_failures;
    d["pending_events"] = h.pending_events;
    d["live_events"] = h.live_events;
    d["capture_skipped"] = h.capture_skipped;
    // Records that resets discarded: with stats()' counts, every call made is accounted for.
    d["discarded_by_reset"] = profiler::brick_registry().discarded_by_reset();
    return d;
  });
  m.def("timeline", [] {
    const auto t = profiler::timeline();
    py::list records;
    for (const auto& r : t.records) {
      records.append(py::make_tuple(r.thread, r.cpu_ns, r.device_ns, r.device, r.stream));
    }
    py::list annotations;
    for (const auto& a : t.annotations) {
      annotations.append(
          py::make_tuple(a.name, a.thread, a.start_cpu_ns, a.end_cpu_ns, a.is_range));
    }
    py::dict d;
    d["records"] = records;
    d["annotations"] = annotations;
    d["dropped_records"] = t.dropped_records;
    d["steady_to_cpu_offset_ns"] = t.steady_to_cpu_offset_ns;
    return d;
  });
  m.def("clear_timeline", &profiler::clear_timeline);
  m.def("mark", [](const std::string& name) { profiler::mark(name.c_str()); });
  m.def("range_push", [](const std::string& name) { profiler::range_push(name.c_str()); });
  m.def("range_pop", &profiler::range_pop);
}

}  // namespace brick::bindings
