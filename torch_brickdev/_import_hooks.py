"""Post-import hooks: brick's part of another library, set up the moment that library is imported,
without brick importing it (brick changes nothing in a library the program does not use)."""

import importlib.abc
import importlib.util
import sys
import warnings


def _register(name: str, callback) -> None:
    """Runs ``callback``; a failure is a warning, never a failed import (of brick or of ``name``)."""
    try:
        callback()
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"torch_brickdev: registering brick with {name} failed: "
                      f"{type(error).__name__}: {error}")


class _AfterImport(importlib.abc.MetaPathFinder):
    """A one-shot post-import hook: `callback()` runs right after module `name` has executed, so
    that brick's part of it exists as soon as the module does, without brick importing it."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; the real finders now find the module
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_register(module):
            exec_module(module)
            _register(fullname, callback)

        spec.loader.exec_module = exec_then_register
        return spec


def after_import(name: str, callback) -> None:
    """Runs ``callback()`` right after module ``name`` is imported, or now if it already is."""
    if name in sys.modules:
        _register(name, callback)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
