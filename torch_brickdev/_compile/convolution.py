"""Convolution layouts under FakeTensor (dynamo, Inductor, export), predicted for brick inputs as
for the backing device's tensors (see :func:`predict_as_the_backing_device`)."""

import torch

from .. import BACKEND_NAME, _C


def predict_as_the_backing_device() -> None:
    """FakeTensor (dynamo, Inductor, export) predicts a convolution's output layout from the
    convolution backend PyTorch would pick for its inputs: for brick's, ``Overrideable``, whose
    layout it takes to be contiguous. Brick runs its backing device's convolution, which returns
    channels_last when the input *or the weight* is (the CPU's mkldnn and slow kernels, cuDNN on
    CUDA), so a compiled graph whose weights Inductor made channels_last failed its stride
    checks ("expected ... stride 1==16"). For brick inputs the prediction is made as for the
    backing device's tensors of the same sizes and strides; every other input is left to
    PyTorch's rule. (torch._subclasses.fake_impls is imported with torch: nothing is imported.)"""
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import _pytree as pytree

    rules = getattr(fake_impls, "op_implementations_dict", None)
    if rules is None:  # a PyTorch that keeps its fake rules elsewhere: left as it is
        return
    aten = torch.ops.aten
    for op in (aten.convolution.default, aten._convolution.default,
               aten._convolution.deprecated, aten.convolution_backward.default):
        pytorch_rule = rules.get(op)
        if pytorch_rule is None or getattr(pytorch_rule, "_brick_backing_rule", False):
            continue

        def backing_rule(fake_mode, func, *args, _pytorch_rule=pytorch_rule, **kwargs):
            leaves = pytree.tree_leaves((args, kwargs))
            brick = next((t.fake_device for t in leaves if isinstance(t, FakeTensor)
                          and t.fake_device.type == BACKEND_NAME), None)
            if brick is None:
                return _pytorch_rule(fake_mode, func, *args, **kwargs)
            backing_type = _C._backing_device_type()
            backing = torch.device(backing_type, brick.index) if backing_type == "cuda" else \
                torch.device("cpu")

            def on_backing(t):
                if not (isinstance(t, FakeTensor) and t.fake_device.type == BACKEND_NAME):
                    return t
                with fake_mode:
                    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=backing)

            def on_brick(t):
                if isinstance(t, FakeTensor) and t.fake_device == backing:
                    t.fake_device = brick
                return t

            args, kwargs = pytree.tree_map(on_backing, (args, kwargs))
            return pytree.tree_map(on_brick, _pytorch_rule(fake_mode, func, *args, **kwargs))

        backing_rule._brick_backing_rule = True
        rules[op] = backing_rule
