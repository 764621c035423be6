"""PyTorch Lightning on brick: ``Trainer(accelerator="brick", devices=N, precision=...)``.

Lightning picks a training strategy and a precision plugin from a fixed list of device types:
any other accelerator gets a CPU device for one device (so a custom brick accelerator silently
trained on the CPU), CUDA's autocast for mixed precision (so ``"bf16-mixed"`` silently ran in
fp32 on brick) and, for several devices, DDP set up on a ``torch.cuda.Stream`` over gloo. This
module gives Lightning what brick needs:

* :class:`BrickAccelerator`, registered as ``accelerator="brick"``;
* :class:`BrickDDPStrategy` (``strategy="brick_ddp"``, ``"brick_ddp_spawn"``, ``"brick_ddp_fork"``):
  DDP over brick's ``torch.distributed`` backend, set up on a brick stream;
* the choices Lightning makes for ``strategy="auto"`` and ``precision="16-mixed"/"bf16-mixed"``,
  made for brick when the accelerator is brick's: one device trains on ``brick:N``, several with
  :class:`BrickDDPStrategy` (``strategy="ddp"`` and its spawn/fork forms map to it), mixed
  precision autocasts on brick. Every other Trainer is left exactly as Lightning makes it.

``import torch_brickdev`` registers all this when ``lightning.pytorch`` is imported (before or
after it); importing this module does the same explicitly. Lightning is optional: brick imports
without it. Lightning's own ``PyTorchProfiler(activities=[CPU, PrivateUse1])`` then shows brick
device time per op.
"""

from typing import List, Optional, Union

import torch
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from lightning.pytorch.trainer.connectors import accelerator_connector as _connector
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.nn.parallel import DistributedDataParallel

import torch_brickdev  # noqa: F401  (registers the brick device)

__all__ = ["BrickAccelerator", "BrickDDPStrategy", "register"]

_DDP_START_METHODS = {"brick_ddp": "popen", "brick_ddp_spawn": "spawn", "brick_ddp_fork": "fork"}
# Lightning's DDP strategy names, as brick's.
_DDP_NAMES = {"ddp": "brick_ddp", "ddp_spawn": "brick_ddp_spawn", "ddp_fork": "brick_ddp_fork",
              "ddp_notebook": "brick_ddp_fork"}


def _parse_device_indices(devices: Union[int, str, List[int]]) -> List[int]:
    """Lightning's ``devices=`` for brick: a count (``2``, ``"2"``; ``-1`` for all) or indices
    (``[0, 1]``, ``"0,1"``)."""
    available = torch.brick.device_count()
    expected = (f"expected a positive count of brick devices (at most {available}), -1 for all, "
                f"or a list of device indices in [0, {available})")
    original = devices
    if isinstance(devices, str):
        text = devices.strip()
        try:
            devices = ([int(part) for part in text.split(",") if part.strip()] if "," in text
                       else int(text))
        except ValueError:
            raise MisconfigurationException(
                f"Trainer(accelerator='brick', devices={original!r}): {expected}") from None
    if isinstance(devices, bool):  # bool is an int; True/False are not device counts
        raise MisconfigurationException(
            f"Trainer(accelerator='brick', devices={original!r}): {expected}")
    if isinstance(devices, int):
        if devices == -1:
            return list(range(available))
        if not 1 <= devices <= available:
            raise MisconfigurationException(
                f"Trainer(accelerator='brick', devices={original!r}): {expected}")
        return list(range(devices))
    if isinstance(devices, (list, tuple)) and devices and all(
            isinstance(i, int) and not isinstance(i, bool) for i in devices):
        bad = [i for i in devices if not 0 <= i < available]
        if bad or len(set(devices)) != len(devices):
            raise MisconfigurationException(
                f"Trainer(accelerator='brick', devices={original!r}): "
                f"{'no brick device ' + str(bad) if bad else 'a device listed twice'}; {expected}")
        return list(devices)
    raise MisconfigurationException(
        f"Trainer(accelerator='brick', devices={original!r}): {expected}")


class BrickAccelerator(Accelerator):
    """Lightning's accelerator for brick devices (``accelerator="brick"``)."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != "brick":
            raise MisconfigurationException(f"Device should be brick, got {device} instead.")
        torch.brick.set_device(device)

    def get_device_stats(self, device) -> dict:
        return torch.brick.memory_stats(device)

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices) -> List[int]:
        return _parse_device_indices(devices)

    @staticmethod
    def get_parallel_devices(devices) -> List[torch.device]:
        return [torch.device("brick", index) for index in _parse_device_indices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        return torch.brick.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.brick.is_available()

    @staticmethod
    def name() -> str:
        return "brick"

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register(cls.name(), cls, description=cls.__name__)


class BrickDDPStrategy(DDPStrategy):
    """Lightning's DDP on brick: brick's process group backend, set up on a brick stream (where
    Lightning's DDP would take a ``torch.cuda.Stream``)."""

    strategy_name = "brick_ddp"

    def __init__(self, *args, process_group_backend: Optional[str] = "brick", **kwargs) -> None:
        super().__init__(*args, process_group_backend=process_group_backend, **kwargs)

    def _setup_model(self, model: torch.nn.Module) -> DistributedDataParallel:
        device_ids = self.determine_ddp_device_ids()
        # As Lightning does for CUDA: DDP's construction (its parameter broadcast) on a side
        # stream, so it does not wait for or hold up work on the current one.
        with torch.brick.stream(torch.brick.Stream(self.root_device)):
            return DistributedDataParallel(module=model, device_ids=device_ids, **self._ddp_kwargs)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        for name, start_method in _DDP_START_METHODS.items():
            strategy_registry.register(
                name, cls, description=f"DDP on brick devices with `start_method` "
                f"'{start_method}'", start_method=start_method)


def _on_brick(connector) -> bool:
    return isinstance(getattr(connector, "accelerator", None), BrickAccelerator)


def _install_connector_choices() -> None:
    """Makes the choices Lightning's accelerator connector makes by device type, for brick."""
    cls = _connector._AcceleratorConnector
    if getattr(cls, "_brick_choices_installed", False):
        return
    choose_strategy = cls._choose_strategy
    check_strategy = cls._check_strategy_and_fallback
    init_precision = cls._check_and_init_precision

    def _choose_strategy(self):
        if not _on_brick(self):
            return choose_strategy(self)
        if self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
            return BrickDDPStrategy.strategy_name
        return SingleDeviceStrategy(device=self._parallel_devices[0])

    def _check_strategy_and_fallback(self):
        if _on_brick(self) and isinstance(self._strategy_flag, str):
            self._strategy_flag = _DDP_NAMES.get(self._strategy_flag, self._strategy_flag)
        check_strategy(self)

    def _check_and_init_precision(self):
        if (_on_brick(self) and self._precision_flag in ("16-mixed", "bf16-mixed")
                and not isinstance(self._precision_plugin_flag, Precision)
                and type(self.strategy) in (SingleDeviceStrategy, BrickDDPStrategy)):
            self._validate_precision_choice()
            return MixedPrecision(self._precision_flag, "brick")
        return init_precision(self)

    cls._choose_strategy = _choose_strategy
    cls._check_strategy_and_fallback = _check_strategy_and_fallback
    cls._check_and_init_precision = _check_and_init_precision
    cls._brick_choices_installed = True


def register() -> None:
    """Registers ``accelerator="brick"`` and the brick DDP strategies with Lightning (idempotent)."""
    if "brick" not in AcceleratorRegistry:
        BrickAccelerator.register_accelerators(AcceleratorRegistry)
    if BrickDDPStrategy.strategy_name not in StrategyRegistry:
        BrickDDPStrategy.register_strategies(StrategyRegistry)
    _install_connector_choices()


register()
