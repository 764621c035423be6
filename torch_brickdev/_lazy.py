"""A package whose public names load with their module on first use (PEP 562), so that importing
the package costs nothing of what its parts import (torch, the native module)."""

import importlib
from typing import Callable, Dict, List, Tuple


def lazy_exports(package: str, exports: Dict[str, str],
                 namespace: dict) -> Tuple[Callable[[str], object], Callable[[], List[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps each public name to
    the submodule that defines it; any other name is tried as a submodule (``package.part``).
    ``namespace`` is the package's ``globals()``: a name read once is kept there."""

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(f".{exports[name]}", package), name)
            namespace[name] = value  # later reads find it without this function
            return value
        try:  # a submodule not yet imported
            return importlib.import_module(f".{name}", package)
        except ModuleNotFoundError as error:
            if error.name != f"{package}.{name}":
                raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
