// Composite ops that PyTorch computes differently on the CPU than on any other device run on the
// host runtime exactly as the CPU runs them, backward included.
//
// The recurrent layers and cells are composite ops (RNN.cpp) that test the device type: the CPU
// runs LSTM through mkldnn, projects a whole sequence's inputs with one matmul before the time
// loop, and computes the cells unfused; every other device, brick included, runs the fused cell
// ops step by step. The results differ in the last bits (nn.LSTM forward by ~3e-8), so a model
// trained on brick would drift from the same model on the CPU. Brick therefore answers these ops
// at its autograd key: it runs the CPU's composite on aliases of brick memory, with the CPU's
// own autograd graph (leaves aliasing the brick inputs that require grad), hands back brick
// tensors viewing the CPU's results, and records one node whose backward runs that graph's
// backward. Bit-equal to the CPU, forward and backward; the CPU's ops inside are the brick op's
// device work, never recorded as calls of their own. Double backward through these ops is
// refused with a message (the CPU graph is differentiated once).
//
// Registered when host backing is decided; on CUDA backing these ops decompose on brick as before.
#include "backend/backing_graph.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/allocator.h"
#include "backend/autograd_node.h"
#include "backend/backing.h"
#include "backend/backing_alias.h"
#include "backend/device_index.h"
#include "backend/generator.h"

namespace brick::backend {

namespace {

// Keeps a CPU storage alive for as long as a brick storage views its bytes.
struct CpuStorageOwner {
  c10::intrusive_ptr<c10::StorageImpl> storage;
};

void release_cpu_storage(void* owner) { delete static_cast<CpuStorageOwner*>(owner); }

// A brick tensor on the bytes of `cpu`, a result of the CPU's composite that its autograd graph
// may hold too: no copy, the CPU storage lives as long as either needs it, and brick's memory
// statistics count the bytes while the brick tensor lives.
at::Tensor brick_view_of(const at::Tensor& cpu, c10::DeviceIndex device) {
  if (!cpu.defined()) return cpu;
  c10::StorageImpl* storage = cpu.storage().unsafeGetStorageImpl();
  const size_t nbytes = storage->nbytes();
  auto owner = std::make_unique<CpuStorageOwner>(
      CpuStorageOwner{c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage)});
  c10::DataPtr cpu_bytes(storage->data_ptr().get(), owner.get(), &release_cpu_storage,
                         storage->device());
  owner.release();  // (owned by cpu_bytes from here)
  c10::Storage brick_storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes,
      adopt_data_ptr(std::move(cpu_bytes), nbytes, device), brick_allocator(),
      /*resizable=*/true));
  return make_brick_tensor(std::move(brick_storage), cpu);
}

// The brick op's backward: the CPU graph's backward, from the brick outputs' gradients (as CPU
// aliases) to the CPU leaves, whose gradients come back as brick tensors.
struct BackingGraphBackward final : torch::autograd::Node {
  BackingGraphBackward(std::string op, c10::DeviceIndex device, std::vector<at::Tensor> outputs,
                       std::vector<at::Tensor> leaves, const std::vector<at::Tensor>& arguments)
      : op_(std::move(op)),
        device_(device),
        cpu_outputs_(std::move(outputs)),
        cpu_leaves_(std::move(leaves)) {
    saved_arguments_.reserve(arguments.size());
    for (const at::Tensor& argument : arguments) {
      saved_arguments_.emplace_back(argument, /*is_output=*/false);
    }
  }

  std::string name() const override { return "BrickBackingGraphBackward(" + op_ + ")"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(!at::GradMode::is_enabled(), "brick: ", op_,
                " on brick runs the CPU's own graph, which is differentiated once: double "
                "backward (create_graph=True) through it is not supported");
    TORCH_CHECK(!cpu_leaves_.empty(), "brick: ", op_,
                ": trying to backward through the graph a second time (its buffers were freed; "
                "specify retain_graph=True the first time)");
    // An argument modified in place since the forward: refused as autograd refuses it.
    for (const auto& saved : saved_arguments_) (void)saved.unpack();
    std::vector<at::Tensor> roots, root_grads;
    for (size_t i = 0; i < grads.size() && i < cpu_outputs_.size(); ++i) {
      if (!grads[i].defined() || !cpu_outputs_[i].requires_grad()) continue;
      roots.push_back(cpu_outputs_[i]);
      root_grads.push_back(make_backing_alias(grads[i]));
    }
    torch::autograd::variable_list result(cpu_leaves_.size());
    if (roots.empty()) return result;
    std::vector<at::Tensor> cpu_grads;
    {
      BackingScope scope(device_);
      UnrecordedBackingOps unrecorded;
      // retain_graph: this node may run again (the user's retain_graph=True); the graph goes
      // with release_variables().
      cpu_grads = torch::autograd::grad(roots, cpu_leaves_, root_grads, /*retain_graph=*/true,
                                        /*create_graph=*/false, /*allow_unused=*/true);
    }
    for (size_t i = 0; i < cpu_grads.size(); ++i) result[i] = brick_view_of(cpu_grads[i], device_);
    return result;
  }

  void release_variables() override {
    cpu_outputs_.clear();
    cpu_leaves_.clear();
    for (auto& saved : saved_arguments_) saved.reset_data();
  }

 private:
  std::string op_;
  c10::DeviceIndex device_;
  std::vector<at::Tensor> cpu_outputs_;  // the CPU graph's roots, one per op output
  std::vector<at::Tensor> cpu_leaves_;   // aliases of the brick inputs that require grad
  // Every brick tensor argument: the CPU graph saved aliases that do not own their memory (the
  // initial hidden state nn.LSTM makes and drops at once, say), so they are kept alive here, and
  // checked for in-place changes.
  std::vector<torch::autograd::SavedVariable> saved_arguments_;
};

// For its duration, the CPU's default generator draws brick device `device`'s stream: the CPU's
// recurrent composites drop out between layers with at::dropout, which takes no generator. The
// states are exchanged under each generator's lock, as torch.random.fork_rng does in Python; a
// thread drawing from the CPU's default generator meanwhile would draw from brick's stream.
class BrickRandomStream {
 public:
  explicit BrickRandomStream(c10::DeviceIndex device)
      : brick_(static_cast<const BrickGenerator*>(
                   brick_default_generator(device).unsafeGetGeneratorImpl())
                   ->backing()),
        cpu_(at::detail::getDefaultCPUGenerator()) {
    saved_ = state_of(cpu_);
    set_state(cpu_, *state_of(brick_));
  }
  ~BrickRandomStream() {
    set_state(brick_, *state_of(cpu_));
    set_state(cpu_, *saved_);
  }
  BrickRandomStream(const BrickRandomStream&) = delete;
  BrickRandomStream& operator=(const BrickRandomStream&) = delete;

 private:
  static c10::intrusive_ptr<c10::TensorImpl> state_of(at::Generator& generator) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.unsafeGetGeneratorImpl()->get_state();
  }
  static void set_state(at::Generator& generator, const c10::TensorImpl& state) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.unsafeGetGeneratorImpl()->set_state(state);
  }

  at::Generator brick_;
  at::Generator cpu_;
  c10::intrusive_ptr<c10::TensorImpl> saved_;
};

// Whether the recurrent op on `stack` drops out (its `dropout` > 0 while `train`).
bool drops_out(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  const auto& arguments = schema.arguments();
  const size_t first = stack.size() - arguments.size();
  std::optional<double> dropout;
  std::optional<bool> train;
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].name() == "dropout") dropout = stack[first + i].toDouble();
    if (arguments[i].name() == "train") train = stack[first + i].toBool();
  }
  return dropout.value_or(0) > 0 && train.value_or(false);
}

// The boxed autograd kernel: every brick tensor argument (alone or in a list) becomes a CPU
// alias, a leaf requiring grad where the brick tensor requires it; the op runs through full
// dispatch on them (the CPU's composite and autograd); its results come back as brick tensors
// with one BackingGraphBackward node behind the differentiable ones.
void run_as_the_cpu_does(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/,
                         torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const bool grad = at::GradMode::is_enabled();
  std::optional<c10::DeviceIndex> device;
  std::vector<at::Tensor> arguments;  // every brick tensor argument
  std::vector<at::Tensor> inputs;     // those requiring grad, in argument order
  std::vector<at::Tensor> leaves;     // their CPU aliases
  auto to_cpu = [&](const at::Tensor& tensor) -> at::Tensor {
    if (!tensor.defined() || tensor.device().type() != kBrick) return tensor;
    if (!device.has_value()) device = tensor.device().index();
    TORCH_CHECK(tensor.device().index() == *device, "brick: ", schema.name(),
                " expected every brick tensor on one device, got brick:", static_cast<int>(*device),
                " and ", tensor.device());
    at::Tensor alias = make_backing_alias(tensor);
    arguments.push_back(tensor);
    // The flag, also without grad mode: the CPU's composites read it (matmul folds a batched
    // input into one mm when the weight requires grad, under no_grad too), and the CPU runs
    // them on parameters that have it.
    if (tensor.requires_grad()) alias.set_requires_grad(true);
    if (grad && tensor.requires_grad()) {
      inputs.push_back(tensor);
      leaves.push_back(alias);
    }
    return alias;
  };
  const size_t argument_count = schema.arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(argument_count); it != stack->end();
       ++it) {
    if (it->isTensor()) {
      *it = to_cpu(it->toTensor());
    } else if (it->isTensorList()) {
      c10::List<at::Tensor> converted;
      for (const at::Tensor& tensor : it->toTensorList()) converted.push_back(to_cpu(tensor));
      *it = std::move(converted);
    }
  }
  TORCH_CHECK(device.has_value(), "brick: ", schema.name(),
              " reached brick's kernel with no brick tensor among its arguments");
  {
    BackingScope scope(*device);
    UnrecordedBackingOps unrecorded;
    std::optional<BrickRandomStream> random_stream;
    if (drops_out(schema, *stack)) random_stream.emplace(*device);
    op.callBoxed(stack);
  }
  const size_t return_count = schema.returns().size();
  std::vector<at::Tensor> cpu_outputs, outputs;
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(return_count); it != stack->end();
       ++it) {
    TORCH_INTERNAL_ASSERT(it->isTensor(), "brick: ", schema.name(), " returned a non-tensor");
    cpu_outputs.push_back(it->toTensor());
    outputs.push_back(brick_view_of(cpu_outputs.back(), *device));
    *it = outputs.back();
  }
  if (inputs.empty()) return;
  auto node = make_node<BackingGraphBackward>(schema.name(), *device, cpu_outputs,
                                              std::move(leaves), arguments);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  for (size_t i = 0; i < outputs.size(); ++i) {
    // One input of the node per output, differentiable or not, so gradients keep their index.
    if (cpu_outputs[i].defined() && cpu_outputs[i].requires_grad()) {
      const uint32_t input_nr = node->add_input_metadata(outputs[i]);
      torch::autograd::impl::set_gradient_edge(outputs[i], torch::autograd::Edge(node, input_nr));
    } else {
      node->add_input_metadata(torch::autograd::Node::undefined_input());
    }
  }
}

}  // namespace

void register_host_backing_kernels() {
  static const auto library = [] {
    auto made = std::make_unique<torch::Library>(
        torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
    for (const char* op : {"lstm.input", "lstm.data", "gru.input", "gru.data", "rnn_tanh.input",
                           "rnn_tanh.data", "rnn_relu.input", "rnn_relu.data", "lstm_cell",
                           "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"}) {
      made->impl(op, torch::CppFunction::makeFromBoxedFunction<&run_as_the_cpu_does>());
    }
    return made;
  }();
  (void)library;
}

}  // namespace brick::backend
