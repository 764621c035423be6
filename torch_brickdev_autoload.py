"""The ``torch.backends`` entry point of torch_brickdev: ``import torch`` calls :func:`autoload`.

Loading brick registers PyTorch's PrivateUse1 backend, and PyTorch then takes it for *the*
accelerator of the process (``torch.accelerator.current_accelerator()`` checks PrivateUse1 before
CUDA): FSDP2's default mesh, Lightning's ``accelerator="auto"``, transformers' device choice and
the autograd engine's stream handling all follow it. So a program gets brick only when it asks:
``import torch_brickdev`` (or ``python -m torch_brickdev ...``), or, for a program that cannot be
edited (a script run with ``--device brick``, every rank of a torchrun job),
``BRICK_AUTOLOAD=1`` in its environment. This module is top level so that loading the entry point
imports nothing else.
"""

import os

AUTOLOAD_VARIABLE = "BRICK_AUTOLOAD"


def autoload() -> None:
    """Loads brick when ``BRICK_AUTOLOAD`` is ``1``; otherwise does nothing (brick stays
    unregistered, the process as if brick were not installed)."""
    value = os.environ.get(AUTOLOAD_VARIABLE, "").strip()
    if value in ("", "0"):
        return
    if value != "1":
        raise ValueError(f"{AUTOLOAD_VARIABLE}={value!r}: expected 1 (load brick when torch is "
                         "imported) or 0 / unset (load it only on `import torch_brickdev`)")
    import torch_brickdev  # noqa: F401  (registers the brick device)
