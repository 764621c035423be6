"""What one check of a contract returns: a :class:`CheckResult` with its status (pass, fail,
inconclusive or n/a), a message saying what was expected and what was found, and its figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ...argcheck import type_name

__all__ = ["CheckResult", "FAIL", "INCONCLUSIVE", "NA", "PASS", "Result", "STATUSES"]

PASS, FAIL, NA = "pass", "fail", "n/a"
# A timing check whose failure the time the machine denied the process explains: neither a pass
# nor a defect of the program or the profiler.
INCONCLUSIVE = "inconclusive"
STATUSES = (PASS, FAIL, INCONCLUSIVE, NA)


@dataclass
class CheckResult:
    """The outcome of one check: ``status`` is ``"pass"``, ``"fail"``, ``"inconclusive"`` (a
    timing check whose failure a busy machine explains) or ``"n/a"``; ``message`` says what was
    expected and what was found; ``figures`` holds the numbers behind it."""

    id: str
    title: str
    status: str
    message: str
    figures: dict = field(default_factory=dict)

    def __post_init__(self):
        for name in ("id", "title", "message"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"CheckResult: {name} must be a str, got "
                                f"{type_name(getattr(self, name))}")
        if not isinstance(self.status, str) or self.status not in STATUSES:
            raise ValueError(f"CheckResult: status must be one of "
                             f"{', '.join(map(repr, STATUSES))}, got {self.status!r}")
        if not isinstance(self.figures, dict):
            raise TypeError(f"CheckResult: figures must be a dict, got "
                            f"{type_name(self.figures)}")

    @property
    def passed(self) -> bool:
        return self.status == PASS

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    @property
    def inconclusive(self) -> bool:
        return self.status == INCONCLUSIVE


# How a kind builds its result: ``result(status, message, **figures)``.
Result = Callable[..., CheckResult]
