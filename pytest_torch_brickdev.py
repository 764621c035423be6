"""pytest plugin of torch_brickdev: the ``brick_profile`` fixture.

Registered by the ``pytest11`` entry point, so pytest loads it in every session of the
environment: loading it imports neither torch nor torch_brickdev. A test that uses the fixture
imports them (see :class:`torch_brickdev.tools.pytest_plugin.BrickProfile`).
"""

import pytest


@pytest.fixture
def brick_profile():
    """A :class:`~torch_brickdev.tools.pytest_plugin.BrickProfile`: ``.profile(sync_mode=...,
    metadata=...)``, ``.check(*ids, layers=..., tokens=...)`` and ``.report``."""
    from torch_brickdev.tools.pytest_plugin import BrickProfile

    yield BrickProfile()
