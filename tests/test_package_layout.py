"""The package's shape, checked on its source: module-level imports form no circle, training and
generation meet only in `longhaul.ops`, the product never imports the simulators or benchmarks,
and no source file outgrows a reader (fixture repositories aside)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for p in (SRC / "longhaul").rglob("*.py"):
        if "repos" in p.relative_to(SRC / "longhaul").parts:
            continue
        name = ".".join(p.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _imports(mods: dict[str, Path], name: str, top_only: bool) -> set[str]:
    """The modules of `mods` that `name` imports (at module level only, with `top_only`)."""
    path = mods[name]
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = []
    for node in tree.body:  # module level, including inside top-level if/try blocks
        nodes += list(ast.walk(node)) if isinstance(node, (ast.If, ast.Try, ast.Import, ast.ImportFrom)) else []
    found = set()
    for node in (ast.walk(tree) if not top_only else nodes):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        for t in targets:
            while t and t not in mods:
                t = t.rpartition(".")[0]
            while t:  # importing a.b.c runs a/__init__ and a/b/__init__ first
                if t != name and not name.startswith(t + "."):
                    found.add(t)
                t = t.rpartition(".")[0]
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_module_level_imports_form_no_circle():
    mods = _modules()
    graph = {m: _imports(mods, m, top_only=True) for m in mods}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_training_and_generation_meet_only_below_both():
    mods = _modules()
    for side, other in (("longhaul.rl", "longhaul.inference"), ("longhaul.inference", "longhaul.rl"), ("longhaul.ops", "longhaul.rl"),
                        ("longhaul.ops", "longhaul.inference")):
        for m in mods:
            if m == side or m.startswith(side + "."):
                bad = sorted(t for t in _imports(mods, m, top_only=False) if t == other or t.startswith(other + "."))
                assert not bad, f"{m} imports {bad}"


def test_the_product_never_imports_benchmarks_or_simulators():
    for p in (SRC / "longhaul").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] in ("benchmarks", "sim") for n in names), f"{p} imports {names}"


def test_no_source_file_outgrows_a_reader():
    long = {str(p.relative_to(SRC)): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules: {long}"


# where a longhaul import inside a function is the design: package facades that must stay light (every
# submodule import runs them first), and imports that load a model or an optional extra only when used
DEFERRED = {"longhaul.cli", "longhaul.runtime", "longhaul.serve", "longhaul.runtime.families", "longhaul.jobqueue.commands"}


def test_longhaul_imports_sit_at_module_level():
    mods = _modules()
    late = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    target = node.module if isinstance(node, ast.ImportFrom) else (
                        node.names[0].name if isinstance(node, ast.Import) else None)
                    if target and target.split(".")[0] == "longhaul" and name not in DEFERRED:
                        late.setdefault(name, []).append(f"{target} (line {node.lineno})")
    assert not late, f"move these imports to the top of their modules (or explain in DEFERRED): {late}"
