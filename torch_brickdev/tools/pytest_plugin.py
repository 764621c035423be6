"""What the ``brick_profile`` pytest fixture gives a test: a :class:`BrickProfile`.

>>> def test_decode(brick_profile):
...     with brick_profile.profile(sync_mode="event", metadata={"decode": {...}}):
...         decode(model, prompt)
...     brick_profile.check()                      # every check of the decode contract
...     brick_profile.check("coverage", tokens=8)  # some of them, with overrides
...     brick_profile.check(contract="my_model.toml", figures={"steps": 3})  # your own contract
...     brick_profile.compare_baseline("baselines/decode.json")  # fails when a brick regressed

``pytest --brick-save-baselines`` records each compared report as its baseline instead.

The fixture is registered by the top-level module ``pytest_torch_brickdev`` (the ``pytest11``
entry point), which imports this module, and so torch, only when a test uses the fixture.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Dict, List, Optional, Union

from .. import profiler
from torch_brickdev.argcheck import check_int, describe_value
from .contract import CheckResult, Contract, failures, format_results, load_contract, run_checks


class BrickInconclusiveWarning(UserWarning):
    """A timing check was inconclusive: the machine denied the process the time that explains
    its failure (other processes ran)."""


class BrickProfile:
    """Profiles regions with :class:`torch_brickdev.profiler.profile` and checks the last
    report against a profiling contract (the decode-profiling contract unless told)."""

    def __init__(self, baseline_dir: Optional[str] = None, save_baselines: bool = False):
        self.report: Optional[profiler.Report] = None
        self.results: Optional[List[CheckResult]] = None
        self.diff: Optional[profiler.ReportDiff] = None
        self._baseline_dir = baseline_dir or os.getcwd()
        self._save_baselines = save_baselines

    @contextlib.contextmanager
    def profile(self, sync_mode=None, metadata: Optional[dict] = None, **kwargs):
        """Profiles the ``with`` body; yields the profiler's ``profile`` object. The report is
        kept in :attr:`report` (also when the body raises)."""
        prof = profiler.profile(sync_mode=sync_mode, metadata=metadata, **kwargs)
        try:
            with prof:
                yield prof
        finally:
            if prof.report is not None:
                self.report = prof.report

    def check(self, *ids: str, contract: Union[None, str, os.PathLike, Contract] = None,
              layers: Optional[int] = None, tokens: Optional[int] = None,
              figures: Optional[Dict[str, object]] = None) -> List[CheckResult]:
        """Runs the checks of ``contract`` (a contract file or Contract; the decode contract by
        default), all or ``ids``, on the last report; ``layers`` / ``tokens`` / ``figures``
        stand in for the report's metadata figures. Raises AssertionError listing every failed
        check's message; returns the results (n/a does not fail; an inconclusive check, whose
        failure a busy machine explains, warns with BrickInconclusiveWarning)."""
        where = "brick_profile.check()"
        for check_id in ids:
            if not isinstance(check_id, str):
                raise TypeError(f"{where}: check ids must be str such as 'coverage', "
                                f"got {describe_value(check_id)}")
        # Types here; the contract checks the values (positive) and the ids (known).
        layers = check_int(layers, "layers", where, optional=True)
        tokens = check_int(tokens, "tokens", where, optional=True)
        contract = load_contract(contract)  # a malformed contract is refused before anything
        if self.report is None:
            raise RuntimeError("brick_profile.check(): nothing profiled yet; use "
                               "`with brick_profile.profile(...):` first")
        self.results = run_checks(self.report, contract=contract, layers=layers, tokens=tokens,
                                  figures=figures, only=ids or None)
        unsure = [r for r in self.results if r.inconclusive]
        for r in unsure:  # not a defect, not a pass: said where the test report shows it
            warnings.warn(f"brick_profile.check(): {r.id} inconclusive: {r.message}",
                          BrickInconclusiveWarning, stacklevel=2)
        failed = failures(self.results)
        if failed:
            lines = [f"{r.id}: {r.message}" for r in failed]
            raise AssertionError(f"{len(failed)} check(s) of the contract {contract.name!r} "
                                 "failed:\n  " + "\n  ".join(lines) + "\n\n"
                                 + format_results(self.results))
        return self.results

    def compare_baseline(self, path: Union[str, os.PathLike], *, threshold: float = 0.10,
                         by: str = "name", ignore_counts: bool = False
                         ) -> Optional[profiler.ReportDiff]:
        """Compares the last report with the baseline report at ``path`` (relative: to the test
        file's folder) brick by brick (:func:`torch_brickdev.profiler.diff_reports`); raises
        AssertionError with the diff's table when a brick regressed. Under
        ``pytest --brick-save-baselines`` it writes the last report there instead (and returns
        None). A missing baseline is an error saying how to record one."""
        where = "brick_profile.compare_baseline()"
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise TypeError(f"{where}: path must be the path of a baseline report (str or "
                            f"os.PathLike), got {describe_value(path)}")
        if self.report is None:
            raise RuntimeError(f"{where}: nothing profiled yet; use "
                               "`with brick_profile.profile(...):` first")
        path = os.path.join(self._baseline_dir, os.fspath(path))
        if self._save_baselines:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self.report.write_json(path)
            return None
        if not os.path.exists(path):
            raise AssertionError(f"{where}: no baseline report at {path}; record one with "
                                 "`pytest --brick-save-baselines` (and commit it)")
        base = profiler.load_report(path, where=where, arg="path")
        self.diff = profiler.diff_reports(base, self.report, threshold=threshold, by=by,
                                          ignore_counts=ignore_counts)
        if self.diff.inconclusive:
            warnings.warn(f"{where}: inconclusive: {self.diff.summary()}\n"
                          + self._diff_table(), BrickInconclusiveWarning,
                          stacklevel=2)
        if not self.diff.passed:
            raise AssertionError(
                f"{len(self.diff.regressions)} brick(s) regressed against the baseline {path}: "
                + ", ".join(c.name for c in self.diff.regressions) + "\n\n"
                + self._diff_table())
        return self.diff

    def _diff_table(self) -> str:
        return self.diff.table(all_rows_option="brick_profile.diff.table(all_rows=True)")
