// The signatures of op calls and the figures per (op brick, signature): see shape_table.h.
#include "profiler/shape_table.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace brick::profiler {

namespace detail {

namespace {

struct Signature {
  std::string overload;
  std::string shapes;
  std::string dtypes;
  std::string values;
};

struct ShapeFigures {
  uint64_t calls = 0;
  int64_t total_ns = 0;
  int64_t min_ns = std::numeric_limits<int64_t>::max();
  int64_t max_ns = 0;
};

// Signatures are interned for the process (a profile's few hundred distinct ones); the figures
// per (node, signature) live until reset(). One lock each: recording shapes is asked for, and
// costs what it costs (docs/benchmarks.md), never the op path of a profile without it.
struct ShapeTable {
  std::mutex signatures_mutex;
  std::unordered_map<std::string, uint32_t> ids;
  std::vector<Signature> signatures;

  std::mutex figures_mutex;
  std::unordered_map<uint64_t, size_t> row_of;  // (node << 32 | signature) -> rows index
  std::vector<std::pair<uint64_t, ShapeFigures>> rows;
};

ShapeTable& table() {
  static auto* shapes = new ShapeTable();  // outlives every thread that may still record
  return *shapes;
}

void write_sizes(std::ostream& out, const at::Tensor& tensor) {
  out << '[';
  if (tensor.defined()) {
    const c10::SymIntArrayRef sizes = tensor.sym_sizes();
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (i > 0) out << ", ";
      if (const auto size = sizes[i].maybe_as_int()) {
        out << *size;
      } else {
        out << '"' << sizes[i] << '"';  // a symbolic size, by its expression
      }
    }
  }
  out << ']';
}

// The kind of a non-tensor input, as Python names it ("int", "float", "bool", "None", "str"), or
// as the IValue does ("Device", "Generator", "GenericList").
std::string value_kind(const c10::IValue& input) {
  if (input.isInt()) return "int";
  if (input.isDouble()) return "float";
  if (input.isBool()) return "bool";
  if (input.isNone()) return "None";
  if (input.isString()) return "str";
  if (input.isComplexDouble()) return "complex";
  return input.tagKind();
}

bool is_int_list(const c10::IValue& input) {
  if (input.isIntList()) return true;
  if (!input.isList()) return false;
  const auto list = input.toListRef();
  return std::all_of(list.begin(), list.end(), [](const c10::IValue& v) { return v.isInt(); });
}

// A list of tensors or nones with at least one tensor.
bool is_tensor_list(const c10::IValue& input) {
  if (!input.isList()) return false;
  const auto list = input.toListRef();
  return std::any_of(list.begin(), list.end(), [](const c10::IValue& v) { return v.isTensor(); }) &&
         std::all_of(list.begin(), list.end(),
                     [](const c10::IValue& v) { return v.isTensor() || v.isNone(); });
}

void write_input(const c10::IValue& input, std::ostream& shapes, std::ostream& dtypes,
                 std::ostream& values) {
  if (input.isTensor()) {
    const at::Tensor& tensor = input.toTensor();
    write_sizes(shapes, tensor);
    dtypes << '"' << (tensor.defined() ? c10::toString(tensor.scalar_type()) : "Undefined") << '"';
    values << "null";
  } else if (input.isTensorList() || is_tensor_list(input)) {
    // Tensors (a cat's inputs), or optional tensors (an index's indices: none is []).
    shapes << '[';
    const auto list = input.toListRef();
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) shapes << ", ";
      write_sizes(shapes, list[i].isTensor() ? list[i].toTensor() : at::Tensor());
    }
    shapes << ']';
    dtypes << "\"TensorList\"";
    values << "null";
  } else if (is_int_list(input)) {
    // An int[] argument arrives as a list of ints (a view's sizes, a convolution's stride).
    shapes << "[]";
    dtypes << "\"int[]\"";
    values << '[';
    const auto list = input.toListRef();
    for (size_t i = 0; i < list.size(); ++i) values << (i > 0 ? ", " : "") << list[i].toInt();
    values << ']';
  } else {
    shapes << "[]";
    dtypes << '"' << value_kind(input) << '"';
    if (input.isInt()) {
      values << input.toInt();
    } else if (input.isBool()) {
      values << (input.toBool() ? "true" : "false");
    } else {
      values << "null";
    }
  }
}

// A 64-bit digest of exactly what write_input writes, so that a call whose signature was seen
// before finds its id without building the text. nullopt for what it cannot digest without the
// text (a symbolic size, an uncommon kind of value).
class SignatureDigest {
 public:
  void add(uint64_t value) noexcept {
    // splitmix64's finalizer over the running state: every input bit reaches every output bit.
    uint64_t z = (state_ ^ value) + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    state_ = z ^ (z >> 31);
  }
  bool add_sizes(const at::Tensor& tensor) noexcept {
    if (!tensor.defined()) {
      add(kUndefined);
      return true;
    }
    if (tensor.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return false;
    const c10::IntArrayRef sizes = tensor.sizes();
    add(sizes.size());
    for (const int64_t size : sizes) add(static_cast<uint64_t>(size));
    return true;
  }
  bool add_input(const c10::IValue& input) noexcept {
    if (input.isTensor()) {
      const at::Tensor& tensor = input.toTensor();
      add(kTensor);
      add(tensor.defined() ? static_cast<uint64_t>(tensor.scalar_type()) : kUndefined);
      return add_sizes(tensor);
    }
    if (input.isTensorList() || is_tensor_list(input)) {
      const auto list = input.toListRef();
      add(kTensorList);
      add(list.size());
      for (const c10::IValue& item : list) {
        if (!add_sizes(item.isTensor() ? item.toTensor() : at::Tensor())) return false;
      }
      return true;
    }
    if (is_int_list(input)) {
      const auto list = input.toListRef();
      add(kIntList);
      add(list.size());
      for (const c10::IValue& item : list) add(static_cast<uint64_t>(item.toInt()));
      return true;
    }
    if (input.isInt()) {
      add(kInt);
      add(static_cast<uint64_t>(input.toInt()));
    } else if (input.isBool()) {
      add(input.toBool() ? kTrue : kFalse);
    } else if (input.isDouble()) {
      add(kDouble);
    } else if (input.isNone()) {
      add(kNone);
    } else {
      return false;  // its kind is named by text: the slow path writes it
    }
    return true;
  }
  uint64_t value() const noexcept { return state_; }

 private:
  enum : uint64_t {
    kUndefined = 1ULL << 40,
    kTensor,
    kTensorList,
    kIntList,
    kInt,
    kTrue,
    kFalse,
    kDouble,
    kNone,
  };
  uint64_t state_ = 0;
};

// This thread's digests of the signatures it has seen (ids are the process's, never reused).
std::unordered_map<uint64_t, uint32_t>& seen_signatures() {
  thread_local std::unordered_map<uint64_t, uint32_t> seen;
  return seen;
}

uint32_t intern_signature_text(const at::RecordFunction& fn);

}  // namespace

uint32_t intern_signature(const at::RecordFunction& fn) {
  SignatureDigest digest;
  const auto inputs = fn.inputs();
  digest.add(std::hash<std::string_view>{}(fn.overload_name()));
  digest.add(inputs.size());
  bool digested = true;
  for (const c10::IValue& input : inputs) {
    if (!digest.add_input(input)) {
      digested = false;
      break;
    }
  }
  if (!digested) return intern_signature_text(fn);
  auto& seen = seen_signatures();
  if (const auto it = seen.find(digest.value()); it != seen.end()) return it->second;
  const uint32_t id = intern_signature_text(fn);
  seen.emplace(digest.value(), id);
  return id;
}

namespace {

uint32_t intern_signature_text(const at::RecordFunction& fn) {
  std::ostringstream shapes, dtypes, values;
  shapes << '[';
  dtypes << '[';
  values << '[';
  const auto inputs = fn.inputs();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i > 0) {
      shapes << ", ";
      dtypes << ", ";
      values << ", ";
    }
    write_input(inputs[i], shapes, dtypes, values);
  }
  shapes << ']';
  dtypes << ']';
  values << ']';
  Signature signature{fn.overload_name(), shapes.str(), dtypes.str(), values.str()};
  std::string key = signature.overload + '\n' + signature.shapes + '\n' + signature.dtypes + '\n' +
                    signature.values;
  ShapeTable& shapes_table = table();
  std::lock_guard<std::mutex> lock(shapes_table.signatures_mutex);
  const auto [it, added] = shapes_table.ids.emplace(
      std::move(key), static_cast<uint32_t>(shapes_table.signatures.size()));
  if (added) shapes_table.signatures.push_back(std::move(signature));
  return it->second;
}

}  // namespace

bool record_shape(registry::NodeId node, uint32_t signature, int64_t ns) noexcept {
  ns = std::max<int64_t>(ns, 0);  // as the registry records a negative duration
  ShapeTable& shapes_table = table();
  const uint64_t key = uint64_t{node} << 32 | signature;
  try {
    std::lock_guard<std::mutex> lock(shapes_table.figures_mutex);
    auto [it, added] = shapes_table.row_of.emplace(key, shapes_table.rows.size());
    if (added) shapes_table.rows.emplace_back(key, ShapeFigures{});
    ShapeFigures& figures = shapes_table.rows[it->second].second;
    ++figures.calls;
    figures.total_ns += ns;
    figures.min_ns = std::min(figures.min_ns, ns);
    figures.max_ns = std::max(figures.max_ns, ns);
    return true;
  } catch (...) {
    return false;
  }
}

void reset_shapes() {
  ShapeTable& shapes_table = table();
  std::lock_guard<std::mutex> lock(shapes_table.figures_mutex);
  shapes_table.row_of.clear();
  shapes_table.rows.clear();
}

std::vector<ShapeRow> recorded_shapes() {
  ShapeTable& shapes_table = table();
  std::vector<std::pair<uint64_t, ShapeFigures>> rows;
  {
    std::lock_guard<std::mutex> lock(shapes_table.figures_mutex);
    rows = shapes_table.rows;
  }
  std::vector<ShapeRow> out;
  out.reserve(rows.size());
  std::lock_guard<std::mutex> lock(shapes_table.signatures_mutex);
  for (const auto& [key, figures] : rows) {
    const Signature& signature = shapes_table.signatures[key & 0xffffffffu];
    ShapeRow& row = out.emplace_back();
    row.node = static_cast<registry::NodeId>(key >> 32);
    row.overload = signature.overload;
    row.shapes = signature.shapes;
    row.dtypes = signature.dtypes;
    row.values = signature.values;
    row.calls = figures.calls;
    row.total_ns = figures.total_ns;
    row.min_ns = figures.min_ns;
    row.max_ns = figures.max_ns;
  }
  return out;
}

}  // namespace detail

}  // namespace brick::profiler
