// Input shapes per op (`profile(record_shapes=True)`): the signature of each op call (its
// inputs' shapes and dtypes, and the values of its small integer arguments), and per (op brick,
// signature) the calls and time the observer measured: the rows of torch.profiler's
// key_averages(group_by_input_shape=True), from brick's own timing. Off by default: while off,
// the op path reads one flag, and PyTorch does not copy any op's inputs for brick.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "registry/registry.h"

namespace brick::profiler {

struct ShapeRow {
  registry::NodeId node;
  std::string name;      // the op
  std::string overload;  // the overload its call took ("Tensor" for aten::add.Tensor; "" for none)
  std::string path;      // its brick's call path, as the registry's path view names it
  int device;
  // Op, or Host for the calls that ran no brick work (a CPU op's; see the observer): the same
  // path's brick row and host row have their own signature rows.
  registry::Kind kind = registry::Kind::Op;
  // JSON lists with one entry per input: a tensor's sizes, a tensor list's sizes (a list of
  // them), [] for anything else; its dtype ("Float", "BFloat16"), "TensorList", or the kind of
  // value ("int", "float", "bool", "int[]", "None", "str", "Device", ...); the value of an int,
  // bool or int list input (the arguments that shape an op's work: a convolution's stride),
  // null otherwise.
  std::string shapes;
  std::string dtypes;
  std::string values;
  uint64_t calls;
  int64_t total_ns;
  int64_t min_ns;
  int64_t max_ns;
};

// Every (op brick, signature) recorded since the last reset(), after resolving outstanding device
// events (as snapshot() does), in order of first appearance.
std::vector<ShapeRow> shape_rows();

}  // namespace brick::profiler
