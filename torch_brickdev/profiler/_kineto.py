"""torch.profiler (Kineto) and brick: what brick's child profiler adds to a trace, and the warning
on PyTorch releases that cannot take one.

With ``torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])``
(``ProfilerActivity.BRICK`` where PyTorch names it), brick's Kineto child profiler reports each
kernel and copy brick launched: a device activity ``brick::<op>`` (e.g. ``brick::aten::mm``) on
the brick device's stream track, and a launch activity (``brickLaunchKernel``/``brickMemcpy``) on
the launching thread, joined by a flow arrow and both linked to the CPU op, which is what fills
``key_averages()``' ``Self BRICK``/``BRICK total`` columns. Built where PyTorch has Kineto's
PrivateUse1 profiler registry (2.12+); elsewhere the legacy profiler
(``torch.autograd.profiler.profile(use_device="brick")``) gives brick device time.
"""

import functools
import warnings

import torch

from .. import _C

DEVICE_ACTIVITY_PREFIX = "brick::"
LAUNCH_ACTIVITY_NAMES = ("brickLaunchKernel", "brickMemcpy")


def is_brick_activity(name: str) -> bool:
    """Whether a key_averages() row or trace event is one brick's child profiler added (a
    device activity or a launch), not an op or range of the program."""
    return name.startswith(DEVICE_ACTIVITY_PREFIX) or name in LAUNCH_ACTIVITY_NAMES


def kineto_available() -> bool:
    """Whether torch.profiler sees brick's device activity in this PyTorch."""
    return bool(_C._profiler.kineto_plugin_available())


def kineto_stats() -> dict:
    """Counters of brick's child profiler since the process started: sessions processed,
    activities emitted, activities with no CPU op to link to, launches skipped because their
    stream was being captured into a CUDA graph, launches whose device times could not be read."""
    return dict(_C._profiler.kineto_plugin_stats())


_MISSING_MESSAGE = (
    "torch.profiler cannot show brick device time with PyTorch {version}: brick's Kineto child "
    "profiler needs PyTorch's PrivateUse1 profiler registry (PyTorch 2.12 or later). The CPU "
    "side is profiled as usual. For brick device time here use the legacy profiler, "
    "torch.autograd.profiler.profile(use_device=\"brick\"), or brick's own registry "
    "(torch_brickdev.profiler.profile())."
)


def warn_where_unavailable(is_available=kineto_available) -> bool:
    """On a PyTorch without the registry, makes ``torch.profiler.profile`` warn once (when asked
    for PrivateUse1 activity) instead of silently showing no device time. Returns whether it
    installed the warning. ``is_available`` is for tests."""
    if is_available():
        return False
    profile_class = torch.profiler.profile
    original_init = profile_class.__init__
    if getattr(original_init, "_brick_warns", False):
        return True
    warned = []

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        activities = getattr(self, "activities", None) or ()
        if not warned and torch.profiler.ProfilerActivity.PrivateUse1 in activities:
            warned.append(True)
            warnings.warn(_MISSING_MESSAGE.format(version=torch.__version__), UserWarning,
                          stacklevel=2)

    __init__._brick_warns = True
    __init__._brick_original = original_init
    profile_class.__init__ = __init__
    return True


def _remove_warning() -> None:
    """Undoes :func:`warn_where_unavailable` (for tests)."""
    init = torch.profiler.profile.__init__
    if getattr(init, "_brick_warns", False):
        torch.profiler.profile.__init__ = init._brick_original


def device_properties_json() -> str:
    """The brick devices as Kineto's ``deviceProperties`` entries (comma-separated JSON objects
    with CUDA's field names), read by brick's Kineto session when a trace is written: viewers name
    the device (and its backing device) from them."""
    import json

    entries = []
    for index in range(torch.brick.device_count()):
        properties = torch.brick.get_device_properties(index)
        entries.append(json.dumps({
            "id": index,
            "name": properties.name,
            "totalGlobalMem": properties.total_memory,
            "computeMajor": properties.major,
            "computeMinor": properties.minor,
            "numSms": properties.multi_processor_count,
            "backingDevice": properties.backing_device,
        }))
    return ",".join(entries)
