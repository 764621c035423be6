"""Every name the docs give exists in the tree, so that a renamed file, flag or variable fails CI.

Read from README.md and docs/**/*.md without importing torch or brick:

* repository paths, in inline code, code blocks and link targets: a path under one of the
  repository's top-level folders (``csrc/backend/fallback.cpp``, ``tests/python/``; a ``*`` must
  match something) or a root file must exist; a bare source file name (``observer.cpp``) must be
  the name of a file somewhere in the tree; a link's target must exist, and its ``#anchor`` must
  be a heading of the markdown file it points to;
* command-line flags: ``python -m torch_brickdev SUB --flag`` (also under torchrun) and the short
  forms ``profile --live`` must name a subcommand and one of its options (read from the argparse
  calls of ``torch_brickdev/tools/``); ``scripts/run.sh JOB --flag`` a job of the script and a flag
  it handles; ``python benchmarks/x.py --flag`` a flag that script defines;
* environment variables: every ``BRICK_*`` name must occur in the code (sources, scripts, build
  files, tests);
* docs/architecture.md's layer tables: every folder of ``csrc/`` and every subpackage of
  ``torch_brickdev/`` has a row, and what each one's sources include (C++) or import (Python)
  from another folder or module of the package is in that row's "may include"/"may import"
  column.

History pages (docs/history/) describe the code as it was: only their links are checked, not the
paths, flags and variables they name.
"""

import ast
import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Set

import pytest

REPO = Path(__file__).resolve().parents[2]
HISTORY = "docs/history/"
SKIPPED_DIRS = {".git", "build", "__pycache__", ".pytest_cache", ".hypothesis", "node_modules"}
# The code the docs' names must occur in (the docs themselves and this file excluded).
CODE_SUFFIXES = {".py", ".cpp", ".h", ".cu", ".c", ".sh", ".txt", ".cmake", ".toml", ".cfg", ""}
# File names the docs use for a reader's own files, not the repository's.
READER_FILES = {"script.py", "x.py", "my_script.py", "loop.py"}
SOURCE_NAME = re.compile(r"^[\w.-]+\.(?:py|cpp|h|cu|c|sh|cmake)$")
# `check` and `top` hand their arguments to the parsers of these modules (tools/cli.py's main).
SUBCOMMAND_MODULES = {"check": "torch_brickdev/tools/contract/__init__.py",
                      "top": "torch_brickdev/tools/top.py"}
CLI = "torch_brickdev/tools/cli.py"
RUN_SH = "scripts/run.sh"
RUN_SH_FLAG_FILES = ("scripts/run.sh", "scripts/gpu_job.sh")
# `scripts/run.sh test ARGS` hands ARGS to pytest.
RUN_SH_PASS_THROUGH = {"test"}

FENCE = re.compile(r"^```")
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
ENV_NAME = re.compile(r"\bBRICK_[A-Z0-9_]*[A-Z0-9]\b")
CLI_CALL = re.compile(r"(?:python3?|torchrun\b[^`\n|;]*?)\s+-m\s+torch_brickdev\b([^`\n|;#]*)")
RUN_SH_CALL = re.compile(r"scripts/run\.sh\s+([^`\n|;#)]*)")
SCRIPT_CALL = re.compile(r"python3?\s+((?:benchmarks|scripts|examples|tests)/[\w/.-]+\.py)"
                         r"([^`\n|;#]*)")


@dataclass
class Tree:
    """What the docs are checked against."""
    root: Path
    files: Set[str] = field(default_factory=set)  # relative paths
    names: Set[str] = field(default_factory=set)  # base names
    top_dirs: Set[str] = field(default_factory=set)
    root_files: Set[str] = field(default_factory=set)
    env_names: Set[str] = field(default_factory=set)
    subcommand_flags: Dict[str, Set[str]] = field(default_factory=dict)
    run_sh_jobs: Set[str] = field(default_factory=set)
    run_sh_text: str = ""

    @classmethod
    def of(cls, root: Path) -> "Tree":
        tree = cls(root)
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
            rel = Path(folder).relative_to(root)
            for name in files:
                path = (rel / name).as_posix()
                tree.files.add(path)
                tree.names.add(name)
                if rel == Path("."):
                    tree.root_files.add(name)
            if rel == Path("."):
                tree.top_dirs = set(dirs)
        this_file = Path(__file__).resolve().relative_to(root).as_posix()
        for path in tree.files:
            if (path.startswith("docs/") or path.endswith(".md") or path == this_file
                    or Path(path).suffix not in CODE_SUFFIXES):
                continue
            text = (root / path).read_text(encoding="utf-8", errors="replace")
            tree.env_names.update(ENV_NAME.findall(text))
        tree.subcommand_flags = cli_flags(root)
        tree.run_sh_text = "\n".join((root / f).read_text(encoding="utf-8")
                                     for f in RUN_SH_FLAG_FILES)
        tree.run_sh_jobs = set(re.findall(r"^  ([a-z][a-z0-9-]*)\)\s*$",
                                          (root / RUN_SH).read_text(encoding="utf-8"), re.M))
        return tree

    def exists(self, path: str) -> bool:
        path = path.rstrip("/")
        if any(c in path for c in "*?["):
            return any(fnmatch.fnmatch(f, path) or fnmatch.fnmatch(f, path + "/*")
                       for f in self.files)
        return path in self.files or any(f.startswith(path + "/") for f in self.files)


def option_strings(node: ast.AST) -> Set[str]:
    """The option strings of the add_argument calls inside node."""
    found = set()
    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_argument"):
            found.update(a.value for a in call.args if isinstance(a, ast.Constant)
                         and isinstance(a.value, str) and a.value.startswith("-"))
    return found


def cli_flags(root: Path) -> Dict[str, Set[str]]:
    """Each subcommand of ``python -m torch_brickdev`` and its options, read from the argparse
    calls: cli.py's ``_parser`` adds each subcommand and then its arguments; ``check`` and ``top``
    parse theirs in their own modules."""
    module = ast.parse((root / CLI).read_text(encoding="utf-8"))
    parser = next(f for f in module.body if isinstance(f, ast.FunctionDef) and f.name == "_parser")
    flags: Dict[str, Set[str]] = {}
    current = None
    for statement in parser.body:
        for call in ast.walk(statement):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "add_parser"):
                current = call.args[0].value
                flags[current] = {"-h", "--help"}
        if current is not None:
            flags[current] |= option_strings(statement)
    for name, path in SUBCOMMAND_MODULES.items():
        flags[name] = {"-h", "--help"} | option_strings(ast.parse((root / path).read_text(
            encoding="utf-8")))
    return flags


@dataclass
class Doc:
    name: str  # path relative to the repository
    prose: str  # the text outside code blocks
    code: str  # the code blocks' text

    @classmethod
    def parse(cls, name: str, text: str) -> "Doc":
        prose, code, in_code = [], [], False
        for line in text.splitlines():
            if FENCE.match(line):
                in_code = not in_code
                continue
            (code if in_code else prose).append(line)
        return cls(name, "\n".join(prose), "\n".join(code))

    @property
    def history(self) -> bool:
        return self.name.startswith(HISTORY)

    def inline_code(self) -> List[str]:
        # A code span may wrap a line, never a paragraph.
        return [m.replace("\n", " ") for m in INLINE_CODE.findall(self.prose) if "\n\n" not in m]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group() == "_" else "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> Set[str]:
    seen: Dict[str, int] = {}
    result = set()
    in_code = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def path_tokens(text: str, tree: Tree) -> List[str]:
    """The words of text that name a repository path."""
    found = []
    for word in re.split(r"[\s,;()'\"=]+", text):
        word = word.strip(".:`").split("::")[0]
        word = re.sub(r":\d+$", "", word)
        if not word or any(c in word for c in "$<>{}~|\\") or word.startswith(("/", "-")):
            continue
        head = word.split("/")[0]
        if "/" in word and head in tree.top_dirs:
            found.append(word)
        elif "/" not in word and (word in tree.root_files and word != "README.md"
                                  or SOURCE_NAME.match(word)):
            found.append(word)
    return found


def check_path(word: str, tree: Tree) -> bool:
    if "/" in word:
        return tree.exists(word)
    return word in tree.root_files or word in tree.names or word in READER_FILES


def command_words(rest: str) -> List[str]:
    return [w for w in rest.split() if w]


def check_cli(rest: str, tree: Tree) -> List[str]:
    """Problems with one ``python -m torch_brickdev ...`` command line (what follows the module)."""
    words = [w for w in command_words(rest) if w != "..."]  # "..." stands for any command
    if not words or words[0].startswith("-"):
        return [f"-{w}" for w in words if w.startswith("-") and w not in ("-h", "--help")]
    problems = []
    for sub in words[0].split("|"):
        if sub not in tree.subcommand_flags:
            problems.append(f"no subcommand {sub!r}")
    sub = words[0]
    if sub not in tree.subcommand_flags:
        return problems
    for word in words[1:]:
        if sub == "profile" and (word == "-m" or word.endswith(".py")):
            break  # the script's own arguments follow
        if word.startswith("-") and word != "-":
            flag = word.split("=")[0]
            if flag not in tree.subcommand_flags[sub]:
                problems.append(f"{sub}: no option {flag}")
    return problems


def check_run_sh(rest: str, tree: Tree) -> List[str]:
    words = command_words(rest)
    if not words:
        return []
    job = words[0]
    if job not in tree.run_sh_jobs:
        return [f"scripts/run.sh has no job {job!r}"]
    if job in RUN_SH_PASS_THROUGH:
        return []
    return [f"scripts/run.sh {job}: no flag {w}" for w in words[1:]
            if w.startswith("--") and not re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])",
                                                    tree.run_sh_text)]


def check_script(path: str, rest: str, tree: Tree) -> List[str]:
    if path not in tree.files:
        return [f"no file {path}"]
    source = (tree.root / path).read_text(encoding="utf-8")
    return [f"{path}: no option {w.split('=')[0]}" for w in command_words(rest)
            if w.startswith("--") and f'"{w.split("=")[0]}"' not in source]


def short_form_problems(span: str, tree: Tree) -> List[str]:
    """`profile --live`, `demo --ops kernels`, `gpu --more`: a subcommand or a job, then flags."""
    words = command_words(span)
    if len(words) < 2 or not any(w.startswith("--") for w in words[1:]):
        return []
    first = words[0]
    as_cli = check_cli(span, tree) if first in tree.subcommand_flags else None
    as_job = check_run_sh(span, tree) if first in tree.run_sh_jobs else None
    verdicts = [v for v in (as_cli, as_job) if v is not None]
    if not verdicts or any(not v for v in verdicts):
        return []
    return verdicts[0]


@dataclass
class Findings:
    checked: int = 0
    problems: List[str] = field(default_factory=list)

    def add(self, doc: Doc, what: str, problems: List[str]):
        self.checked += 1
        self.problems.extend(f"{doc.name}: {what}: {p}" for p in problems)


def check_doc(doc: Doc, tree: Tree, findings: Findings, doc_dir: Path) -> None:
    for target in LINK.findall(doc.prose):
        if re.match(r"^[a-z]+:", target):
            continue  # a URL
        file_part, _, anchor = target.partition("#")
        resolved = (doc_dir / file_part).resolve() if file_part else (tree.root / doc.name)
        try:
            rel = resolved.relative_to(tree.root.resolve()).as_posix()
        except ValueError:
            findings.add(doc, f"link {target}", ["points outside the repository"])
            continue
        problems = []
        if not tree.exists(rel):
            problems.append(f"no file {rel}")
        elif anchor and rel.endswith(".md"):
            if anchor not in anchors((tree.root / rel).read_text(encoding="utf-8")):
                problems.append(f"no heading #{anchor} in {rel}")
        findings.add(doc, f"link {target}", problems)
    if doc.history:
        return
    spans = doc.inline_code()
    for text in spans + [doc.code]:
        for word in path_tokens(text, tree):
            findings.add(doc, f"path {word}", [] if check_path(word, tree) else ["does not exist"])
        for rest in CLI_CALL.findall(text):
            findings.add(doc, f"command `python -m torch_brickdev{rest.rstrip()}`",
                         check_cli(rest, tree))
        for rest in RUN_SH_CALL.findall(text):
            findings.add(doc, f"command `scripts/run.sh {rest.strip()}`", check_run_sh(rest, tree))
        for path, rest in SCRIPT_CALL.findall(text):
            findings.add(doc, f"command `python {path}{rest.rstrip()}`",
                         check_script(path, rest, tree))
    for span in spans:
        if not CLI_CALL.search(span) and not RUN_SH_CALL.search(span):
            problems = short_form_problems(span, tree)
            if problems or (command_words(span)[:1] and command_words(span)[0] in
                            tree.subcommand_flags.keys() | tree.run_sh_jobs and "--" in span):
                findings.add(doc, f"command `{span}`", problems)
    for name in sorted(set(ENV_NAME.findall(doc.prose + "\n" + doc.code))):
        findings.add(doc, f"variable {name}",
                     [] if name in tree.env_names else ["occurs nowhere in the code"])


def doc_names(root: Path) -> List[str]:
    return ["README.md"] + sorted(p.relative_to(root).as_posix()
                                  for p in (root / "docs").rglob("*.md"))


# ---- the layer table ----

def layer_table(text: str) -> Dict[str, Set[str]]:
    """architecture.md's rows for csrc/ folders: folder -> the folders it may include."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`csrc/(\w+)/`", cells[0]) if cells else None
        if match and len(cells) >= 4:
            rows[match.group(1)] = set(re.findall(r"[a-z]+", cells[-1]))
    return rows


def cross_includes(root: Path) -> Dict[str, Dict[str, Set[str]]]:
    """For each csrc/ folder, the other csrc/ folders its files include, and where."""
    csrc = root / "csrc"
    folders = {p.name for p in csrc.iterdir() if p.is_dir()}
    found: Dict[str, Dict[str, Set[str]]] = {f: {} for f in folders}
    for folder in folders:
        for source in sorted((csrc / folder).iterdir()):
            text = source.read_text(encoding="utf-8", errors="replace")
            for other in re.findall(r'^#include "(\w+)/', text, re.M):
                if other != folder and other in folders:
                    found[folder].setdefault(other, set()).add(source.name)
    return found


def table_problems(rows: Dict[str, Set[str]], uses: Dict[str, Dict[str, Set[str]]],
                   place: Callable[[str], str], use: Callable[[str], str], refusal: str):
    """What a layer table misses: a folder without a row, or a use (an include, an import) that
    its row does not list. ``place`` names a folder, ``use`` what it uses."""
    problems = [f"{place(f)} has no row" for f in sorted(uses) if f not in rows]
    for folder, used in sorted(uses.items()):
        for other, files in sorted(used.items()):
            if folder in rows and other not in rows[folder]:
                problems.append(f"{place(folder)} {use(other)} ({', '.join(sorted(files))}), "
                                f"which its row does not {refusal}")
    return problems


def layer_problems(table: Dict[str, Set[str]], includes: Dict[str, Dict[str, Set[str]]]):
    return table_problems(table, includes, lambda f: f"csrc/{f}/", lambda o: f"includes {o}/",
                          "allow")


def python_rows(text: str) -> Dict[str, Set[str]]:
    """architecture.md's rows for torch_brickdev/ subpackages: subpackage -> the package's modules
    it may import ("" for the package itself: "the package" or "the public API")."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.match(r"`torch_brickdev/(\w+)/`", cells[0]) if cells else None
        if match and len(cells) == 3:
            allowed = set()
            for name in re.findall(r"`([^`]+)`", cells[-1]):
                name = name.strip("/").split("/")[-1]
                allowed.add("" if name == "torch_brickdev" else name.split(".")[-1])
            if "the package" in cells[-1] or "public API" in cells[-1]:
                allowed.add("")
            rows[match.group(1)] = allowed
    return rows


def package_imports(root: Path) -> Dict[str, Dict[str, Set[str]]]:
    """For each torch_brickdev/ subpackage, the package's other modules its files import (by the
    name under torch_brickdev: "" for the package itself), and where."""
    found: Dict[str, Dict[str, Set[str]]] = {}
    package = root / "torch_brickdev"
    for sub in sorted(p for p in package.iterdir() if (p / "__init__.py").exists()):
        used = found.setdefault(sub.name, {})
        for source in sorted(sub.rglob("*.py")):
            tree = ast.parse(source.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = ["torch_brickdev", sub.name][:3 - node.level]
                        module = ".".join(base + ([node.module] if node.module else []))
                    else:
                        module = node.module or ""
                    # `from torch_brickdev import _C` imports _C, not the package
                    names = ([module] if node.module and module != "torch_brickdev"
                             else [f"{module}.{a.name}" for a in node.names])
                for name in names:
                    parts = name.split(".")
                    if parts[0] != "torch_brickdev" or parts[1:2] == [sub.name]:
                        continue
                    # a name the package itself defines (`from torch_brickdev import BACKEND_NAME`)
                    # is the package's, not a module's
                    if len(parts) > 1 and not ((package / f"{parts[1]}.py").exists()
                                               or (package / parts[1]).is_dir()
                                               or parts[1] == "_C"):
                        parts = parts[:1]
                    used.setdefault(parts[1] if len(parts) > 1 else "", set()).add(source.name)
    return found


def import_problems(rows: Dict[str, Set[str]], imports: Dict[str, Dict[str, Set[str]]]):
    return table_problems(rows, imports, lambda s: f"torch_brickdev/{s}/",
                          lambda name: f"imports {name or 'the package'}", "list")


# ---- the tests ----

@pytest.fixture(scope="module")
def tree():
    return Tree.of(REPO)


def test_every_doc_reference_exists(tree, capsys):
    findings = Findings()
    for name in doc_names(REPO):
        doc = Doc.parse(name, (REPO / name).read_text(encoding="utf-8"))
        check_doc(doc, tree, findings, (REPO / name).parent)
    assert not findings.problems, ("names in the docs that the tree does not have:\n"
                                   + "\n".join(findings.problems))
    assert findings.checked > 300  # the docs hold far more; fewer means the scan broke
    with capsys.disabled():
        print(f"\n{findings.checked} doc references checked")


def test_the_layer_table_allows_every_include():
    table = layer_table((REPO / "docs/architecture.md").read_text(encoding="utf-8"))
    assert {"runtime", "registry", "profiler", "backend", "bindings"} <= set(table)
    assert layer_problems(table, cross_includes(REPO)) == []


def test_the_layer_table_lists_every_import_of_the_packages_parts():
    rows = python_rows((REPO / "docs/architecture.md").read_text(encoding="utf-8"))
    assert {"brick", "profiler", "integrations", "tools"} <= set(rows)
    assert import_problems(rows, package_imports(REPO)) == []


def test_an_import_the_table_does_not_list_fails():
    rows = {"profiler": {"_C", "argcheck"}}
    imports = {"profiler": {"_C": {"a.py"}, "tools": {"b.py"}}, "brick": {}}
    assert import_problems(rows, imports) == [
        "torch_brickdev/brick/ has no row",
        "torch_brickdev/profiler/ imports tools (b.py), which its row does not list"]


def test_the_cli_flags_are_read_from_the_parsers(tree):
    flags = tree.subcommand_flags
    assert {"demo", "check", "diff", "top", "profile", "train", "merge"} <= set(flags)
    assert "--sync-mode" in flags["demo"] and "--contract" in flags["check"]
    assert "--once" in flags["top"] and "--record-shapes" in flags["profile"]
    assert {"demo", "test", "bench", "gpu"} <= tree.run_sh_jobs
    assert "BRICK_RUNTIME" in tree.env_names


def problems_in(text: str, tree: Tree, name: str = "docs/fake.md") -> List[str]:
    findings = Findings()
    check_doc(Doc.parse(name, text), tree, findings, (REPO / name).parent)
    return findings.problems


def test_a_made_up_name_fails(tree):
    fake = "BRICK_" + "NO_SUCH_SETTING"
    assert problems_in("`csrc/backend/fallback.cpp`, `observer.cpp`, `BRICK_RUNTIME`.", tree) == []
    cases = {
        "`csrc/backend/no_such_file.cpp`": "path csrc/backend/no_such_file.cpp",
        "`no_such_kernel.cpp` does it": "path no_such_kernel.cpp",
        "see [the design](no-such-page.md)": "no file docs/no-such-page.md",
        "see [the design](design.md#no-such-heading)": "no heading #no-such-heading",
        f"set `{fake}=1`": f"variable {fake}",
        "run `python -m torch_brickdev profile --no-such-flag x.py`": "profile: no option "
                                                                      "--no-such-flag",
        "```bash\npython -m torch_brickdev frobnicate report.json\n```": "no subcommand",
        "`demo --no-such-option`": "no option --no-such-option",
        "`scripts/run.sh no-such-job`": "has no job 'no-such-job'",
        "`scripts/run.sh gpu --no-such-step`": "no flag --no-such-step",
        "`python benchmarks/bench_ops.py --no-such-rounds 3`": "no option --no-such-rounds",
    }
    for text, expected in cases.items():
        problems = problems_in(text, tree)
        assert len(problems) == 1 and expected in problems[0], (text, problems)


def test_the_script_args_after_profile_are_the_scripts(tree):
    assert problems_in("`python -m torch_brickdev profile --modules x.py --their-flag`", tree) == []
    assert problems_in("`scripts/run.sh test -k name --any-pytest-flag`", tree) == []


def test_history_pages_are_checked_for_links_only(tree):
    text = "`csrc/gone.cpp`, `BRICK_" + "GONE`, [now](../benchmarks.md), [gone](../gone.md)"
    problems = problems_in(text, tree, name=HISTORY + "fake.md")
    assert len(problems) == 1 and "no file docs/gone.md" in problems[0], problems


def test_an_include_the_table_does_not_allow_fails():
    table = {"runtime": {"common"}, "backend": {"runtime"}}
    includes = {"runtime": {}, "backend": {"runtime": {"a.h"}, "profiler": {"b.cpp"}},
                "profiler": {}}
    assert layer_problems(table, includes) == [
        "csrc/profiler/ has no row",
        "csrc/backend/ includes profiler/ (b.cpp), which its row does not allow"]


def test_anchors_follow_githubs_rules():
    text = "# Design\n## torch.compile on brick\n### The test command, stage by stage (2026)\n" \
           "## Design\n```\n# not a heading\n```\n"
    assert anchors(text) == {"design", "torchcompile-on-brick",
                             "the-test-command-stage-by-stage-2026", "design-1"}
