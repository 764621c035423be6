"""pytest plugin of torch_brickdev: the ``brick_profile`` fixture.

Registered by the ``pytest11`` entry point, so pytest loads it in every session of the
environment: loading it imports neither torch nor torch_brickdev. A test that uses the fixture
imports them (see :class:`torch_brickdev.tools.pytest_plugin.BrickProfile`).
"""

import pytest


def pytest_addoption(parser):
    parser.getgroup("torch_brickdev").addoption(
        "--brick-save-baselines", action="store_true", default=False,
        help="brick_profile.compare_baseline() records the test's report as its baseline "
             "instead of comparing with it")


@pytest.fixture
def brick_profile(request):
    """A :class:`~torch_brickdev.tools.pytest_plugin.BrickProfile`: ``.profile(sync_mode=...,
    metadata=...)``, ``.check(*ids, contract=..., ...)``, ``.compare_baseline(path)`` and
    ``.report``. Relative baseline paths are the test file's folder's."""
    from torch_brickdev.tools.pytest_plugin import BrickProfile

    yield BrickProfile(baseline_dir=str(request.path.parent),
                       save_baselines=request.config.getoption("--brick-save-baselines"))
