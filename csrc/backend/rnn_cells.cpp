// The fused LSTM and GRU cells. PyTorch sends the cells of nn.LSTM, nn.GRU, LSTMCell and GRUCell
// on every device but the CPU to these ops (`input.is_privateuseone()` in RNN.cpp), and only CUDA
// implements them. Brick computes them on the backing device, on aliases of brick memory, with
// CUDA's contract: the same results, and the same workspace layout, which is what the backward
// ops read.
//
// The gate sum adds the hidden side first, as the CPU's unfused cell does (linear_hh(hx) plus
// linear_ih(input)), so brick's results stay as close to the CPU's as the split of the bias
// from the matmul allows.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "backend/backing_call.h"
#include "backend/device_index.h"

namespace brick::backend {

namespace {

void check_cell_arguments(const char* op, int64_t gate_count, const at::Tensor& input_gates,
                          const at::Tensor& hidden_gates, const at::Tensor& state,
                          const std::optional<at::Tensor>& input_bias,
                          const std::optional<at::Tensor>& hidden_bias) {
  TORCH_CHECK(input_gates.sizes() == hidden_gates.sizes(), "brick: ", op,
              " expected input_gates and hidden_gates of one shape, got ", input_gates.sizes(),
              " and ", hidden_gates.sizes());
  TORCH_CHECK(input_gates.dim() == 2 && state.dim() == 2 && input_gates.size(0) == state.size(0) &&
                  input_gates.size(1) == gate_count * state.size(1),
              "brick: ", op, " expected gates of shape (N, ", gate_count,
              " * H) for a state of shape (N, H), got gates ", input_gates.sizes(), " and state ",
              state.sizes());
  const bool has_input_bias = input_bias.has_value() && input_bias->defined();
  const bool has_hidden_bias = hidden_bias.has_value() && hidden_bias->defined();
  TORCH_CHECK(has_input_bias == has_hidden_bias, "brick: ", op,
              " expected both biases or neither, got only the ",
              has_input_bias ? "input" : "hidden", " bias");
  for (const at::Tensor* tensor : {&hidden_gates, &state}) {
    TORCH_CHECK(tensor->device() == input_gates.device(), "brick: ", op,
                " expected all tensors on ", input_gates.device(), ", got one on ",
                tensor->device());
  }
}

// Gate pre-activations: (hidden_gates + hidden_bias) + (input_gates + input_bias).
at::Tensor gate_sum(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                    const at::Tensor& input_bias, const at::Tensor& hidden_bias) {
  at::Tensor hidden = hidden_bias.defined() ? hidden_gates + hidden_bias : hidden_gates.clone();
  return input_bias.defined() ? hidden.add_(input_gates + input_bias) : hidden.add_(input_gates);
}

// (hy, cy, workspace); the workspace holds the activated gates [i, f, g, o], (N, 4H).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  check_cell_arguments("_thnn_fused_lstm_cell", 4, input_gates, hidden_gates, cx, input_bias,
                       hidden_bias);
  DispatchingBackingCall call("aten::_thnn_fused_lstm_cell", "", input_gates.device().index());
  return call.adopt(call.run([&] {
    at::Tensor workspace = gate_sum(call.alias(input_gates), call.alias(hidden_gates),
                                    call.alias(input_bias), call.alias(hidden_bias));
    auto gates = workspace.chunk(4, 1);
    gates[0].sigmoid_();
    gates[1].sigmoid_();
    gates[2].tanh_();
    gates[3].sigmoid_();
    at::Tensor cy = (gates[1] * call.alias(cx)).add_(gates[0] * gates[2]);
    at::Tensor hy = gates[3] * cy.tanh();
    return std::make_tuple(std::move(hy), std::move(cy), std::move(workspace));
  }));
}

// (grad_gates, grad_cx, grad_bias) from the forward's workspace; undefined incoming gradients
// are zeros.
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  DispatchingBackingCall call("aten::_thnn_fused_lstm_cell_backward_impl", "",
                              workspace.device().index());
  return call.adopt(call.run([&] {
    const auto gates = call.alias(workspace).chunk(4, 1);
    const at::Tensor& ingate = gates[0];
    const at::Tensor& forgetgate = gates[1];
    const at::Tensor& cellgate = gates[2];
    const at::Tensor& outgate = gates[3];
    const at::Tensor tanh_cy = call.alias(cy).tanh();
    const at::Tensor ghy = call.alias(grad_hy);
    const at::Tensor gcy = call.alias(grad_cy);

    // d(loss)/d(cy): through hy = o * tanh(cy), plus the incoming gradient of cy.
    at::Tensor grad_c =
        ghy.defined() ? ghy * outgate * (1 - tanh_cy * tanh_cy) : at::zeros_like(tanh_cy);
    if (gcy.defined()) grad_c.add_(gcy);
    const at::Tensor grad_out = ghy.defined() ? ghy * tanh_cy : at::zeros_like(tanh_cy);

    at::Tensor grad_gates =
        at::cat({grad_c * cellgate * ingate * (1 - ingate),
                 grad_c * call.alias(cx) * forgetgate * (1 - forgetgate),
                 grad_c * ingate * (1 - cellgate * cellgate), grad_out * outgate * (1 - outgate)},
                1);
    at::Tensor grad_cx = grad_c * forgetgate;
    at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
    return std::make_tuple(std::move(grad_gates), std::move(grad_cx), std::move(grad_bias));
  }));
}

// (hy, workspace); the workspace holds [r, z, n, hx, hn], (N, 5H), hn being the hidden side of
// the new gate (bias included), as CUDA's.
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates,
                                                  const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx,
                                                  const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  check_cell_arguments("_thnn_fused_gru_cell", 3, input_gates, hidden_gates, hx, input_bias,
                       hidden_bias);
  DispatchingBackingCall call("aten::_thnn_fused_gru_cell", "", input_gates.device().index());
  return call.adopt(call.run([&] {
    const at::Tensor input_bias_alias = call.alias(input_bias);
    const at::Tensor hidden_bias_alias = call.alias(hidden_bias);
    at::Tensor input_side = call.alias(input_gates);
    at::Tensor hidden_side = call.alias(hidden_gates);
    if (input_bias_alias.defined()) input_side = input_side + input_bias_alias;
    if (hidden_bias_alias.defined()) hidden_side = hidden_side + hidden_bias_alias;
    const auto input_chunks = input_side.chunk(3, 1);
    const auto hidden_chunks = hidden_side.chunk(3, 1);
    const at::Tensor& hx_alias = call.alias(hx);

    at::Tensor resetgate = (hidden_chunks[0] + input_chunks[0]).sigmoid_();
    at::Tensor updategate = (hidden_chunks[1] + input_chunks[1]).sigmoid_();
    at::Tensor newgate = (input_chunks[2] + resetgate * hidden_chunks[2]).tanh_();
    at::Tensor hy = newgate + updategate * (hx_alias - newgate);
    at::Tensor workspace =
        at::cat({resetgate, updategate, newgate, hx_alias, hidden_chunks[2]}, 1).contiguous();
    return std::make_tuple(std::move(hy), std::move(workspace));
  }));
}

// (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  DispatchingBackingCall call("aten::_thnn_fused_gru_cell_backward", "",
                              workspace.device().index());
  return call.adopt(call.run([&] {
    const auto saved = call.alias(workspace).chunk(5, 1);
    const at::Tensor& resetgate = saved[0];
    const at::Tensor& updategate = saved[1];
    const at::Tensor& newgate = saved[2];
    const at::Tensor& hx = saved[3];
    const at::Tensor& hidden_new = saved[4];
    const at::Tensor ghy = call.alias(grad_hy);

    const at::Tensor grad_update = ghy * (hx - newgate) * updategate * (1 - updategate);
    const at::Tensor grad_new_input = ghy * (1 - updategate) * (1 - newgate * newgate);
    const at::Tensor grad_new_hidden = grad_new_input * resetgate;
    const at::Tensor grad_reset = grad_new_input * hidden_new * resetgate * (1 - resetgate);
    at::Tensor grad_hx = ghy * updategate;
    at::Tensor grad_input_gates = at::cat({grad_reset, grad_update, grad_new_input}, 1);
    at::Tensor grad_hidden_gates = at::cat({grad_reset, grad_update, grad_new_hidden}, 1);
    at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
    at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
    return std::make_tuple(std::move(grad_input_gates), std::move(grad_hidden_gates),
                           std::move(grad_hx), std::move(grad_input_bias),
                           std::move(grad_hidden_bias));
  }));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward);
  m.impl("_thnn_fused_gru_cell", fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", fused_gru_cell_backward);
}

}  // namespace brick::backend
