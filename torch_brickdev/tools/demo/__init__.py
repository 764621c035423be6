"""The decode demo: :func:`run_demo` profiles repeated decodes of a small Qwen-style decoder on
brick with the brick registry, writes ``report.json`` and a chrome ``trace.json`` from one
legacy-profiled decode, and :func:`format_summary` renders the result.

Its parts: the configuration (:mod:`.config`), the model and its bricks (:mod:`.model`), the timed
decode (:mod:`.decoding`) and the run and its summary (:mod:`.run`); their public names are
importable from here too.
"""

from torch_brickdev._lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
