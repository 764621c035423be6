"""pytest plugin: the ``brick_profile`` fixture.

>>> def test_decode(brick_profile):
...     with brick_profile.profile(sync_mode="event", metadata={"decode": {...}}):
...         decode(model, prompt)
...     brick_profile.check()                      # every check of the decode contract
...     brick_profile.check("coverage", tokens=8)  # some of them, with overrides

Registered through the ``pytest11`` entry point; torch is imported only when the fixture is
used, so the plugin costs nothing in test sessions that do not use it.
"""

from __future__ import annotations

import contextlib
from typing import List, Optional

import pytest


class BrickProfile:
    """Profiles regions with :class:`torch_brickdev.profiler.profile` and checks the last
    report against the decode-profiling contract."""

    def __init__(self):
        self.report = None
        self.results: Optional[list] = None

    @contextlib.contextmanager
    def profile(self, sync_mode=None, metadata: Optional[dict] = None, **kwargs):
        """Profiles the ``with`` body; yields the profiler's ``profile`` object. The report is
        kept in :attr:`report` (also when the body raises)."""
        from torch_brickdev.profiler import profile

        prof = profile(sync_mode=sync_mode, metadata=metadata, **kwargs)
        try:
            with prof:
                yield prof
        finally:
            if prof.report is not None:
                self.report = prof.report

    def check(self, *ids: str, layers: Optional[int] = None, tokens: Optional[int] = None) -> List:
        """Runs the checks (all, or ``ids``) on the last report; raises AssertionError listing
        every failed check's message. Returns the results (n/a does not fail)."""
        from torch_brickdev.brick._utils import check_int, describe_value
        from torch_brickdev.tools.contract import failures, format_results, run_checks

        where = "brick_profile.check()"
        for check_id in ids:
            if not isinstance(check_id, str):
                raise TypeError(f"{where}: check ids must be str such as 'coverage', "
                                f"got {describe_value(check_id)}")
        # Types here; the contract checks the values (positive) and the ids (known).
        layers = check_int(layers, "layers", where, optional=True)
        tokens = check_int(tokens, "tokens", where, optional=True)
        if self.report is None:
            raise RuntimeError("brick_profile.check(): nothing profiled yet; use "
                               "`with brick_profile.profile(...):` first")
        self.results = run_checks(self.report, layers=layers, tokens=tokens, only=ids or None)
        failed = failures(self.results)
        if failed:
            lines = [f"{r.id}: {r.message}" for r in failed]
            raise AssertionError(f"{len(failed)} decode-contract check(s) failed:\n  "
                                 + "\n  ".join(lines) + "\n\n" + format_results(self.results))
        return self.results


@pytest.fixture
def brick_profile():
    """A :class:`BrickProfile`: ``.profile(sync_mode=..., metadata=...)``, ``.check(*ids,
    layers=..., tokens=...)`` and ``.report``."""
    yield BrickProfile()
