"""The docs run: every code block of README.md and docs/**/*.md is executed or says why not.

A doc's ```python blocks run in order in one fresh interpreter per doc (one namespace, as a
reader runs them top to bottom); each ```bash block runs in bash; both in a temporary working
directory. A block that cannot run here carries an HTML comment on the line before its fence,
``<!-- not run: REASON -->``, reported as a skip with that reason; a ```toml block that shows
part of a file says so with ``<!-- excerpt of: PATH -->`` and must agree with that file. Any
other block fails the test when it does not run, so the docs cannot drift from the code.
"""

import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from helpers import child_env, run_python

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("doc_blocks_runner.py")
# Every markdown page: the README, docs/ and its folders (docs/history/ included: a block moved
# into history keeps the same rules).
DOCS = ["README.md"] + sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))
DOC_TIMEOUT_S = 600
BASH_TIMEOUT_S = 240

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*(not run|excerpt of):\s*(.+?)\s*-->\s*$")

# print() calls whose trailing comment is what they print (the rest of the docs' comments explain):
# each part of the comment (split at ", " or two spaces; a leading "..." dropped) must be in the
# call's output, ignoring case.
PRINTED_CLAIMS = {
    "README.md": [
        "print(y.device, y.is_brick)",
        "print(p.report.table())",
    ],
    "docs/usage.md": [
        'print(prof.key_averages().table(sort_by="self_device_time_total"))   # Self BRICK',
        "print(p.report.table())",
        "print(p.report.table(roofline=True))",
    ],
}


def one_region_comparison(output: str):
    """The legacy profiler and the registry timed the same execution of aten::addmm: the same
    calls, times equal but for the legacy path's whole microseconds (rows of another region or
    of torch.profiler differ by the runs' variance, or read -100 %)."""
    row = next((line.split() for line in output.splitlines() if line.startswith("aten::addmm")),
               None)
    assert row is not None, "no aten::addmm row"
    torch_calls, torch_us, brick_calls, brick_us = row[1], float(row[2]), row[3], float(row[5])
    assert torch_calls == brick_calls, f"calls differ (torch {torch_calls}, brick {brick_calls})"
    assert abs(torch_us - brick_us) <= 0.05 * brick_us + 2, (
        f"aten::addmm: torch {torch_us} us, brick {brick_us} us: not one region's times")


# print() calls whose output a function checks.
PRINTED_CHECKS = {
    "docs/usage.md": {"print(bp.compare_with_key_averages(": one_region_comparison},
}


@dataclass
class Block:
    doc: str
    language: str
    line: int  # the block's first source line (1-based)
    source: str
    marker: Optional[str]  # "not run" or "excerpt of"
    marker_text: Optional[str]

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def read_blocks(path: Path, doc: str):
    """The fenced blocks of a markdown file, in order, with the marker on the line before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        if end is None:
            raise AssertionError(f"{doc}:{i + 1}: a code block that is never closed")
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        blocks.append(Block(doc, opening.group(1), i + 2, "\n".join(lines[i + 1:end]) + "\n",
                            marker.group(1) if marker else None,
                            marker.group(2) if marker else None))
        i = end + 1
    return blocks


def doc_environment(tmp: Path):
    shims = tmp / ".shims"
    shims.mkdir(exist_ok=True)
    python = shims / "python"
    if not python.exists():  # `python` in a bash block is this interpreter
        # A script, not a symbolic link: Python started through a link to a virtual environment's
        # interpreter resolves it to the base interpreter and leaves the environment.
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
    env = child_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONUNBUFFERED="1",
                    PATH=f"{shims}{os.pathsep}{os.environ.get('PATH', '')}",
                    BRICK_ROOFLINE_CACHE=str(tmp / "roofline.json"))
    env.pop("BRICK_LIVE", None)
    return env


def run_python_blocks(doc: str, blocks, workdir: Path):
    """Runs the blocks in one interpreter; returns (per-block results, combined output)."""
    spec = workdir / ".blocks.json"
    results = workdir / ".results.json"
    spec.write_text(json.dumps({"doc": doc, "blocks": [
        {"line": b.line, "source": b.source} for b in blocks]}), encoding="utf-8")
    proc = run_python(str(RUNNER), str(spec), str(results), cwd=workdir,
                      env=doc_environment(workdir), timeout=DOC_TIMEOUT_S)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and results.exists(), (
        f"{doc}: the blocks' interpreter ended with status {proc.returncode}:\n{output[-4000:]}")
    return json.loads(results.read_text(encoding="utf-8")), output


# A command's exit status 1 or 3 is a verdict (FAIL, INCONCLUSIVE: the CLI's convention), which
# a loaded machine can change; 2 (bad input), 127 (no such command), a signal or a Python
# traceback mean the documented command itself is broken.
BASH_PRELUDE = """set -o pipefail
trap 'rc=$?; if [ $rc -ne 1 ] && [ $rc -ne 3 ]; then echo "doc block: exit status $rc" >&2; exit $rc; fi' ERR
"""


def run_bash_block(block: Block, workdir: Path):
    proc = subprocess.run(["bash", "-c", BASH_PRELUDE + block.source], cwd=workdir,
                          env=doc_environment(workdir), capture_output=True, text=True,
                          timeout=BASH_TIMEOUT_S)
    output = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1, 3) and "Traceback (most recent call last)" not in output, (
        f"{block.name}: the bash block failed (status {proc.returncode}):\n{output[-4000:]}")
    return output


def claim_parts(comment: str):
    comment = comment.strip()
    if comment.startswith("..."):
        comment = comment[3:]
    return [part.strip() for part in re.split(r",\s+|\s{2,}", comment) if part.strip()]


def doc_line_of(doc: str, lines, statement: str) -> int:
    where = [n for n, text in enumerate(lines, 1) if text.lstrip().startswith(statement)]
    assert len(where) == 1, f"{doc}: {statement!r} is in the doc {len(where)} times, not once"
    return where[0]


def check_printed_claims(doc: str, results):
    """Each listed print() call printed what its comment says or what its check wants."""
    lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
    printed = {}
    for result in results:
        for call in result["prints"]:
            printed[call["line"]] = printed.get(call["line"], "") + call["text"]

    def output_of(statement):
        line = doc_line_of(doc, lines, statement)
        assert line in printed, f"{doc}:{line}: {statement!r} printed nothing"
        return line, printed[line]

    for statement in PRINTED_CLAIMS.get(doc, []):
        line, output = output_of(statement)
        assert "#" in lines[line - 1], f"{doc}:{line}: {statement!r} has no comment to check"
        comment = lines[line - 1].split("#", 1)[1]
        missing = [part for part in claim_parts(comment) if part.lower() not in output.lower()]
        assert not missing, (f"{doc}:{line}: the comment says {comment.strip()!r}, but the "
                             f"output lacks {missing}:\n{output[-3000:]}")
    for statement, check in PRINTED_CHECKS.get(doc, {}).items():
        line, output = output_of(statement)
        try:
            check(output)
        except AssertionError as error:
            raise AssertionError(f"{doc}:{line}: {error}\n{output[-3000:]}") from None


def check_excerpt(block: Block):
    """A toml excerpt agrees with its file: each table's keys as there, checks matched by id."""
    assert block.language == "toml", f"{block.name}: 'excerpt of' is for toml blocks"
    whole = tomllib.loads((REPO / block.marker_text).read_text(encoding="utf-8"))
    part = tomllib.loads(block.source)

    def agree(shown, full, where):
        for key, value in shown.items():
            assert key in full, f"{block.name}: {where}{key} is not in {block.marker_text}"
            if isinstance(value, dict) and isinstance(full[key], dict):
                agree(value, full[key], f"{where}{key}.")
            else:
                assert value == full[key], (f"{block.name}: {where}{key} = {value!r}, but "
                                            f"{block.marker_text} has {full[key]!r}")

    checks = {c["id"]: c for c in whole.get("checks", [])}
    for check in part.pop("checks", []):
        assert check["id"] in checks, f"{block.name}: check {check['id']!r} is not in the file"
        agree(check, checks[check["id"]], f"checks[{check['id']}].")
    agree(part, whole, "")


def all_blocks():
    return [block for doc in DOCS for block in read_blocks(REPO / doc, doc)]


def not_run_blocks():
    return [b for b in all_blocks() if b.marker == "not run"]


@pytest.mark.parametrize("doc", DOCS)
def test_doc_blocks_run(doc, tmp_path):
    blocks = read_blocks(REPO / doc, doc)
    unmarked = [b for b in blocks if b.marker is None]
    unknown = [b.name + f" ({b.language or 'no language'})" for b in unmarked
               if b.language not in ("python", "bash")]
    assert not unknown, (f"blocks that are neither python nor bash need a marker on the line "
                         f"before the fence (<!-- not run: why --> or <!-- excerpt of: path -->): "
                         f"{unknown}")
    for block in blocks:
        if block.marker == "excerpt of":
            check_excerpt(block)
    python_blocks = [b for b in unmarked if b.language == "python"]
    if python_blocks:
        results, output = run_python_blocks(doc, python_blocks, tmp_path)
        failed = next((r for r in results if not r["ok"]), None)
        assert failed is None, (f"{doc}:{failed['line']}: the python block raised:\n"
                                f"{failed['error']}\n--- output ---\n{output[-3000:]}")
        assert len(results) == len(python_blocks), output[-3000:]
        check_printed_claims(doc, results)
    for block in unmarked:
        if block.language == "bash":
            run_bash_block(block, tmp_path)


@pytest.mark.parametrize("block", not_run_blocks(), ids=lambda b: b.name)
def test_doc_block_not_run(block):
    pytest.skip(f"{block.name} ({block.language}): {block.marker_text}")


def test_a_broken_block_fails_naming_its_line(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("Intro.\n\n```python\nx = 1\n```\n\n```python\nprint(x)\nundefined_name\n```\n"
                   "\n<!-- not run: needs a CUDA GPU -->\n```python\nraise SystemExit(1)\n```\n",
                   encoding="utf-8")
    blocks = read_blocks(doc, "doc.md")
    assert [(b.line, b.marker, b.marker_text) for b in blocks] == [
        (4, None, None), (8, None, None), (14, "not run", "needs a CUDA GPU")]
    results, _ = run_python_blocks("doc.md", blocks[:2], tmp_path)
    assert [r["ok"] for r in results] == [True, False]
    assert "NameError: name 'undefined_name'" in results[1]["error"]
    assert results[1]["prints"] == [{"line": 8, "text": "1\n"}]


def test_a_failing_bash_command_fails_but_a_verdict_does_not(tmp_path):
    verdict = Block("doc.md", "bash", 1, "python -c 'raise SystemExit(3)'\necho after\n", None,
                    None)
    assert "after" in run_bash_block(verdict, tmp_path)
    for source in ("python -m torch_brickdev check --no-such-flag\necho after\n",
                   "no-such-command-here\n", "python -c 'import json; json.loads(\"{\")'\n"):
        with pytest.raises(AssertionError, match="the bash block failed"):
            run_bash_block(Block("doc.md", "bash", 1, source, None, None), tmp_path)
