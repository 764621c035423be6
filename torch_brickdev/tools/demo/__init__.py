"""The decode demo: :func:`run_demo` profiles repeated decodes of a small Qwen-style decoder on
brick with the brick registry, writes ``report.json`` and a chrome ``trace.json`` from one
legacy-profiled decode, and :func:`format_summary` renders the result.

Its parts: the configuration (:mod:`.config`), the model and its bricks (:mod:`.model`), the timed
decode (:mod:`.decoding`) and the run and its summary (:mod:`.run`); their public names are
importable from here too.
"""

import importlib

# Where each public name lives; a part loads when one of its names is first used (PEP 562). The
# configuration needs no torch: the command line reads the demo's defaults, and checks a
# configuration, before it loads torch.
_EXPORTS = {
    "DecodeConfig": "config", "DecodeConfigTypeError": "config",
    "DecodeResult": "decoding", "decode": "decoding", "prompt_ids": "decoding",
    "QwenStyleDecoder": "model", "build_model": "model",
    "FINAL_TOKEN_NOTE": "run", "default_threads": "run", "format_summary": "run",
    "run_demo": "run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # later reads find it without this function
        return value
    try:  # a part not yet imported (``demo.run``)
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
