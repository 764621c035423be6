"""Module bricks: every ``nn.Module`` call a range named by the module's qualified path
(``model.layers.0.self_attn``, ``layer1.0.conv2``), nested as the modules nest, without editing
the model. ``profile(modules=True)`` installs them for its region.

Two global hooks (PyTorch's ``register_module_forward_pre_hook`` / ``register_module_forward_hook``,
the latter ``always_call`` so that a forward that raises still closes its range) open and close a
``record_function`` range around each module's forward, so the module bricks are ranges every
profiler sees: the registry, the legacy profiler and torch.profiler.

Names: the outermost module called is the root, named by its class (``Qwen2ForCausalLM``); a
module called while another runs is named by its path under the root as ``named_modules()``
gives it (the first name of a shared or tied module), else by its path under the module that
called it, else by its class. A module called twice counts twice.

What is not a module brick: inside a region ``torch.compile`` traces, the hooks do nothing (the
compiled module's call is one brick); backward, per module: PyTorch's full backward hooks wrap
each module's outputs in a ``BackwardHookFunction``, which breaks models that modify a module's
output in place (``ReLU(inplace=True)`` after a convolution), and ranges opened from tensor hooks
do not nest across residual branches, so backward time stays on the autograd nodes' bricks
(``ConvolutionBackward0`` …), not on modules.
"""

from __future__ import annotations

import threading
import weakref
from typing import Dict, List, Optional, Tuple

import torch

__all__ = ["ModuleBricks"]

from .. import _C

# One call in, one call out: the range is a RecordFunction kept on brick's per-thread stack
# (csrc/profiler/range_stack.h), not a handle through the dispatcher (record_function's way,
# ~9 us a pair here).
_push_range = _C._profiler.push_range
_pop_ranges = _C._profiler.pop_ranges
_is_compiling = torch.compiler.is_compiling


class ModuleBricks:
    """Installs the module hooks while entered; ``names``: the module bricks seen, in the order
    of their first call. One at a time per process (the hooks are global)."""

    _active: Optional["ModuleBricks"] = None

    def __init__(self):
        self.names: Dict[str, None] = {}
        self._local = threading.local()
        # parent module -> {id(descendant): relative name}, rebuilt when a lookup goes stale
        self._relative: "weakref.WeakKeyDictionary[torch.nn.Module, Dict[int, str]]" = \
            weakref.WeakKeyDictionary()
        self._handles: List = []
        # (root, module, caller) ids -> (module ref, root ref, name): a name is resolved once
        self._names: Dict[Tuple[int, int, int], Tuple] = {}

    # ---- naming --------------------------------------------------------------------------------
    def _descendants(self, parent: torch.nn.Module, rebuild: bool = False) -> Dict[int, str]:
        table = None if rebuild else self._relative.get(parent)
        if table is None:
            table = {}
            for name, module in parent.named_modules():
                if name:
                    table.setdefault(id(module), name)
            self._relative[parent] = table
        return table

    def _relative_name(self, parent: torch.nn.Module, module: torch.nn.Module) -> Optional[str]:
        for rebuild in (False, True):
            name = self._descendants(parent, rebuild).get(id(module))
            if name is not None:
                try:
                    if parent.get_submodule(name) is module:
                        return name
                except AttributeError:
                    pass
        return None

    def _name(self, module: torch.nn.Module, stack: List[Tuple]) -> str:
        if not stack:
            return type(module).__name__
        root = stack[0][0]
        key = (id(root), id(module), id(stack[-1][0]))
        cached = self._names.get(key)
        if cached is not None and cached[0]() is module and cached[1]() is root:
            return cached[2]
        name = self._resolve(module, stack, root)
        self._names[key] = (weakref.ref(module), weakref.ref(root), name)
        return name

    def _resolve(self, module: torch.nn.Module, stack: List[Tuple], root) -> str:
        name = self._relative_name(root, module)
        if name is not None:
            return name
        parent, parent_name, _ = stack[-1]
        name = self._relative_name(parent, module)
        if name is not None:
            return name if parent is root else f"{parent_name}.{name}"
        return f"{parent_name}.<{type(module).__name__}>"

    # ---- hooks ---------------------------------------------------------------------------------
    def _stack(self) -> List[Tuple]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _pre_hook(self, module, args):
        if _is_compiling():
            return None
        stack = self._stack()
        name = self._name(module, stack)
        if name not in self.names:
            self.names[name] = None
        stack.append((module, name, _push_range(name)))
        return None

    def _post_hook(self, module, args, output):
        if _is_compiling():
            return None
        stack = self._stack()
        # Normally the top; after a forward that raised inside a child, end the child too.
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is module:
                _pop_ranges(stack[i][2])
                del stack[i:]
                break
        return None

    def __enter__(self) -> "ModuleBricks":
        if ModuleBricks._active is not None:
            raise RuntimeError("brick profiler: module bricks are already on (one profile with "
                               "modules=True at a time)")
        ModuleBricks._active = self
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._pre_hook),
                         hooks.register_module_forward_hook(self._post_hook, always_call=True)]
        return self

    def __exit__(self, *exc) -> bool:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        ModuleBricks._active = None
        return False
