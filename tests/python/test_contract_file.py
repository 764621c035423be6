"""Contracts as data: a user's TOML contract is validated before any report is read (errors name
the file, the line and the field), a hostile one is refused within bounds (runaway formulas, deep
nesting, odd names, huge files) with a short message, each kind checks what it says on crafted
reports, and a user's own contract for a CNN training step runs end to end (docs/examples)."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import textwrap
import time

import pytest

from contract_fixtures import TOKENS, decode_report
from helpers import REPO, run_cli
from torch_brickdev.tools import contract
from torch_brickdev.tools.contract import ContractError, load_contract, run_checks
from torch_brickdev.tools.contract.file import Formula, parse_contract

EXAMPLES = os.path.join(REPO, "docs", "examples")
pytestmark = pytest.mark.timing

HEAD = """\
[contract]
name = "mine"
metadata = "train"
bricks = ["forward", "backward"]

[contract.figures]
steps = "count"
"""


def write(tmp_path, text, name="mine.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


# ---- a malformed contract is refused, naming file, line and field ------------------------------

MALFORMED = [
    # (contract text, the text of the line the error names (None: no line), what it says)
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'count'\nexpect = { forward = 'steps' \n", None,
     "not valid TOML"),
    ("[[checks]]\nid = 'a'\nkind = 'coverage'\nmin = 0\nmax = 1\n", None,
     "[contract]: missing"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'speed'\n", "kind = 'speed'",
     "checks[0] (id 'a').kind: unknown kind 'speed'; expected one of coverage, count"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'coverage'\nmin = 0.8\nmax = 1\nmaxx = 2\n",
     "maxx = 2", "checks[0] (id 'a').maxx: unknown field for kind 'coverage'"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'coverage'\nmin = 0.8\n", "[[checks]]",
     "checks[0] (id 'a').max: missing (required)"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'coverage'\nmin = 'high'\nmax = 1\n",
     "min = 'high'", "checks[0] (id 'a').min: expected a finite number, got 'high'"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'count'\nexpect = { forward = 'steps *' }\n",
     "expect =", "checks[0] (id 'a').expect: formula 'steps *' does not parse"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'count'\nexpect = { forward = '__import__(\"os\")' }\n",
     "expect =", "Call is not allowed"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'count'\n\nexpect = { forward = 'epochs' }\n",
     "expect =", "reads the metadata figure 'epochs', which [contract.figures] does not declare "
     "(declared: steps)"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'coverage'\nmin = 0\nmax = 1\nmodes = ['fast']\n",
     "modes =", "unknown sync mode(s) 'fast'; expected some of immediate, deferred, event"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'completeness'\n[[checks]]\nid = 'a'  # again\n"
     "kind = 'completeness'\n", "# again", "already the id of the check at line 8"),
    (HEAD.replace('steps = "count"', 'steps = "integer"'), 'steps = "integer"',
     "contract.figures.steps: unknown kind 'integer'"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'ordering'\nratios = [{ above = 'forward', "
     "factor = 2 }]\n", "ratios =", "[0]: missing field(s) ['below']"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'budget'\nlimits = { forward = { p99 = 5 } }\n",
     "limits =", "forward: unknown limit(s) ['p99']"),
    (HEAD, None, "no checks"),
]


@pytest.mark.parametrize("text,needle,words", MALFORMED,
                         ids=[w.split(":")[0][:40] for _, _, w in MALFORMED])
def test_a_malformed_contract_names_file_line_and_field(tmp_path, text, needle, words):
    path = write(tmp_path, text)
    with pytest.raises(ContractError) as info:
        load_contract(path)
    message = str(info.value)
    assert message.startswith(path), message
    if needle is not None:
        line = next(n for n, t in enumerate(text.splitlines(), 1) if needle in t)
        assert message.startswith(f"{path}:{line}: "), message
    assert words in message, message


def test_the_command_line_refuses_a_malformed_contract_before_reading_any_report(tmp_path):
    path = write(tmp_path, HEAD + "[[checks]]\nid = 'a'\nkind = 'speed'\n")
    done = run_cli("check", "--contract", path, str(tmp_path / "no-such-report.json"))
    assert done.returncode == 2, done
    assert f"{path}:10: checks[0] (id 'a').kind: unknown kind 'speed'" in done.stderr
    assert "no-such-report" not in done.stderr  # the report was never opened


def test_formulas_evaluate_arithmetic_only():
    f = Formula.parse("(2 * layers + 1) * tokens")
    assert f.names == ("layers", "tokens")
    assert f.evaluate({"layers": 2, "tokens": 8}) == 40
    assert Formula.parse(7).evaluate({}) == 7
    for bad in ("tokens.real", "[tokens]", "tokens if 1 else 2", "'a' * 3", "True + 1", ""):
        with pytest.raises(ValueError):
            Formula.parse(bad)


# ---- a hostile contract is refused within bounds, never a hang or a traceback -------------------

COUNT = HEAD + "[[checks]]\nid = 'a'\nkind = 'count'\nexpect = {{ forward = {} }}\n"

HOSTILE = [
    # (the formula as TOML writes it, what the error says)
    ("'2**2**40'", "exponent 1099511627776 is beyond 64"),
    ("'10**10**10'", "exponent 10000000000 is beyond 64"),
    ("'9**9**9 * steps'", "exponent 387420489 is beyond 64"),
    ("'steps ** 65'", "exponent 65 is beyond 64"),
    ("'1e308 * 10'", "beyond 1e+18"),
    ("'10**19'", "beyond 1e+18"),
    ("'steps / 0'", "division by zero"),
    ("'steps % (2 - 2)'", "division by zero"),
    ("'-3'", "formula '-3' is -3: expected a whole number of calls >= 0"),
    ("-3", "formula '-3' is -3: expected a whole number of calls >= 0"),
    ("'7 / 2'", "formula '7 / 2' is 3.5: expected a whole number of calls >= 0"),
    ("'(-8) ** 0.5'", "is not a real number"),
    (repr("steps + " * 60 + "1"), "nested 60 deep; at most 50"),
    (repr("+".join(["steps"] * 100_000)), "(599999 characters) is longer than 500 characters"),
    (repr("-" * 100_000 + "steps"), "(100005 characters) is longer than 500 characters"),
    ("'ｓteps'", "reads the metadata figure 'ｓteps', which [contract.figures] does not declare "
               "(declared: steps)"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("formula,words", HOSTILE, ids=[w[:30] for _, w in HOSTILE])
def test_a_formula_that_computes_too_much_is_refused_at_load(tmp_path, formula, words):
    path = write(tmp_path, COUNT.format(formula))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    message = str(info.value)
    assert message.startswith(f"{path}:11: checks[0] (id 'a').expect: "), message
    assert words in message, message
    assert len(message) < 400 + len(path), message  # long formulas are cut, not echoed


def test_the_command_line_refuses_a_runaway_formula_with_exit_2(tmp_path, capsys):
    path = write(tmp_path, COUNT.format("'9**9**9 * steps'"))
    assert contract.main(["--contract", path, str(tmp_path / "report.json")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:11: checks[0] (id 'a').expect: formula '9**9**9 * steps'" in err, err
    assert "report.json" not in err  # refused before the report is read


def test_a_name_is_the_name_as_written():
    """Python reads identifiers in NFKC form (``ｓteps`` as ``steps``); a formula reads the
    figure its text names."""
    f = Formula.parse("2 * ｓteps + steps")
    assert f.names == ("ｓteps", "steps")
    assert f.evaluate({"ｓteps": 10, "steps": 1}) == 21


ODD_FILES = [
    # (contract text, the text of the line the error names (None: no line), what it says)
    ("a = " + "[" * 2000 + "]" * 2000 + "\n", None, "nested too deeply"),
    ("a = " + "{ b = " * 2000 + "1" + " }" * 2000 + "\n", None, "nested too deeply"),
    ("a = " + "[" * 33 + "]" * 33 + "\n", None, "nested too deeply; expected at most 32 levels"),
    (HEAD.replace('steps = "count"', 'steps = ["count"]'), 'steps = ["count"]',
     "contract.figures.steps: unknown kind ['count']; expected one of count, number"),
    (HEAD.replace('steps = "count"', 'steps = { a = 1 }'), 'steps = { a = 1 }',
     "contract.figures.steps: unknown kind {'a': 1}; expected one of count, number"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'coverage'\nmin = 0.9\nmax = 0.5\n", "min = 0.9",
     "checks[0] (id 'a').min: 0.9 is above max 0.5"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'ordering'\norder = ['forward']\n", "order =",
     "checks[0] (id 'a').order: expected at least two bricks to order, got ['forward']"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'ordering'\n", "[[checks]]",
     "checks[0] (id 'a').order: an ordering check needs an order of two bricks or more, or "
     "ratios"),
    (HEAD + "[[checks]]\nid = 'a'\nkind = 'ordering'\nratios = [{ above = 'x', below = 'x', "
     "factor = 0.5 }]\n", "ratios =", "[0]: above and below are both 'x'"),
    (HEAD + "[[checks]]\nid = '" + "x" * 10_000 + "'\nkind = 'speed'\n", "kind = 'speed'",
     "... (10000 characters)"),
    (HEAD + "[[checks]]\nid = \"\\u001b[2J\"\nkind = 'speed'\n", "kind = 'speed'",
     "(id '\\x1b[2J').kind"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text,needle,words", ODD_FILES,
                         ids=[w.split(":")[0][:40] for _, _, w in ODD_FILES])
def test_an_odd_contract_file_is_refused_with_a_bounded_message(tmp_path, text, needle, words):
    path = write(tmp_path, text)
    with pytest.raises(ContractError) as info:
        load_contract(path)
    message = str(info.value)
    if needle is not None:
        line = next(n for n, t in enumerate(text.splitlines(), 1) if needle in t)
        assert message.startswith(f"{path}:{line}: "), message
    assert words in message, message
    assert len(message) < 500 + len(path) and "\x1b" not in message, message


def _load_seconds(text: str) -> float:
    """The least CPU time of three parses (CPU time: another process on the machine does not
    count; the least: a preemption's cache misses in one parse do not either)."""
    times = []
    for _ in range(3):
        start = time.process_time()
        parse_contract(text)
        times.append(time.process_time() - start)
    return min(times)


@pytest.mark.timeout(300)
def test_parsing_grows_linearly_with_the_number_of_checks():
    def contract_with(n):
        return HEAD + "".join(f"[[checks]]\nid = 'c{i}'\nkind = 'completeness'\n"
                              for i in range(n))
    assert len(parse_contract(contract_with(8000)).checks) == 8000
    small, large = _load_seconds(contract_with(2000)), _load_seconds(contract_with(8000))
    # 4x the checks: linear takes about 4x the time, quadratic 16x.
    assert large < 8 * small, (small, large)


@pytest.mark.parametrize("value", ["abc", "-2", "2.5", "nan", ""])
def test_a_set_value_the_figure_cannot_be_is_a_usage_error(tmp_path, capsys, value):
    path = write(tmp_path, HEAD + "[[checks]]\nid = 'a'\nkind = 'completeness'\n")
    code = contract.main(["--contract", path, str(tmp_path / "report.json"),
                          "--set", f"steps={value}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--set steps={value}: expected a positive integer (steps is a count of the " \
           f"contract 'mine')" in err, err
    assert "report.json" not in err


def test_run_checks_refuses_a_figure_value_the_figure_cannot_be(tmp_path):
    c = contract_of(tmp_path, "[[checks]]\nid = 'c'\nkind = 'completeness'\n")
    with pytest.raises(ValueError, match=r"run_checks: figures\['steps'\] is string 'eight': "
                                         r"expected a positive integer"):
        run_checks("no-such-file.json", contract=c, figures={"steps": "eight"})


def test_help_lists_the_checks_of_the_contract_given(tmp_path, capsys):
    path = write(tmp_path, HEAD + "[[checks]]\nid = 'mine-1'\nkind = 'completeness'\n"
                 "[[checks]]\nid = 'mine-2'\nkind = 'completeness'\n")
    for argv in (["--contract", path, "--help"], ["--help", "--contract", path],
                 ["--help", f"--contract={path}"]):
        assert contract.main(argv) == 0
        out = " ".join(capsys.readouterr().out.split())  # as argparse wraps it
        assert "mine-1, mine-2" in out and "lmhead-count" not in out, out
    assert contract.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "check ids of the decode contract: coverage, lmhead-count" in out, out
    assert "mine-1" not in out
    assert contract.main(["--help", "--contract", str(tmp_path / "none.toml")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "lmhead-count" not in out and "none.toml: cannot be read" in out, out


@pytest.mark.timeout(60)
def test_a_long_line_that_looks_like_a_table_header_reads_in_linear_time(tmp_path):
    """The lines of tables are found by a pattern: one that could match a run of spaces two ways
    took minutes on a 5,000-space line of a multi-line string."""
    text = (HEAD + "[[checks]]\nid = 'a'\nkind = 'completeness'\ntitle = '''\n[" + " " * 100_000
            + "x\n'''\n")
    assert load_contract(write(tmp_path, text)).checks[0].id == "a"


def test_a_contract_file_too_large_is_refused_unread(tmp_path):
    path = tmp_path / "huge.toml"
    with open(path, "wb") as f:
        f.write(HEAD.encode() + b"#" * (5 << 20) + b"\n")
    with pytest.raises(ContractError, match=r"huge.toml: larger than 4 MiB; expected a TOML "
                                            r"contract"):
        load_contract(str(path))


# ---- each kind, on crafted reports -------------------------------------------------------------


@pytest.fixture(scope="module")
def decode_dict():
    return json.loads(decode_report("event", runs=1).to_json())


@pytest.fixture
def train_dict(decode_dict):
    """A real decode report with a train section (steps = the decoded tokens): the kinds read
    any bricks and any figures."""
    d = copy.deepcopy(decode_dict)
    d["metadata"]["train"] = {"steps": TOKENS}
    return d


def contract_of(tmp_path, checks, bricks=("LmHead", "RmsNorm")):
    text = (f'[contract]\nname = "crafted"\nmetadata = "train"\nbricks = {json.dumps(list(bricks))}'
            f'\n[contract.figures]\nsteps = "count"\n' + textwrap.dedent(checks))
    return load_contract(write(tmp_path, text))


def one(tmp_path, d, checks, **kwargs):
    [result] = run_checks(d, contract=contract_of(tmp_path, checks), **kwargs)
    return result


def test_count_formulas_over_metadata(tmp_path, train_dict):
    lm = next(b for b in train_dict["bricks"] if b["name"] == "LmHead")["count"]
    assert lm == TOKENS == 8
    check = "[[checks]]\nid = 'c'\nkind = 'count'\nexpect = { LmHead = 'steps' }\n"
    assert one(tmp_path, train_dict, check).status == "pass"
    result = one(tmp_path, train_dict, check, figures={"steps": 9})
    assert result.status == "fail" and "LmHead ran 8 times, expected 9 = steps" in result.message
    del train_dict["metadata"]["train"]
    result = one(tmp_path, train_dict, check)
    assert result.status == "n/a" and "report has no train metadata (steps)" in result.message
    train_dict["metadata"]["train"] = {"steps": "eight"}
    result = one(tmp_path, train_dict, check)
    assert result.status == "fail"
    assert "metadata train.steps is string 'eight': expected a positive integer" in result.message


def test_a_formula_that_breaks_on_the_reports_figures_names_itself(tmp_path, train_dict):
    def count(formula):
        return one(tmp_path, train_dict, "[[checks]]\nid = 'c'\nkind = 'count'\n"
                   f"expect = {{ LmHead = '{formula}' }}\n")
    result = count("steps / (steps - 8)")
    assert result.status == "fail"
    assert result.message == ("LmHead: formula 'steps / (steps - 8)' with steps=8: division by "
                              "zero"), result.message
    result = count("steps * 1e18")
    assert result.status == "fail"
    assert result.message == "LmHead: formula 'steps * 1e18' with steps=8: 8e+18 is beyond 1e+18"
    result = count("steps ** steps ** steps")
    assert result.status == "fail"
    assert result.message == ("LmHead: formula 'steps ** steps ** steps' with steps=8: exponent "
                              "16777216 is beyond 64"), result.message
    result = count("steps - 10")
    assert result.status == "fail"
    assert result.message == ("LmHead: steps - 10 = -2 with steps=8: expected a whole number of "
                              "calls >= 0"), result.message


def test_a_misspelt_brick_lists_the_near_names(tmp_path, train_dict):
    result = one(tmp_path, train_dict,
                 "[[checks]]\nid = 'c'\nkind = 'count'\nexpect = { LmHaed = 'steps' }\n")
    assert result.status == "fail"
    assert "brick 'LmHaed' never ran (near names in the report: 'LmHead')" in result.message
    result = one(tmp_path, train_dict,
                 "[[checks]]\nid = 'o'\nkind = 'ordering'\norder = ['LmHead', 'RmsNrom']\n")
    assert result.status == "fail" and "near names in the report: 'RmsNorm'" in result.message


def test_ordering_ratios_apply_in_their_modes(tmp_path, train_dict):
    check = ("[[checks]]\nid = 'o'\nkind = 'ordering'\norder = ['LmHead', 'RmsNorm']\n"
             "ratios = [{ above = 'LmHead', below = 'RmsNorm', factor = 1e9, "
             "modes = ['immediate'] }]\n")
    assert train_dict["sync_mode"] == "event"
    assert one(tmp_path, train_dict, check).status == "pass"  # the ratio is immediate-only
    train_dict["sync_mode"] = "immediate"
    result = one(tmp_path, train_dict, check)
    assert result.status == "fail" and "LmHead > 1e+09 x RmsNorm (immediate mode)" in \
        result.message
    reverse = "[[checks]]\nid = 'o'\nkind = 'ordering'\norder = ['RmsNorm', 'LmHead']\n"
    result = one(tmp_path, train_dict, reverse)
    assert result.status == "fail" and "expected RmsNorm > LmHead" in result.message


def test_a_check_outside_its_modes_is_not_applicable(tmp_path, train_dict):
    result = one(tmp_path, train_dict, "[[checks]]\nid = 'c'\nkind = 'coverage'\nmin = 0.5\n"
                 "max = 1\nmodes = ['immediate', 'deferred']\n")
    assert result.status == "n/a"
    assert result.message == ("applies in immediate, deferred mode only; the report was timed "
                              "in event mode")


def test_budgets_per_call_and_share_of_wall(tmp_path, train_dict):
    lm = next(b for b in train_dict["bricks"] if b["name"] == "LmHead")
    p99_us, share = lm["p99_ns"] / 1e3, lm["total_ns"] / train_dict["wall_ns"]
    within = (f"[[checks]]\nid = 'b'\nkind = 'budget'\nlimits = {{ LmHead = {{ p99_us = "
              f"{p99_us * 1.01}, share = {min(1.0, share * 1.01)} }} }}\n")
    result = one(tmp_path, train_dict, within)
    assert result.status == "pass", result.message
    assert result.figures["LmHead_p99_us"] == pytest.approx(p99_us)
    over = (f"[[checks]]\nid = 'b'\nkind = 'budget'\nlimits = {{ LmHead = {{ p99_us = "
            f"{p99_us / 2} }} }}\n")
    result = one(tmp_path, train_dict, over)
    assert result.status == "fail" and result.message.startswith("over budget: LmHead p99")


def test_unknown_figures_and_ids_are_refused_before_the_report(tmp_path, train_dict):
    c = contract_of(tmp_path, "[[checks]]\nid = 'c'\nkind = 'completeness'\n")
    with pytest.raises(ValueError, match=r"'epochs' is not a figure of the contract 'crafted'"):
        run_checks("no-such-file.json", contract=c, figures={"epochs": 2})
    with pytest.raises(ValueError, match=r"unknown check id\(s\) 'coverage'; expected some of c"):
        run_checks("no-such-file.json", contract=c, only=["coverage"])


# ---- the built-in decode contract is one such file ---------------------------------------------


def test_the_decode_contract_is_a_shipped_file():
    assert os.path.isfile(contract.DECODE_CONTRACT)
    decode = load_contract(contract.DECODE_CONTRACT)
    assert decode.name == "gpu-decode-profiling-v1"
    assert decode.check_ids == contract.CHECK_IDS and len(decode.checks) == 11
    assert load_contract() is load_contract(None)
    assert decode.bricks == contract.DECODE_BRICKS


# ---- a user's own contract, end to end ---------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_cnn_training_step_meets_its_users_contract(tmp_path, one_thread):
    spec = importlib.util.spec_from_file_location("cnn_train_step",
                                                  os.path.join(EXAMPLES, "cnn_train_step.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    report = example.train_steps(steps=3)
    path = tmp_path / "report.json"
    report.write_json(str(path))
    toml = os.path.join(EXAMPLES, "cnn_train_step.toml")
    results = {r.id: r for r in run_checks(str(path), contract=toml)}
    # The counts are exact whatever the machine does: ranges per step, and each convolution
    # counted once (the backing device's own calls are not another call of the op).
    for check in ("steps", "convolutions", "complete", "health"):
        assert results[check].status == "pass", results[check].message
    assert results["convolutions"].figures["found"] == {"aten::convolution": 6,
                                                        "aten::convolution_backward": 6}
    assert results["cost-order"].figures["backward_avg_us"] > 0
    done = run_cli("check", "--contract", toml, str(path), "--only", "steps,convolutions",
                   "--set", "steps=4")
    assert done.returncode == 1, done  # 3 steps ran; the contract was told 4
    assert "forward ran 3 times, expected 4 = steps" in done.stdout
