// torch_brickdev._C._profiler: the Python view of the registry, the observer and the timeline.
#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/device_index.h"
#include "backend/errors.h"
#include "profiler/kineto_plugin.h"
#include "profiler/machine_sample.h"
#include "profiler/profiler.h"
#include "profiler/range_stack.h"
#include "profiler/shape_stats.h"
#include "runtime/launch_observer.h"

namespace py = pybind11;

namespace brick::bindings {

namespace {

using registry::BrickStats;

// p50, p90, p99: the percentiles every report entry carries, taken in one pass.
constexpr std::array<double, 3> kReportPercentiles = {0.50, 0.90, 0.99};

std::array<double, 3> report_percentiles(const BrickStats& s) {
  std::array<double, 3> values{};
  s.percentiles_ns(kReportPercentiles, values);
  return values;
}

// A report entry: a brick's figures with its percentiles taken, without its histogram.
struct ReportRow {
  std::string name;
  std::string path;
  registry::Kind kind;
  int device;
  int depth;
  uint64_t count;
  int64_t total_ns, min_ns, max_ns, last_ns;
  std::array<double, 3> percentiles;  // p50, p90, p99
};

ReportRow report_row_of(const BrickStats& s) {
  return {s.name,
          s.path,
          s.kind,
          s.device,
          s.depth,
          s.count,
          s.total_ns,
          s.min_ns,
          s.max_ns,
          s.last_ns,
          report_percentiles(s)};
}

std::vector<ReportRow> report_rows_of(const std::vector<BrickStats>& stats) {
  std::vector<ReportRow> rows;
  rows.reserve(stats.size());
  for (const BrickStats& s : stats) rows.push_back(report_row_of(s));
  return rows;
}

// A report entry's fields, in order: the one list that both the tuples of report_rows() and
// the dicts of snapshot() follow. Python checks it against BrickStats' fields
// (profiler/_stats.py) when it loads the registry, as _profiler.REPORT_FIELDS.
constexpr std::array<const char*, 13> kReportFields = {
    "name",   "path",   "kind",    "device", "depth",  "count", "total_ns",
    "min_ns", "max_ns", "last_ns", "p50_ns", "p90_ns", "p99_ns"};

// A report entry's values, in kReportFields' order.
auto report_values(const ReportRow& r) {
  return std::make_tuple(std::cref(r.name), std::cref(r.path), registry::kind_name(r.kind),
                         r.device, r.depth, r.count, r.total_ns, r.min_ns, r.max_ns, r.last_ns,
                         r.percentiles[0], r.percentiles[1], r.percentiles[2]);
}
static_assert(std::tuple_size_v<decltype(report_values(std::declval<const ReportRow&>()))> ==
                  kReportFields.size(),
              "a report entry has one value per field");

py::tuple report_field_names() {
  py::tuple names(kReportFields.size());
  for (size_t i = 0; i < kReportFields.size(); ++i) names[i] = py::str(kReportFields[i]);
  return names;
}

py::tuple to_tuple(const ReportRow& r) {
  return std::apply([](const auto&... values) { return py::make_tuple(values...); },
                    report_values(r));
}

// A report entry as a tuple in kReportFields' order (a report's rows).
py::list to_rows(const std::vector<ReportRow>& rows) {
  py::list out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = to_tuple(rows[i]);
  return out;
}

// One registry snapshot's report rows by name and by path, kept in C++ until read: a profile
// takes them at its exit, and its report makes Python objects of them when first read, outside
// the profiled region (~40 us cold for a Qwen2 generate()'s 34 + 34 rows). No histogram is
// kept: a profile object that is never read holds ~100 bytes per row.
struct CapturedRows {
  std::vector<ReportRow> by_name;
  std::vector<ReportRow> by_path;
  // The top-level bricks' earliest start and latest end (Registry::now_ns()'s clock).
  int64_t first_start_ns = INT64_MAX;
  int64_t last_end_ns = INT64_MIN;
};

// A report entry as a dict keyed by kReportFields (a snapshot's entries).
py::dict to_dict(const BrickStats& s) {
  py::dict d;
  size_t field = 0;
  std::apply([&](const auto&... values) { ((d[kReportFields[field++]] = values), ...); },
             report_values(report_row_of(s)));
  return d;
}

// The histogram's non-empty buckets as [bucket, count] pairs: what a reader needs to take the
// percentiles of an interval (the difference of two readings) with percentile_of_buckets().
py::list sparse_histogram(const registry::Histogram& histogram) {
  py::list out;
  for (int bucket = 0; bucket < registry::Histogram::kBuckets; ++bucket) {
    if (histogram.counts[bucket] != 0) out.append(py::make_tuple(bucket, histogram.counts[bucket]));
  }
  return out;
}

// A registry snapshot. It may wait for device work; other Python threads run meanwhile.
registry::Snapshot take_snapshot() {
  py::gil_scoped_release released;
  return profiler::snapshot();
}

// One registry snapshot, each view asked for ("name", "path") converted by `convert` (a
// std::vector<BrickStats> to a py::list): views taken together always agree.
template <typename Convert>
py::dict snapshot_views(const std::vector<std::string>& views, const char* where,
                        Convert&& convert) {
  for (const std::string& view : views) {
    if (view != "name" && view != "path") {
      throw py::value_error(std::string("brick profiler: ") + where + "(): unknown view '" + view +
                            "'; expected 'name' or 'path'");
    }
  }
  const registry::Snapshot snapshot = take_snapshot();
  py::dict out;
  for (const std::string& view : views) {
    out[py::str(view)] = convert(view == "name" ? snapshot.by_name() : snapshot.nodes);
  }
  return out;
}

double percentile_of_buckets(const std::vector<std::pair<int, int64_t>>& buckets, double q) {
  if (!(q >= 0.0 && q <= 1.0)) throw py::value_error("percentile_of_buckets: q must be in [0, 1]");
  registry::Histogram histogram;
  for (const auto& [bucket, count] : buckets) {
    if (bucket < 0 || bucket >= registry::Histogram::kBuckets || count < 0) {
      throw py::value_error("percentile_of_buckets: bucket " + std::to_string(bucket) +
                            " with count " + std::to_string(count) + " out of range");
    }
    histogram.counts[bucket] += static_cast<uint64_t>(count);
  }
  return histogram.percentile_ns(q);
}

// torch.brick's device properties as Kineto's "deviceProperties" entries (profiler/_kineto.py),
// read when a trace is processed, perhaps off the Python thread. A failure leaves them out.
std::string device_properties_json() {
  try {
    py::gil_scoped_acquire gil;
    return py::module_::import("torch_brickdev.profiler._kineto")
        .attr("device_properties_json")()
        .cast<std::string>();
  } catch (const std::exception&) {
    return {};
  }
}

// profiler/machine.py's Sample, in its field order: wall_ns, thread_cpu_ns, process_cpu_ns,
// involuntary_switches, thread_schedstat (cpu ns, wait ns) or None, thread_waits
// ((tid, wait ns), ...), steal_ns, machine_busy_ns (None unless /proc/stat was read).
py::tuple sample_tuple(const profiler::MachineSample& s) {
  py::tuple waits(s.thread_waits.size());
  for (size_t i = 0; i < s.thread_waits.size(); ++i) {
    waits[i] = py::make_tuple(s.thread_waits[i].first, s.thread_waits[i].second);
  }
  return py::make_tuple(s.wall_ns, s.thread_cpu_ns, s.process_cpu_ns, s.involuntary_switches,
                        s.thread_schedstat, std::move(waits), s.steal_ns, s.busy_ns);
}

profiler::OpTiming parse_op_timing(const std::string& where) {
  if (where != "dispatcher" && where != "kernels") {
    throw py::value_error("brick profiler: ops are timed at 'dispatcher' or 'kernels', not '" +
                          where + "'");
  }
  return where == "kernels" ? profiler::OpTiming::Kernels : profiler::OpTiming::Dispatcher;
}

CapturedRows capture_rows() {
  const registry::Snapshot snapshot = take_snapshot();
  CapturedRows captured{report_rows_of(snapshot.by_name()), report_rows_of(snapshot.nodes)};
  for (const BrickStats& node : snapshot.nodes) {
    if (node.depth != 0) continue;
    captured.first_start_ns = std::min(captured.first_start_ns, node.first_start_ns);
    captured.last_end_ns = std::max(captured.last_end_ns, node.last_end_ns);
  }
  return captured;
}

// From the first top-level brick's start to the last one's end, at most `wall_ns`; None where
// a brick started before `since_ns` (figures kept from before the region: profile(reset=False))
// or there is none.
py::object bricks_span_ns(const CapturedRows& rows, int64_t since_ns, int64_t wall_ns) {
  if (rows.first_start_ns < since_ns || rows.last_end_ns < rows.first_start_ns) {
    return py::none();
  }
  return py::int_(std::min(rows.last_end_ns - rows.first_start_ns, wall_ns));
}

// The records resets had discarded when the registry's figures were last reset while not
// profiling (a profile's start), per registry (a forked child's is a new one): a report's health
// counts those discarded since, its own figures' loss (a reset inside the profile among them), as
// it counts the profiler's other counters since its start. Read and written with the GIL held.
struct DiscardedAtReset {
  const registry::Registry* registry = nullptr;
  uint64_t count = 0;
};
DiscardedAtReset g_discarded_at_reset;

void reset_figures() {
  profiler::reset();
  if (profiler::is_enabled()) return;  // discards what the running profile recorded: its loss
  const registry::Registry& figures = profiler::brick_registry();
  g_discarded_at_reset = {&figures, figures.discarded_by_reset()};
}

uint64_t discarded_since_reset() {
  const registry::Registry& figures = profiler::brick_registry();
  const uint64_t discarded = figures.discarded_by_reset();
  if (g_discarded_at_reset.registry != &figures) return discarded;  // never reset
  return discarded - std::min(discarded, g_discarded_at_reset.count);
}

// Waits for every brick device this process used (no CUDA context made on an unused GPU).
void synchronize_devices_in_use() {
  py::gil_scoped_release released;
  for (const int device : backend::devices_in_use()) {
    BRICK_RUNTIME_CALL(backend::rt().synchronize_device(device));
  }
}

int64_t monotonic_ns() {  // Python's time.perf_counter_ns()
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

// The per-profile settings back to their defaults, for the next enable().
void restore_region_settings() {
  profiler::set_record_shapes(false);
  profiler::set_op_timing(profiler::OpTiming::Dispatcher);
  profiler::set_device_timing(profiler::DeviceTiming::Events);
}

// "events" or "traced" (profiler::DeviceTiming); profile() checked it.
profiler::DeviceTiming parse_device_timing(const std::string& timing) {
  if (timing != "events" && timing != "traced") {
    throw py::value_error("brick profiler: device_timing must be 'events' or 'traced', got '" +
                          timing + "'");
  }
  return timing == "traced" ? profiler::DeviceTiming::Traced : profiler::DeviceTiming::Events;
}

}  // namespace

void bind_profiler(py::module_& parent) {
  profiler::register_profiler_stubs();
  py::module_ m = parent.def_submodule("_profiler", "brick profiler internals");
  m.attr("REPORT_FIELDS") = report_field_names();
  m.def("enable", &profiler::enable);
  m.def("disable", &profiler::disable);
  m.def("is_enabled", &profiler::is_enabled);
  m.def("reset", &reset_figures);
  m.def("set_sync_mode",
        [](const std::string& mode) { profiler::set_sync_mode(registry::parse_sync_mode(mode)); });
  m.def("sync_mode", [] { return std::string(registry::sync_mode_name(profiler::sync_mode())); });
  // One registry snapshot, converted into the views asked for ("name", "path"): views taken
  // together always agree. Entries are dicts (with their sparse histograms if asked: what live
  // publishing writes).
  m.def(
      "snapshot",
      [](const std::vector<std::string>& views, bool histograms) {
        return snapshot_views(views, "snapshot", [histograms](const auto& stats) {
          py::list out;
          for (const BrickStats& s : stats) {
            py::dict d = to_dict(s);
            if (histograms) d["histogram"] = sparse_histogram(s.histogram);
            out.append(std::move(d));
          }
          return out;
        });
      },
      py::arg("views"), py::arg("histograms") = false);
  // The same, each entry a tuple in REPORT_FIELDS' order: what a report is built from (no dict
  // per entry).
  m.def(
      "report_rows",
      [](const std::vector<std::string>& views) {
        return snapshot_views(views, "report_rows",
                              [](const auto& stats) { return to_rows(report_rows_of(stats)); });
      },
      py::arg("views"));
  // The q-th percentile of the durations a sparse histogram ([bucket, count] pairs, e.g. the
  // difference of two snapshots' histograms) holds, interpolated as the registry's own.
  py::class_<CapturedRows>(m, "CapturedRows").def("rows", [](const CapturedRows& captured) {
    py::dict out;
    out["name"] = to_rows(captured.by_name);
    out["path"] = to_rows(captured.by_path);
    return out;
  });
  m.def("capture_rows", &capture_rows);
  // The per-profile settings (record_shapes, op timing) back to their defaults.
  m.def("restore_settings", &restore_region_settings);
  // Whether environment variable `name` is set to anything but "" or "0". os.environ's lookup
  // (encoding the key, Python-level mapping methods) cost a profile's construction 35 us right
  // after a garbage collection; os.environ's changes go through putenv, so getenv sees them.
  m.def(
      "env_flag",
      [](const std::string& name) {
        const char* value = std::getenv(name.c_str());
        return value != nullptr && value[0] != '\0' && std::string_view(value) != "0";
      },
      py::arg("name"));
  // The native half of a profile's entry and exit (profiler/session.py), one call each: right
  // after a garbage collection each Python step of them cost 5-25 us, ~240 us of a profile's
  // ~600 us fixed cost (the 2-core VM, docs/benchmarks.md).
  // begin_region: resets the registry (if asked), waits for the devices in use, samples the
  // machine, applies the settings and enables; returns (the sample, the start's
  // perf_counter_ns, the start on the registry's clock). If enabling fails, the settings are
  // restored and no profile runs.
  m.def(
      "begin_region",
      [](bool reset, bool record_shapes, const std::string& ops, const std::string& device_timing) {
        const profiler::OpTiming timing = parse_op_timing(ops);
        const profiler::DeviceTiming device = parse_device_timing(device_timing);
        if (profiler::is_enabled()) {
          throw std::runtime_error(
              "brick profiler: a profile is already running (nesting is not supported)");
        }
        if (reset) reset_figures();
        synchronize_devices_in_use();
        const profiler::MachineSample before = profiler::sample_machine(true);
        const int64_t start_ns = monotonic_ns();
        const int64_t registry_start_ns = registry::Registry::now_ns();
        profiler::set_record_shapes(record_shapes);  // read by enable()
        profiler::set_op_timing(timing);
        profiler::set_device_timing(device);
        try {
          profiler::enable();
        } catch (...) {
          restore_region_settings();
          throw;
        }
        return py::make_tuple(sample_tuple(before), start_ns, registry_start_ns);
      },
      py::arg("reset"), py::arg("record_shapes"), py::arg("ops"),
      py::arg("device_timing") = "events");
  // end_region: waits for the devices in use, samples the machine (/proc/stat only for a
  // region of at least `ticked_wall_ns`: its ticks tell nothing over a shorter one), disables
  // and restores the settings (also when waiting fails), and captures the report's rows;
  // returns (wall ns since `start_ns`, the sample, the rows, the bricks' span or None: see
  // bricks_span_ns(), since `registry_start_ns`).
  m.def(
      "end_region",
      [](int64_t start_ns, int64_t registry_start_ns, int64_t ticked_wall_ns) {
        profiler::MachineSample after;
        int64_t wall_ns = 0;
        try {
          synchronize_devices_in_use();
          wall_ns = monotonic_ns() - start_ns;
          after = profiler::sample_machine(wall_ns >= ticked_wall_ns);
        } catch (...) {
          if (profiler::is_enabled()) profiler::disable();
          restore_region_settings();
          throw;
        }
        if (profiler::is_enabled()) profiler::disable();
        restore_region_settings();
        CapturedRows rows = capture_rows();
        py::object span = bricks_span_ns(rows, registry_start_ns, wall_ns);
        return py::make_tuple(wall_ns, sample_tuple(after), std::move(rows), std::move(span));
      },
      py::arg("start_ns"), py::arg("registry_start_ns"), py::arg("ticked_wall_ns"));
  m.def("percentile_of_buckets", &percentile_of_buckets, py::arg("buckets"), py::arg("q"));
  // The machine's counters now (profiler/machine.py's Sample, in its field order): wall_ns,
  // thread_cpu_ns, process_cpu_ns, involuntary_switches, thread_schedstat (cpu ns, wait ns) or
  // None, thread_waits ((tid, wait ns), ...), steal_ns, machine_busy_ns (None unless `ticks`).
  m.def(
      "machine_sample", [](bool ticks) { return sample_tuple(profiler::sample_machine(ticks)); },
      py::arg("ticks"));
  // The Linux thread ids of the intra-op pool (the OpenMP team at::parallel_for runs on, the
  // caller among them): the threads a parallel kernel's work waits on, whose run-queue waits
  // delay an op as the calling thread's own do. Only the caller where PyTorch's OpenMP runtime
  // is not GNU's (or compatible).
  m.def("intra_op_thread_ids", [] { return profiler::intra_op_thread_ids(at::get_num_threads()); });
  // How often this process's samples read /proc/stat and listed its threads, and the thread
  // files they hold open: what tests check the samples' savings with.
  m.def("machine_sample_reads", [] {
    const profiler::MachineSampleReads reads = profiler::machine_sample_reads();
    return py::make_tuple(reads.stat_reads, reads.thread_listings,
                          profiler::machine_sample_open_thread_files());
  });
  m.def("set_record_shapes", &profiler::set_record_shapes, py::arg("on"));
  m.def("record_shapes", &profiler::record_shapes);
  // "dispatcher" or "kernels" (profiler::OpTiming).
  m.def(
      "set_op_timing",
      [](const std::string& where) { profiler::set_op_timing(parse_op_timing(where)); },
      py::arg("where"));
  m.def("op_timing", [] {
    return profiler::op_timing() == profiler::OpTiming::Kernels ? "kernels" : "dispatcher";
  });
  // "events" or "traced" (profiler::DeviceTiming).
  m.def(
      "set_device_timing",
      [](const std::string& timing) { profiler::set_device_timing(parse_device_timing(timing)); },
      py::arg("timing"));
  m.def("device_timing", [] {
    return profiler::device_timing() == profiler::DeviceTiming::Traced ? "traced" : "events";
  });
  // The process's default (profiler::set_default_device_timing): "events" or "traced".
  m.def(
      "set_default_device_timing",
      [](const std::string& timing) {
        profiler::set_default_device_timing(parse_device_timing(timing));
      },
      py::arg("timing"));
  m.def("default_device_timing", [] {
    return profiler::default_device_timing() == profiler::DeviceTiming::Traced ? "traced"
                                                                               : "events";
  });
  // The work tracer traced timing uses here: (name, None), or (None, why there is none).
  m.def("work_tracer", []() -> py::tuple {
    const auto [name, why] = profiler::work_tracer_status();
    if (name.empty()) return py::make_tuple(py::none(), why);
    return py::make_tuple(name, py::none());
  });
  // Per op brick and input signature: (path, name, overload, device, shapes, dtypes, values,
  // calls, total_ns, min_ns, max_ns, kind), the signature's three parts as JSON text.
  m.def("shape_rows", [] {
    std::vector<profiler::ShapeRow> rows;
    {
      py::gil_scoped_release released;  // may wait for device work
      rows = profiler::shape_rows();
    }
    py::list out;
    for (const profiler::ShapeRow& row : rows) {
      out.append(py::make_tuple(row.path, row.name, row.overload, row.device, row.shapes,
                                row.dtypes, row.values, row.calls, row.total_ns, row.min_ns,
                                row.max_ns, registry::kind_name(row.kind)));
    }
    return out;
  });
  m.def("live_events_by_device", &profiler::live_events_by_device);
  // The profiler's health counters; `since_reset`: discarded_by_reset counts only the records
  // discarded since the figures were last reset while not profiling (what a report holds), else
  // since the registry was made (with stats()' counts, every call made is accounted for).
  m.def(
      "health",
      [](bool since_reset) {
        const auto h = profiler::health();
        py::dict d;
        d["unbalanced_exits"] = h.unbalanced_exits;
        d["timing_failures"] = h.timing_failures;
        d["pending_events"] = h.pending_events;
        d["live_events"] = h.live_events;
        d["capture_skipped"] = h.capture_skipped;
        d["stub_capture_skipped"] = h.stub_capture_skipped;
        d["stub_failures"] = h.stub_failures;
        d["traced_unattributed"] = h.traced_unattributed;
        d["traced_lost"] = h.traced_lost;
        d["traced_work_ns"] = h.traced_work_ns;
        d["discarded_by_reset"] =
            since_reset ? discarded_since_reset() : profiler::brick_registry().discarded_by_reset();
        return d;
      },
      py::arg("since_reset") = false);
  m.attr("DEVICE_AT_CPU_TIME") = profiler::kDeviceAtCpuTime;
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
  // Module bricks: a RecordFunction range per module call, on a per-thread stack.
  m.def("push_range", &profiler::push_range, py::arg("name"));
  m.def("pop_ranges", &profiler::pop_ranges, py::arg("depth"));
  m.def("range_depth", &profiler::range_depth);
  // Around each call of a graph torch.compile generated for brick (runtime::in_compiled_code).
  m.def("enter_compiled_code", &runtime::enter_compiled_code);
  m.def("exit_compiled_code", &runtime::exit_compiled_code);
  m.def("kineto_plugin_available", &profiler::kineto_plugin_available);
  profiler::set_device_properties_source(&device_properties_json);
  m.def("kineto_plugin_stats", [] {
    const profiler::KinetoPluginStats stats = profiler::kineto_plugin_stats();
    py::dict d;
    d["sessions_processed"] = stats.sessions_processed;
    d["activities_emitted"] = stats.activities_emitted;
    d["activities_unlinked"] = stats.activities_unlinked;
    d["capture_skipped"] = stats.capture_skipped;
    d["failed"] = stats.failed;
    return d;
  });
}

}  // namespace brick::bindings
