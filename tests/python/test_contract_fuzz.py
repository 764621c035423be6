"""Contract files from others, fuzzed: thousands of hostile contracts (random TOML structures,
formulas nested deep, huge exponents, odd unicode names, values of the wrong type, raw text and
bytes) each checked in-process through the function the command line runs
(``contract.main``, as ``python -m torch_brickdev check --contract FILE report.json``).

Properties, for every input:

* ``main`` returns 0, 1 or 2 (a verdict, or the contract refused) and raises nothing; a refusal
  says why on stderr, in lines of bounded length, without a traceback;
* nothing printed holds a control character (a contract's text is escaped);
* every formula of a contract that loaded is within the bounds of ``contract_formula`` (text,
  depth), and evaluating it on any figures returns a value within ``MAX_MAGNITUDE`` or raises
  ValueError: what a formula computes is bounded by the checker itself, not by a timer.

Examples are deterministic (``derandomize``, no example database): CI runs the same ones every
time, and a failure names the input that caused it. About 2,000 examples, 25 s of CPU time on
the 2-core VM.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import string
import tempfile

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from torch_brickdev.terminal import printable
from torch_brickdev.tools import contract
from torch_brickdev.tools.contract.file import KINDS, MODES, ContractError, parse_contract
from torch_brickdev.tools.contract.file import _REQUIRED as REQUIRED
from torch_brickdev.tools.contract.formula import (MAX_DEPTH, MAX_MAGNITUDE, MAX_TEXT, Formula,
                                                   _depth)

# A hang guard for CI only: the bounds the properties prove are the checker's own.
pytestmark = pytest.mark.timeout(600)

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=400,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

# ---- a report the contracts are checked on -------------------------------------------------------

BRICKS = {"forward": 3, "backward": 3, "optimizer": 3, "aten::mm": 6}


def _entry(name: str, count: int, avg_ns: int) -> dict:
    return dict(name=name, path=name, kind="op" if "::" in name else "range", device=0, depth=0,
                count=count, total_ns=avg_ns * count, min_ns=avg_ns - 100, max_ns=avg_ns + 100,
                last_ns=avg_ns, p50_ns=float(avg_ns), p90_ns=float(avg_ns + 50),
                p99_ns=float(avg_ns + 90), avg_us=avg_ns / 1000)


def _report() -> dict:
    """A small valid report: three range bricks per step, an op, train metadata (no machine
    section: no timing verdict can be inconclusive)."""
    bricks = [_entry(name, count, 10_000 * (i + 1)) for i, (name, count) in
              enumerate(BRICKS.items())]
    top = sum(b["total_ns"] for b in bricks if b["kind"] == "range")
    wall = int(top / 0.9)
    return {
        "schema": "torch_brickdev.report", "version": 1, "sync_mode": "event",
        "device": {"type": "brick", "runtime": "host", "backing": "cpu", "count": 1},
        "wall_ns": wall, "wall_s": wall / 1e9, "top_level_ns": top,
        "metadata": {"train": {"steps": 3, "lr": 0.1, "runs": [1.0e6, 1.1e6, 0.9e6],
                               "shares": [0.0, 0.01, 0.02], "mode": "event"}},
        "health": {"capture_skipped": 0, "timing_failures": 0},
        "bricks": bricks, "paths": bricks,
    }


@pytest.fixture(scope="module")
def files():
    """(the report's path, the path each contract is written to)."""
    with tempfile.TemporaryDirectory(prefix="contract-fuzz-") as folder:
        report = os.path.join(folder, "report.json")
        with open(report, "w") as f:
            json.dump(_report(), f)
        yield report, os.path.join(folder, "contract.toml")


# ---- the check -----------------------------------------------------------------------------------


def check(files, data, extra=()):
    """Writes ``data`` (text or bytes) as the contract and runs ``check --contract`` on the
    report in-process; fails, naming the input, unless the verdict is 0, 1 or 2 with bounded,
    escaped output."""
    report, path = files
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    out, err = io.StringIO(), io.StringIO()
    shown = printable(data if isinstance(data, str) else repr(data), limit=3000)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = contract.main(["--contract", path, report, *extra])
    except BaseException as error:  # SystemExit and RecursionError too: nothing may escape
        pytest.fail(f"check raised {type(error).__name__}: {printable(error, limit=500)}\n"
                    f"arguments: {list(extra)}\ncontract:\n{shown}")
    assert code in (0, 1, 2), f"exit {code}\ncontract:\n{shown}\n{out.getvalue()}"
    event(f"exit {code}")  # how the examples ended: --hypothesis-show-statistics
    if code == 2:
        lines = err.getvalue().splitlines()
        assert lines and "Traceback" not in err.getvalue(), f"{err.getvalue()}\n{shown}"
        assert all(len(line) <= 2000 for line in lines), f"long message for\n{shown}"
    for line in (out.getvalue() + err.getvalue()).split("\n"):
        assert printable(line) == line, f"unescaped character in {line!r}\ncontract:\n{shown}"
    return code


def loaded(text: str):
    """The contract ``text`` holds, or None where it is refused."""
    try:
        return parse_contract(text, "fuzz.toml")
    except ContractError:
        return None


# ---- TOML written from Python values -------------------------------------------------------------


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(value), repr(value))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's escapes are TOML's
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}"
                            for k, v in value.items()) + " }"


def toml_table(header: str, table: dict) -> str:
    return f"{header}\n" + "".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}\n"
                                   for k, v in table.items())


# ---- strategies ----------------------------------------------------------------------------------

# Text as others write it: control and bidi characters, full-width and combining letters,
# astral characters (no lone surrogates: a TOML file is UTF-8).
ODD_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["", "\x1b[2J", "\u202eevil", "ｓteps", "steps\u0301", "𝐬𝐭𝐞𝐩𝐬", "x" * 5000, "%(prog)s",
     "\x00"])

NAMES = st.sampled_from(["steps", "lr", "runs", "shares", "mode", "ｓteps", "ſteps", "step\u0455",
                         "_", "x" * 300, "forward", "undeclared"])

NUMBERS = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 64, 65, -1, 10**18, 10**18 + 1, 1e308, 5e-324, 2**62]))


def _formula_leaf():
    return st.one_of(NAMES, NUMBERS.map(lambda n: toml_value(n) if not isinstance(n, float)
                                        else repr(n)),
                     st.sampled_from(["0", "1", "2", "9", "10", "1e400", "0x10", "1_000", "1j",
                                      "True", "None", "'a'", "[1]", "x.y", "f(1)", "lambda: 1",
                                      "__import__('os')", "...", "", "(", "**"]))


def _formula_node(children):
    operators = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", " ** ", "@", "<<", "and"])
    return st.one_of(
        st.tuples(children, operators, children).map(lambda t: f"{t[0]}{t[1]}{t[2]}"),
        children.map(lambda c: f"({c})"),
        st.tuples(st.sampled_from(["-", "+", "~", "not "]), children).map("".join))


# Sizes around the bounds, and one far beyond them (where Python's parser itself gives up).
SIZES = st.integers(1, 1000) | st.just(100_000)

# Formulas: grammar-built (nested, mixed with junk) and built to size (deep, long, huge powers).
FORMULAS = st.one_of(
    st.recursive(_formula_leaf(), _formula_node, max_leaves=40),
    SIZES.map(lambda n: "2**" * n + "2"),
    SIZES.map(lambda n: "-" * n + "steps"),
    SIZES.map(lambda n: "+".join(["steps"] * n)),
    SIZES.map(lambda n: "(" * n + "steps" + ")" * n),
    st.integers(1, 100).map(lambda n: "steps * " * n + "1"),
    st.tuples(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)).map(
        lambda t: f"{t[0]}**{t[1]}**{t[2]} * steps"),
    ODD_TEXT,
)

# Values of any TOML type, nested a little (deep nesting is built to size below).
VALUES = st.recursive(
    st.one_of(NUMBERS, st.booleans(), ODD_TEXT, NAMES),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.one_of(NAMES, ODD_TEXT), children, max_size=4),
    max_leaves=8)

_FIELDS = sorted({f for spec in KINDS.values() for f in spec} | {"title", "modes", "async_modes"})
DECLARED = {"steps": "count", "lr": "number", "runs": "series", "shares": "shares", "mode": "any"}
FIGURE = st.sampled_from(list(DECLARED)) | NAMES  # mostly declared, some not
BRICK = st.sampled_from(list(BRICKS)) | NAMES
SHARE, RATIO = st.floats(0, 1), st.floats(0, 20)
TEXT = st.sampled_from(["a title", "token", "x" * 300]) | ODD_TEXT

# Each field's values of the kind it takes (from the edges in: a name not declared, NaN, a
# share above 1, an empty list, a formula that runs away are among them).
FITTING = {
    "expect": st.dictionaries(BRICK, FORMULAS | NUMBERS, min_size=1, max_size=3),
    "order": st.lists(BRICK, min_size=2, max_size=4, unique=True),
    "show": st.lists(FIGURE, max_size=2, unique=True),
    "ratios": st.lists(st.fixed_dictionaries({"above": BRICK, "below": BRICK,
                                              "factor": RATIO | NUMBERS}), max_size=2),
    "limits": st.dictionaries(BRICK, st.dictionaries(
        st.sampled_from(["avg_us", "p50_us", "p99_us", "max_us", "share", "p90_us"]),
        SHARE | NUMBERS, max_size=3), min_size=1, max_size=2),
    "modes": st.lists(st.sampled_from(MODES), min_size=1, max_size=3, unique=True),
    "async_modes": st.lists(st.sampled_from(MODES), min_size=1, max_size=3, unique=True),
    "series": st.lists(st.just("runs") | FIGURE, min_size=1, max_size=3, unique=True),
    "rate": st.just("lr") | FIGURE, "over": st.just("runs") | FIGURE, "per": BRICK,
    "declared": st.just("mode") | FIGURE, "denied": st.just("shares") | FIGURE,
    "by": st.sampled_from(["avg", "p50", "p90", "p99", "total", "p75"]),
    "min": st.floats(0, 1.2), "max": st.floats(0, 1.2), "tolerance": SHARE, "busy": SHARE,
    "max_cv": SHARE, "title": TEXT, "units": TEXT, "explain": TEXT, "unit": TEXT,
    "zero": st.lists(st.sampled_from(["capture_skipped", "timing_failures", "lost"]),
                     min_size=1, max_size=2, unique=True),
    "zero_matching": st.lists(TEXT, min_size=1, max_size=2, unique=True),
}
# What a mutation writes: any TOML value, a formula, odd text.
HOSTILE = VALUES | FORMULAS | ODD_TEXT


@st.composite
def checks(draw):
    """A [[checks]] table of a known kind with some of its fields, each of the type it takes."""
    kind = draw(st.sampled_from(list(KINDS)))
    table = {"id": draw(st.text(string.ascii_lowercase, min_size=1, max_size=8)), "kind": kind}
    optional = {"title": (None, None), "modes": (None, None)}
    for field, (_, default) in {**KINDS[kind], **optional}.items():
        if default is REQUIRED or draw(st.booleans()):
            table[field] = draw(FITTING[field])
    return table


@st.composite
def contracts(draw) -> str:
    """A contract built to fit, then mutated 0-3 times: a field set to a value of any type, a
    field of a kind that lacks it, an unknown field, or a section of its own."""
    head = {"name": "fuzz", "metadata": draw(st.sampled_from(["train", "nowhere"]))}
    if draw(st.booleans()):
        head["bricks"] = draw(st.lists(BRICK, min_size=1, max_size=4, unique=True))
    figures = dict(draw(st.dictionaries(NAMES, st.sampled_from(
        ["count", "number", "series", "shares", "any"]), max_size=2)), **DECLARED)
    tables = [head, figures] + draw(st.lists(checks(), min_size=1, max_size=4))
    section = None
    for _ in range(draw(st.integers(0, 3))):
        table = draw(st.sampled_from(tables))
        how = draw(st.sampled_from(["value", "field", "unknown", "section"]))
        if how == "section":
            section = draw(ODD_TEXT)
        elif how == "field" or not table:
            table[draw(st.sampled_from(_FIELDS))] = draw(HOSTILE)
        elif how == "unknown":
            table[draw(ODD_TEXT)] = draw(HOSTILE)
        else:
            table[draw(st.sampled_from(sorted(table)))] = draw(HOSTILE)
    text = toml_table("[contract]", tables[0]) + toml_table("[contract.figures]", tables[1])
    for table in tables[2:]:
        text += toml_table("[[checks]]", table)
    if section is not None:
        text += toml_table(f"[{json.dumps(section, ensure_ascii=False)}]", {"a": 1})
    return text


# ---- properties ----------------------------------------------------------------------------------


@FUZZ
@given(text=contracts(), sets=st.lists(st.tuples(FIGURE, st.sampled_from(
    ["3"] * 10 + ["-2", "abc", "", "nan", "inf", "2.5", "9" * 5000, "1e400", "[1]"])),
    max_size=2))
def test_random_contracts_end_in_a_verdict_or_a_refusal(files, text, sets):
    check(files, text, [a for name, value in sets for a in ("--set", f"{name}={value}")])
    contract_ = loaded(text)
    if contract_ is not None:
        _formulas_are_bounded(contract_)


HEAD = '[contract]\nname = "fuzz"\nmetadata = "train"\n[contract.figures]\nsteps = "count"\n' \
       'lr = "number"\n"ｓteps" = "count"\n'


@settings(FUZZ, max_examples=1200)
@given(formula=FORMULAS, as_string=st.booleans())
def test_random_formulas_end_in_a_verdict_or_a_refusal(files, formula, as_string):
    value = toml_value(formula) if as_string or not formula.lstrip("-").isdigit() else formula
    text = HEAD + f"[[checks]]\nid = 'f'\nkind = 'count'\nexpect = {{ forward = {value} }}\n"
    code = check(files, text)
    contract_ = loaded(text)
    assert (code == 2) == (contract_ is None), text[:3000]
    if contract_ is not None:
        _formulas_are_bounded(contract_)


def _formulas_are_bounded(c) -> None:
    """Every formula of a contract that loaded is within the bounds, and so is its value on any
    figures (or the evaluation refuses, naming the formula)."""
    for check_ in c.checks:
        if check_.kind != "count":
            continue
        for formula in check_.params["expect"].values():
            assert len(formula.text) <= MAX_TEXT and _depth(formula.tree) <= MAX_DEPTH
            for figures in ({n: 3 for n in formula.names}, {n: 10**18 for n in formula.names},
                            {n: 0.5 for n in formula.names}, {n: 10**30 for n in formula.names}):
                _bounded_or_refused(formula, figures)


def _bounded_or_refused(formula: Formula, figures) -> None:
    try:
        value = formula.evaluate(figures)
    except ValueError as error:
        assert str(error).startswith("formula '"), error
        return
    assert abs(value) <= MAX_MAGNITUDE, (formula.text, figures, value)


# Whole files built to size: nesting beyond the TOML reader's recursion, huge tables, bytes.
RAW = st.one_of(
    st.integers(1, 3000).map(lambda n: "a = " + "[" * n + "]" * n + "\n"),
    st.integers(1, 3000).map(lambda n: "a = " + "{ b = " * n + "1" + " }" * n + "\n"),
    st.integers(1, 3000).map(lambda n: HEAD + "[[checks]]\nid = 'a'\nkind = 'count'\n"
                             "expect = { forward = " + "[" * n + "]" * n + " }\n"),
    st.integers(1, 2000).map(lambda n: HEAD + "".join(
        f"[[checks]]\nid = 'c{i}'\nkind = 'completeness'\n" for i in range(n))),
    st.integers(1, 50_000).map(lambda n: HEAD + "[[checks]]\nid = 'a'\nkind = 'completeness'\n"
                               "title = '''\n[" + " " * n + "x\n'''\n"),
    st.text(max_size=200), st.binary(max_size=200),
    st.tuples(st.sampled_from([HEAD, HEAD + "[[checks]]\nid = 'a'\nkind = 'coverage'\n"]),
              st.text(max_size=100)).map("".join),
)


@settings(FUZZ, max_examples=400)
@given(data=RAW)
def test_raw_files_end_in_a_verdict_or_a_refusal(files, data):
    check(files, data)


@settings(FUZZ, max_examples=40)
@given(text=contracts())
def test_help_on_any_contract_exits_0(files, text):
    report, path = files
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert contract.main(["--contract", path, "--help"]) == 0, text
    assert "check ids of" in out.getvalue()
