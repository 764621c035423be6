"""Profiling contracts: checks of a brick report against a contract file (TOML).

A contract (:mod:`.file` reads it; docs/contracts.md shows how to write one) names the
bricks that must appear, the metadata figures its checks read, and its checks, each an instance
of a kind (:mod:`.kinds`): coverage bounds, counts as formulas over the figures,
orderings and ratios per sync mode, budgets, stability, and the report's own consistency.

The built-in contract is the decode-profiling contract (``gpu-decode-profiling-v1``,
``tools/contracts/decode.toml``): an autoregressive decode of ``T`` tokens through an ``L``-layer model,
as the demo writes it. Its eleven checks, under stable ids:

==================  ======================================================================
``coverage``        top-level brick time / wall time is in [0.85, 1.0]
``lmhead-count``    ``LmHead.count`` equals the decoded tokens
``token-accounting``per-token figures divide by ``LmHead.count``, never by total brick calls
``per-call-ordering`` ``LmHead.avg > GateProjection.avg > RmsNorm.avg`` (and > 10x RmsNorm in
                    immediate and event modes)
``sync-mode``       the sync mode is recognised and says what the durations measure
``completeness``    every brick ran, names are unique, the fourteen decode bricks are present
``avg-agreement``   a report's per-call figure agrees with ``total_ns / count / 1000`` (1%)
``structure``       attention bricks ran ``T x L`` times, RmsNorm ``(2L + 1) x T`` times
``stability``       coefficient of variation of per-token time (each run's median) across
                    runs < 0.15
``no-placeholders`` every figure is a measurement (consistent min/avg/max, nothing zero)
``graph-capture``   the profiler saw every brick: no capture skipped, no timing lost
==================  ======================================================================

A timing check (coverage, per-call-ordering, stability) that fails where the report shows the
machine denied the process the time that explains it (``report.machine``: the time its thread
waited for a CPU while other processes ran) is ``inconclusive``, not failed.

Command line: ``python -m torch_brickdev check report.json [--contract my.toml] [--layers L]
[--tokens T] [--set NAME=VALUE] [--only id,id]``; exit status 0 when every check passed (or was
n/a), 1 when a check failed, 3 when none failed but one was inconclusive, 2 when the contract or
the report cannot be read or an argument is wrong (the contract is read first). ``--help`` lists
the check ids of the contract given (of the decode contract without ``--contract``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ...argcheck import type_name
from ...profiler import Report, ReportError, load_report
from ...terminal import printable

from .._args import positive_int
from .file import FIGURE_KINDS, Contract, ContractError, builtin_path, read_contract
from .kinds import run_check
from .numbers import shown
from .report_view import Subject, figure_problem, subject
from .result import FAIL, INCONCLUSIVE, NA, PASS, CheckResult

__all__ = [
    "CHECKS",
    "CHECK_IDS",
    "CheckResult",
    "Contract",
    "ContractError",
    "DECODE_BRICKS",
    "DECODE_CONTRACT",
    "EXIT_INCONCLUSIVE",
    "ReportError",
    "exit_status",
    "failures",
    "format_results",
    "load",
    "load_contract",
    "main",
    "run_checks",
]

#: The path of the built-in decode-profiling contract.
DECODE_CONTRACT = builtin_path("decode")
_DECODE = read_contract(DECODE_CONTRACT)
_BY_ID = {c.id: c for c in _DECODE.checks}

#: The top-level range bricks of one decode step, in execution order.
DECODE_BRICKS = _DECODE.bricks
COVERAGE_MIN, COVERAGE_MAX = _BY_ID["coverage"].params["min"], _BY_ID["coverage"].params["max"]
STABILITY_MAX_CV = _BY_ID["stability"].params["max_cv"]


def load_contract(source: Union[None, str, os.PathLike, Contract] = None) -> Contract:
    """A Contract: the built-in decode contract for None, a Contract as is, else the contract
    file at ``source`` (raises ContractError naming the file, line and field)."""
    if source is None:
        return _DECODE
    if isinstance(source, Contract):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"load_contract: source must be the path of a contract file, a Contract "
                        f"or None (the decode contract), got {type_name(source)}")
    return read_contract(source)


def _decode_check(check_id: str):
    """The public function that runs one check of the decode contract on a Report."""
    def check(report: Report) -> CheckResult:
        if not isinstance(report, Report):
            raise TypeError(f"{check.__name__}: report must be a Report (see load()), got "
                            f"{type_name(report)}")
        return run_check(_BY_ID[check_id], subject(report, _DECODE, False, {}))
    check.__name__ = check.__qualname__ = "check_" + check_id.replace("-", "_")
    check.__doc__ = f"The decode contract's {check_id!r} check: {_BY_ID[check_id].title}."
    return check


#: The decode contract's checks in order: (id, function of a Report).
CHECKS: List[tuple] = [(c.id, _decode_check(c.id)) for c in _DECODE.checks]
CHECK_IDS = _DECODE.check_ids
globals().update({fn.__name__: fn for _, fn in CHECKS})  # check_coverage, check_structure, ...
__all__ += [fn.__name__ for _, fn in CHECKS]


# ---- running ----------------------------------------------------------------------------------


def _load(source, func: str, arg: str) -> Tuple[Report, bool]:
    """The report, and whether the reader validated it just now."""
    if isinstance(source, Report):
        return source, False
    if not isinstance(source, (dict, str, bytes, os.PathLike)):
        raise TypeError(f"{func}: {arg} must be a Report, a report dict or the path of a report "
                        f"file, got {type_name(source)}")
    return load_report(source, where=func, arg=arg), True


def load(source: Union[str, os.PathLike, dict, Report]) -> Report:
    """A Report from a path, a parsed dict or a Report (returned as is). Raises ReportError
    naming the file and the field for an unreadable, malformed or wrong-version report.

    A report read from a file or dict keeps the derived figures as written (``avg_us`` of each
    entry, ``wall_s``, ``top_level_ns``), so the checks see what a consumer of the file reads:
    ``avg-agreement`` and ``coverage`` compare them with what they derive from."""
    return _load(source, "load", "source")[0]


def _overrides(contract: Contract, layers: Optional[int], tokens: Optional[int],
               figures: Optional[Dict[str, object]]) -> Dict[str, object]:
    """The figures given to run_checks, which stand in for the report's metadata."""
    given: Dict[str, object] = {}
    for name, value, what in (("layers", layers, "decoder layers"), ("tokens", tokens,
                                                                     "decoded tokens")):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"run_checks: {name} ({what}) must be a positive int or None, got "
                            f"{type_name(value)}")
        if value < 1:
            raise ValueError(f"run_checks: {name} ({what}) must be a positive int, got {value!r}")
        given[name] = value
    if figures is not None:
        if not isinstance(figures, dict) or not all(isinstance(k, str) for k in figures):
            raise TypeError(f"run_checks: figures must be a dict of figure name -> value, got "
                            f"{type_name(figures)}")
        given.update(figures)
    unknown = [k for k in given if k not in contract.figures]
    if unknown:
        raise ValueError(f"run_checks: {', '.join(map(repr, unknown))} is not a figure of the "
                         f"contract {contract.name!r} ({contract.source}); its figures: "
                         f"{', '.join(contract.figures) or 'none'}")
    for key, value in given.items():
        # refused here, as a wrong argument, rather than failing the checks that read it
        problem = figure_problem(f"figures[{key!r}]", contract.figures[key], value)
        if problem:
            raise ValueError(f"run_checks: {problem}")
    return given


def _selected(only, contract: Contract) -> Sequence[str]:
    ids = contract.check_ids
    if only is None:
        return ids
    if isinstance(only, str):
        wanted = [only]
    elif isinstance(only, (bytes, dict)) or not isinstance(only, Iterable):
        raise TypeError(f"run_checks: only must be a check id or an iterable of check ids, got "
                        f"{type_name(only)}")
    else:
        wanted = list(only)
    for item in wanted:
        if not isinstance(item, str):
            raise TypeError(f"run_checks: only must hold check ids (str), got "
                            f"{type_name(item)} {item!r}")
    if not wanted:  # no check at all would make a vacuous PASS verdict
        raise ValueError(f"run_checks: only names no check; expected some of "
                         f"{', '.join(ids)} (or None for all)")
    known, wanted = set(ids), dict.fromkeys(wanted)  # (the unknown ones named in given order)
    unknown = [i for i in wanted if i not in known]
    if unknown:
        raise ValueError(f"run_checks: only: unknown check id(s) {', '.join(map(repr, unknown))};"
                         f" expected some of {', '.join(ids)}")
    return [i for i in ids if i in wanted]


def run_checks(report: Union[Report, dict, str, os.PathLike], *,
               contract: Union[None, str, os.PathLike, Contract] = None,
               layers: Optional[int] = None, tokens: Optional[int] = None,
               figures: Optional[Dict[str, object]] = None,
               only: Optional[Iterable[str]] = None) -> List[CheckResult]:
    """Runs the checks of ``contract`` (the decode contract by default; all, or those in
    ``only``, in the contract's order) on a report. ``layers`` / ``tokens`` / ``figures``
    override (or stand in for) the report's metadata figures. The contract is read and the
    arguments checked before the report is read."""
    contract = load_contract(contract)
    selected = _selected(only, contract)
    given = _overrides(contract, layers, tokens, figures)
    report, validated = _load(report, "run_checks", "report")
    return _run_all(subject(report, contract, validated, given), selected)


def _run_all(s: Subject, selected: Sequence[str]) -> List[CheckResult]:
    checks = {c.id: c for c in s.contract.checks}
    return [run_check(checks[check_id], s) for check_id in selected]


def _results_list(results, func: str) -> List[CheckResult]:
    if isinstance(results, (str, bytes, dict)) or not isinstance(results, Iterable):
        raise TypeError(f"{func}: results must be a list of CheckResult (from run_checks), got "
                        f"{type_name(results)}")
    results = list(results)
    for i, r in enumerate(results):
        if not isinstance(r, CheckResult):
            raise TypeError(f"{func}: results[{i}] must be a CheckResult, got "
                            f"{type_name(r)}")
    return results


def failures(results: Iterable[CheckResult]) -> List[CheckResult]:
    return [r for r in _results_list(results, "failures") if r.status == FAIL]


def format_results(results: Sequence[CheckResult]) -> str:
    """One line per check (``PASS  coverage  top-level 0.93 of wall …``) and a verdict line."""
    results = _results_list(results, "format_results")
    if not results:  # "verdict: PASS" over no check would be a verdict on nothing
        raise ValueError("format_results: results is empty; expected the results of at least "
                         "one check (from run_checks)")
    return _format(results)


def _format(results: List[CheckResult]) -> str:
    width = max([len(r.id) for r in results] + [1])
    label = max(len(r.status) for r in results)
    lines = [f"{r.status.upper():<{max(4, label)}}  {r.id:<{width}}  {r.message}"
             for r in results]
    failed = [r.id for r in results if r.status == FAIL]
    unsure = [r.id for r in results if r.status == INCONCLUSIVE]
    passed = sum(r.status == PASS for r in results)
    na = sum(r.status == NA for r in results)
    counts = f"{passed} passed, {len(failed)} failed, " + (
        f"{len(unsure)} inconclusive, " if unsure else "") + f"{na} n/a of {len(results)} checks"
    if failed:
        lines.append(f"verdict: FAIL ({counts}; failed: {', '.join(failed)})")
    elif unsure:
        lines.append(f"verdict: INCONCLUSIVE ({counts}; inconclusive: {', '.join(unsure)}: "
                     "the machine was busy, rerun on a quiet one)")
    else:
        lines.append(f"verdict: PASS ({counts})")
    return "\n".join(lines)


#: The exit status of a verdict that no check failed but one was inconclusive.
EXIT_INCONCLUSIVE = 3


def exit_status(results: Iterable[CheckResult]) -> int:
    """0 when every check passed (or was n/a), 1 when one failed, 3 (EXIT_INCONCLUSIVE) when
    none failed but one was inconclusive."""
    results = _results_list(results, "exit_status")
    if any(r.failed for r in results):
        return 1
    return EXIT_INCONCLUSIVE if any(r.inconclusive for r in results) else 0


def _emit(text: str, stream) -> None:
    """Prints ``text`` line by line, control and bidi characters escaped (ids, names and texts
    come from others' contracts and reports); what the stream's encoding cannot hold is written
    as escapes (a name must not turn a verdict into a UnicodeEncodeError traceback)."""
    text = "\n".join(printable(line) for line in text.split("\n"))
    encoding = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace") + "\n")


def _assignment(text: str) -> Tuple[str, object, str]:
    """``NAME=VALUE`` of --set: the name, the value as an int, else a float, else the text, and
    the text as given (for messages)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    for parse in (int, float):
        try:
            return name.strip(), parse(value), text
        except ValueError:
            pass
    return name.strip(), value, text


def _set_problem(contract: Contract, name: str, value, text: str) -> Optional[str]:
    """Why ``--set NAME=VALUE`` cannot stand in for the contract's figure NAME (None when it
    can; an unknown NAME is run_checks' to refuse)."""
    kind = contract.figures.get(name)
    if kind is None or figure_problem(name, kind, value) is None:
        return None
    return (f"--set {printable(text, limit=80)}: expected {FIGURE_KINDS[kind]} "
            f"({printable(name, limit=60)} is a {kind} of the contract {shown(contract.name)})")


def _contract_option(argv: Optional[Sequence[str]]) -> Optional[str]:
    """The --contract of the command line, for --help (which may come before it)."""
    probe = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    probe.add_argument("--contract")
    try:
        return probe.parse_known_args(argv)[0].contract
    except (argparse.ArgumentError, SystemExit):
        return None  # the parser proper reports it


def _only_help(argv: Optional[Sequence[str]], most: int = 20) -> str:
    """--only's help: the check ids of the contract the command line names (by default the
    decode contract's)."""
    path = _contract_option(argv)
    try:
        contract = load_contract(path)
    except ContractError as error:
        text = (f"comma-separated check ids of the contract given ({printable(error, limit=200)};"
                " its [[checks]] tables' ids)")
    else:
        ids = contract.check_ids
        more = f" and {len(ids) - most} more" if len(ids) > most else ""
        whose = "the decode contract" if path is None else printable(path, limit=80)
        text = (f"comma-separated check ids of {whose}: "
                + ", ".join(printable(i, limit=40) for i in ids[:most]) + more)
    return text.replace("%", "%%")  # argparse formats help with %


class _Help(argparse.Action):
    """-h/--help, which lists the check ids of the --contract given, wherever it stands."""

    def __init__(self, option_strings, dest, argv=None, only=None, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show this help (with the check ids of --contract) and exit")
        self.argv, self.only = argv, only

    def __call__(self, parser, namespace, values, option_string=None):
        self.only.help = _only_help(self.argv)
        parser.print_help()
        parser.exit()


def main(argv: Optional[Sequence[str]] = None, prog: str = "torch_brickdev check") -> int:
    """``check report.json [--contract FILE] [--layers L] [--tokens T] [--set NAME=VALUE]
    [--only id,id]``: prints one line per check and a verdict; returns 0 when nothing failed, 1
    when a check failed, 3 when none failed but one was inconclusive (a busy machine), 2 when
    the contract or the report cannot be read or the arguments are wrong (the reason, naming
    file, line and field, goes to stderr)."""
    if argv is not None:
        if not isinstance(argv, (list, tuple)):
            raise TypeError(f"main: argv must be a list of str or None, got {type_name(argv)}")
        for i, item in enumerate(argv):
            if not isinstance(item, str):
                raise TypeError(f"main: argv[{i}] must be a str, got {type_name(item)}")
    if not isinstance(prog, str):
        raise TypeError(f"main: prog must be a str, got {type_name(prog)}")
    parser = argparse.ArgumentParser(prog=prog, add_help=False,
                                     description="Check a brick report against a profiling "
                                     "contract (by default the decode-profiling contract, "
                                     "gpu-decode-profiling-v1).")
    help_action = parser.add_argument("-h", "--help", action=_Help, argv=argv)
    parser.add_argument("report", help="a report written by Report.write_json")
    parser.add_argument("--contract", help="a contract file (TOML; see docs/contracts.md); "
                        "default: the built-in decode contract")
    parser.add_argument("--layers", type=positive_int,
                        help="decoder layers L (overrides metadata)")
    parser.add_argument("--tokens", type=positive_int,
                        help="decoded tokens T (overrides metadata)")
    parser.add_argument("--set", type=_assignment, action="append", default=[],
                        metavar="NAME=VALUE", help="a metadata figure of the contract "
                        "(overrides the report's)")
    help_action.only = parser.add_argument("--only", help="comma-separated check ids")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # usage errors (2) and --help (0) return, as the rest does
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    # The contract and the arguments first: a malformed contract is refused before any report.
    try:
        contract = load_contract(args.contract)
        only = None if args.only is None else [t.strip() for t in args.only.split(",")
                                                if t.strip()]
        selected = _selected(only, contract)
        for name, value, text in args.set:
            problem = _set_problem(contract, name, value, text)
            if problem:
                raise ValueError(problem)
        given = _overrides(contract, args.layers, args.tokens,
                           {name: value for name, value, _ in args.set})
    except (ContractError, ValueError) as error:
        message = str(error).replace("run_checks: only", "--only").replace("run_checks: ", "")
        _emit(f"{prog}: {message}", sys.stderr)
        return 2
    try:
        report = load_report(args.report, where="load")
    except ReportError as error:
        _emit(f"{prog}: {error}", sys.stderr)
        return 2
    results = _run_all(subject(report, contract, True, given), selected)
    _emit(_format(results), sys.stdout)
    return exit_status(results)

