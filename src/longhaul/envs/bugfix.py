"""Repository bug-fix tasks (family ``bugfix``): one injected bug in a small real project.

The projects live in `repos/` (each a package with its own pytest suite). A task is one mutant
of one project's source (`longhaul.envs.mutate`) from a shipped catalog, `repos/catalog.json`,
which lists only mutants that compile and make at least one test fail; it is rebuilt with
`python -m longhaul.envs.bugfix` whenever a project changes (the catalog records the projects'
content hash, and envcheck refuses a stale one).

The agent gets the mutated project as a git repository (one commit), with the project's tests
minus the ones the bug breaks, plus `tests/test_issue.py` holding one failing test that shows the
symptom. The reward is decided by the project's full original suite, which reaches the sandbox
only in verify(), run with its own pytest config and no conftest from the workdir.

Difficulty: 1 names the file to fix; 2 names only the failing test; 3 names neither and the
visible issue test is the only hint. Held-out tasks use a fixed fifth of the catalog that
training never samples.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
from functools import lru_cache
from pathlib import Path

from longhaul.envs import patch as patchlib
from longhaul.envs.mutate import Mutant, enumerate_mutants
from longhaul.envs.workspace import Action, WorkspaceTask

FAMILY = "bugfix"
VERSION = "1"
DIFFICULTIES = (1, 2, 3)
SPLIT_SEED_BASE = {"train": 0, "heldout": 1_000_000}
REPOS = Path(__file__).parent / "repos"
CATALOG = REPOS / "catalog.json"
TEST_COMMAND = "python3 -m pytest -q tests"
# Run from the hidden directory with its own ini: nothing of the agent's (a conftest.py, a pytest.ini,
# a module shadowing pytest, a sitecustomize on PYTHONPATH) is loaded before the tests import the package.
VERIFY_COMMAND = "cd .longhaul_hidden && python3 -m pytest -q -x -c pytest.ini --noconftest -p no:cacheprovider tests"
HIDDEN_INI = "[pytest]\npythonpath = /work\n"


def projects() -> list[str]:
    return sorted(p.name for p in REPOS.iterdir() if p.is_dir() and (p / "tests").is_dir() and not p.name.startswith((".", "_")))


def _project_files(name: str) -> dict[str, str]:
    root = REPOS / name
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix in (".py", ".md", ".txt", ".cfg", ".toml")
            and not any(part == "__pycache__" or part.startswith(".") for part in p.relative_to(root).parts)}


_read_project = lru_cache(maxsize=None)(_project_files)  # tasks read a project once per process; never mutate


def content_hash() -> str:
    h = hashlib.sha256()
    for name in projects():
        for rel, text in _project_files(name).items():
            h.update(f"{name}/{rel}\n".encode() + text.encode())
    return h.hexdigest()


@lru_cache(maxsize=1)
def catalog() -> dict:
    if not CATALOG.exists():
        raise FileNotFoundError(f"{CATALOG} is missing; build it with `python -m longhaul.envs.bugfix`")
    return json.loads(CATALOG.read_text())


SUBFAMILIES = tuple(projects())  # one sub-family per project


@lru_cache(maxsize=64)
def _split_entries(split: str, subfamilies: tuple | None) -> list[dict]:
    entries = catalog()["mutants"]
    want = set(subfamilies) if subfamilies else None
    out = []
    for e in entries:
        held = int(hashlib.sha256(e["id"].encode()).hexdigest(), 16) % 5 == 0
        if (split == "heldout") == held and (want is None or e["project"] in want):
            out.append(e)
    return out


def _test_functions(source: str) -> dict[str, tuple[int, int]]:
    """name -> (first line, last line) of each top-level test function (decorators included)."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out[node.name] = (first, node.end_lineno)
    return out


def _header(source: str) -> str:
    """The import lines at the top of a test file."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return "".join("".join(lines[n.lineno - 1:n.end_lineno]) for n in keep)


def _without(source: str, names: set[str]) -> str:
    lines = source.splitlines(keepends=True)
    drop = set()
    for name, (a, b) in _test_functions(source).items():
        if name in names:
            drop.update(range(a, b + 1))
    return "".join(line for i, line in enumerate(lines, 1) if i not in drop)


def _check(split: str, difficulty: int, subfamilies) -> None:
    if split not in SPLIT_SEED_BASE:
        raise ValueError(f"unknown split {split!r}; choose 'train' or 'heldout'")
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty}")
    bad = [s for s in subfamilies or () if s not in SUBFAMILIES]
    if bad:
        raise ValueError(f"unknown bugfix sub-families {bad}; choose from {', '.join(SUBFAMILIES)}")


def make_task(seed: int, difficulty: int = 1, subfamily: str | None = None) -> WorkspaceTask:
    split = "heldout" if seed >= SPLIT_SEED_BASE["heldout"] else "train"
    _check(split, difficulty, [subfamily] if subfamily else None)
    rng = random.Random(f"{FAMILY}:{seed}")
    entries = _split_entries(split, (subfamily,) if subfamily else None)
    e = entries[rng.randrange(len(entries))]
    m = Mutant(**e["mutant"])
    project = _read_project(e["project"])
    files = dict(project)
    fixed = files[m.path]
    files[m.path] = m.apply(fixed)
    failing = e["failing"]  # "tests/test_x.py::test_name"
    shown = failing[rng.randrange(len(failing))]
    shown_file, shown_name = shown.split("::")
    by_file: dict[str, set[str]] = {}
    for f in failing:
        path, name = f.split("::")
        by_file.setdefault(path, set()).add(name)
    hidden = {"pytest.ini": HIDDEN_INI}
    for rel in [k for k in files if k.startswith("tests/")]:
        original = files[rel]
        hidden[rel] = original
        if rel in by_file:
            files[rel] = _without(original, by_file[rel])
    src = project[shown_file]
    a, b = _test_functions(src)[shown_name]
    body = "".join(src.splitlines(keepends=True)[a - 1:b])
    files["tests/test_issue.py"] = _header(src) + "\n\n" + body
    pkg = e["project"]
    if difficulty == 1:
        where = f" The bug is in `{m.path}`."
    elif difficulty == 2:
        where = f" The failing test is `{shown_name}` in tests/test_issue.py."
    else:
        where = ""
    instruction = (f"The `{pkg}` repository in /work has a bug: a test in tests/test_issue.py fails.{where} "
                   f"Find the cause and fix the library code (do not change the tests). Run the tests with run_tests, "
                   f"then submit.")
    diff = patchlib.make(m.path, files[m.path], fixed)
    reference = (Action("run_tests"), Action("read_file", {"path": m.path}), Action("apply_patch", {"patch": diff}),
                 Action("run_tests"))
    tid = f"{FAMILY}/v{VERSION}/{pkg}/{seed}" + (f"-d{difficulty}" if difficulty != 1 else "")
    return WorkspaceTask(tid, FAMILY, VERSION, seed, difficulty, pkg, instruction, files, hidden, VERIFY_COMMAND,
                         reference, setup=("git init -q && git add -A && git commit -qm 'import " + pkg + "'",),
                         test_command=TEST_COMMAND, verify_timeout_s=60.0)


def make_split(split: str, n: int, difficulty: int = 1, subfamilies: list[str] | None = None) -> list[WorkspaceTask]:
    _check(split, difficulty, subfamilies)
    base = SPLIT_SEED_BASE[split]
    if not subfamilies:
        return [make_task(base + i, difficulty) for i in range(n)]
    return [make_task(base + i, difficulty, subfamilies[i % len(subfamilies)]) for i in range(n)]


def distinct_tasks(split: str) -> int:
    return len(_split_entries(split, None))


# ---- catalog build (developers, when a project changes) ---------------------------------
def _failing_tests(files: dict[str, str], m: Mutant) -> list[str]:
    """Run a project's suite with one mutant applied (in a temp copy); the ids of failing tests."""
    import os
    import subprocess
    import sys
    import tempfile
    import xml.etree.ElementTree as ET

    mutated = m.apply(files[m.path])
    try:
        compile(mutated, m.path, "exec")
    except SyntaxError:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in files.items():
            Path(tmp, rel).parent.mkdir(parents=True, exist_ok=True)
            Path(tmp, rel).write_text(mutated if rel == m.path else text)
        report = Path(tmp, "report.xml")
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": tmp, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        try:  # a mutant that loops forever is not a usable bug: it would only test the timeout
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "tests"],
                           cwd=tmp, capture_output=True, timeout=10, env=env)
            cases = ET.parse(report).getroot().iter("testcase")
        except (subprocess.TimeoutExpired, ET.ParseError, FileNotFoundError):
            return []
        return sorted(f"tests/{c.get('classname').split('.')[-1]}.py::{c.get('name')}" for c in cases
                      if c.find("failure") is not None or c.find("error") is not None)


def build_catalog(workers: int = 2, log=print) -> dict:
    """Run every candidate mutant's project suite; keep those that compile and fail some test."""
    from concurrent.futures import ThreadPoolExecutor

    kept = []
    for name in projects():
        files = _project_files(name)
        cands = [m for rel, text in files.items() if rel.endswith(".py") and not rel.startswith("tests/")
                 for m in enumerate_mutants(rel, text)]
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(lambda m: _failing_tests(files, m), cands))
        for m, failing in zip(cands, results):
            if failing:
                mid = hashlib.sha256(json.dumps([name, m.to_dict()], sort_keys=True).encode()).hexdigest()[:16]
                kept.append({"id": mid, "project": name, "mutant": m.to_dict(), "failing": failing})
        log(f"{name}: {sum(e['project'] == name for e in kept)} bugs kept of {len(cands)} candidates")
    return {"version": VERSION, "content_hash": content_hash(), "mutants": kept}


if __name__ == "__main__":
    data = build_catalog()
    tmp = CATALOG.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(CATALOG)
    print(f"wrote {CATALOG} with {len(data['mutants'])} bugs")
