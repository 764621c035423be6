"""Brick in the tools people train with, each module importing its library only when used.

* :mod:`torch_brickdev.integrations.lightning`: PyTorch Lightning's ``Trainer(accelerator="brick")``
  (registered by ``import torch_brickdev`` as soon as ``lightning.pytorch`` is imported).
"""
