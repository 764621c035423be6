"""Tools built on the torch_brickdev library (``torch.brick`` and ``torch_brickdev.profiler``):
the decode demo (:mod:`.demo`), the decode-profiling contract (:mod:`.contract`), the command
line (:mod:`.cli`, run as ``python -m torch_brickdev``) and the pytest plugin
(:mod:`.pytest_plugin`). They use only the library's public API."""
