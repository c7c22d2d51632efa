"""The files a task family's version is made of: the modules its tasks import and the data they read.

`family_sources(modules)` reads (never imports) each module and follows its import statements,
at module level and inside functions, into every module of a followed top-level package:
`longhaul`, and the top-level package of each starting module (a plugin's own package). For each
module it reaches it also takes the data named by a string literal of that module, or spelled in
literal pieces (`Path(__file__).parent / "data" / "words.txt"`, `os.path.join("data", "words.txt")`):
a file beside the module or at the root of its top-level package (`"state_check.py"`), or a
folder there that is not a package (`"repos"`). A plugin that is a package ships all of its
non-Python files too, whatever names them.

Rules that keep the graph to what a family's tasks use:
- the `__init__` of a parent package, which Python runs as a side effect of importing a submodule,
  is not followed (each `longhaul.envs` module would otherwise depend on the registry and so on
  every family); `from pkg import name` follows `pkg/__init__.py` only when `name` is not a module;
- a folder is taken only inside a package (regular or namespace), never in a directory on
  `sys.path`, so a single-module plugin ships only the files it names beside it.

Files a build, an install or a run leaves in a package (`BUILT_SUFFIXES`, `BUILT_DIRS`: compiled
extensions, caches, logs, locks) are never part of a version, and labels name files by import
name, so the hash is the same wherever and under whatever directory name the package lives.

Not seen: modules imported by a computed name (`importlib.import_module(f"...")`), files opened
through a computed name outside a plugin package, and code outside the followed packages (the
standard library, installed dependencies); a family that depends on those says so in its VERSION.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from pathlib import Path

FOLLOWED = ("longhaul",)  # always followed, besides the starting modules' own packages


def content_hash(name: str, version: str, modules, locations: dict | None = None) -> str:
    """16 hex digits of the family's name, version and every file of `family_sources`."""
    h = hashlib.sha256(f"{name}\0{version}\0".encode())
    for label, path in family_sources(modules, locations).items():
        data = path.read_bytes()
        h.update(f"{label}\0{len(data)}\0".encode() + data)
    return h.hexdigest()[:16]


def family_sources(modules, locations: dict | None = None) -> dict[str, Path]:
    """`{label: file}` of every module and data file that `modules` (dotted names) depend on; a
    label is the path from the top-level package's parent (`longhaul/envs/terminal.py`), the same
    wherever the package is installed. `locations` ({top-level name: directory or file}) reads a
    package from elsewhere than where Python finds it (a checkout that is not the one imported)."""
    tops = {name: _top_location(name) for name in {*FOLLOWED, *(m.split(".")[0] for m in modules)}}
    tops.update({name: Path(where).resolve() for name, where in (locations or {}).items()})
    tops = {name: where for name, where in tops.items() if where is not None}
    out: dict[str, Path] = {}
    seen: set[str] = set()
    todo = [m for m in modules if _module_file(m, tops) is not None]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name, tops)
        tree = ast.parse(path.read_bytes(), str(path))
        top = name.split(".")[0]
        out[_label(path, top, tops[top])] = path
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        todo += [m for m in _imports(tree, package, lambda m: _module_file(m, tops) is not None)]
        for f in _named_data(tree, path, tops[top]):
            out[_label(f, top, tops[top])] = f
    for name in {m.split(".")[0] for m in modules} - set(FOLLOWED):
        where = tops.get(name)
        if where is not None and (where / "__init__.py").is_file():  # a regular package, not a namespace
            for f in _files_under(where):
                if f.suffix != ".py":
                    out[_label(f, name, where)] = f
    return dict(sorted(out.items()))


def _top_location(top: str) -> Path | None:
    """The directory of top-level package `top`, or the file of a top-level module."""
    mod = sys.modules.get(top)
    if mod is not None:
        paths = list(getattr(mod, "__path__", []) or [])
        where = paths[0] if paths else getattr(mod, "__file__", None)
    else:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        where = (list(spec.submodule_search_locations or []) or [spec.origin])[0]
    return Path(where).resolve() if where and Path(where).exists() else None


def _module_file(name: str, tops: dict[str, Path]) -> Path | None:
    top, *rest = name.split(".")
    where = tops.get(top)
    if where is None:
        return None
    if where.is_file():
        return where if not rest else None
    base = where.joinpath(*rest)
    for cand in ((base.with_name(base.name + ".py"),) if rest else ()) + (base / "__init__.py",):
        if cand.is_file():
            return cand
    return None


def _imports(tree: ast.AST, package: str, known) -> list[str]:
    """Dotted names of the modules (or packages) of `known` that `tree`'s import statements run."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    continue
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            subs = [f"{base}.{a.name}" for a in node.names if a.name != "*"]
            modules = [m for m in subs if known(m)]
            out += modules
            if len(modules) < len(node.names):  # a name that is not a submodule is read from `base` itself
                out.append(base)
    return [m for m in out if known(m)]


def _literal_paths(tree: ast.AST):
    """Every string literal, and every path spelled in literal pieces: the trailing literals of a
    `/` chain (`Path(__file__).parent / "data" / "names.txt"` gives "data/names.txt") and the
    literal arguments of `os.path.join(...)` / `.joinpath(...)`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            pieces = []
            while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                pieces.append(node.right)
                node = node.left
            pieces.append(node)
            tail = []
            for piece in pieces:  # right to left
                if not (isinstance(piece, ast.Constant) and isinstance(piece.value, str)):
                    break
                tail.append(piece.value)
            if len(tail) > 1:
                yield "/".join(reversed(tail))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("join", "joinpath"):
            tail = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if len(tail) > 1 and all(isinstance(a, ast.Constant) for a in node.args[len(node.args) - len(tail):]):
                yield "/".join(tail)


def _named_data(tree: ast.AST, path: Path, top: Path) -> list[Path]:
    """Files beside `path` (or at the root of its top-level package) named by a string literal, or
    by literal pieces of a path (`_literal_paths`)."""
    bases = [path.parent] + ([top] if top.is_dir() and top != path.parent else [])
    # a folder counts inside a package, regular or namespace, never in a directory on sys.path
    inside_package = (path.parent / "__init__.py").is_file() or (top.is_dir() and path.is_relative_to(top))
    out = []
    for rel in _literal_paths(tree):
        if not 0 < len(rel) < 200 or "\n" in rel or "\0" in rel or rel.startswith("/"):
            continue
        parts = rel.split("/")
        if any(p in ("", ".", "..", "__pycache__") or p.startswith(".") for p in parts):
            continue
        for base in bases:
            cand = base.joinpath(*parts)
            if cand.is_file() and not _built(cand.relative_to(base).parts):
                out.append(cand)
            elif inside_package and cand.is_dir() and not (cand / "__init__.py").exists():
                out += _files_under(cand)
    return out


# what a build, an install or a run leaves inside a package: never part of a family's version
BUILT_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".dylib", ".lock", ".log")
BUILT_DIRS = ("__pycache__", "build", "dist")


def _built(parts: tuple[str, ...]) -> bool:
    return (parts[-1].endswith(BUILT_SUFFIXES) or any(p in BUILT_DIRS or p.startswith(".") or p.endswith(".egg-info")
                                                      for p in parts))


def _files_under(root: Path) -> list[Path]:
    return sorted(f for f in root.rglob("*") if f.is_file() and not _built(f.relative_to(root).parts))


def _label(path: Path, top_name: str, top: Path) -> str:
    """`path` named from its top-level package's import name (`longhaul/envs/terminal.py`), or
    beside a single-file module from that module's directory: never from where it is installed,
    so a symlinked or renamed checkout hashes alike."""
    if top.is_dir() and path.is_relative_to(top):
        return "/".join((top_name, *path.relative_to(top).parts))
    if top.is_file() and path.is_relative_to(top.parent):
        return "/".join(path.relative_to(top.parent).parts)
    raise ValueError(f"{path} is outside package {top_name!r} at {top}")
