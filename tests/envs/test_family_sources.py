"""A family's content hash covers what its tasks import and read, found from the import graph: an
edit to a module a family depends on (directly or through another module) makes its envcheck entry
stale, an edit elsewhere does not. Built-ins are hashed from an edited copy of the package; a
plugin package is written here, imported, and edited in place."""

import shutil
import sys
import textwrap
from pathlib import Path

import pytest

import longhaul
from longhaul.envs.registry import families, get_family, reward_family
from longhaul.envs.sources import content_hash, family_sources

PACKAGE = Path(longhaul.__file__).parent
FAMILIES = families()


@pytest.fixture(scope="module")
def pkg_copy(tmp_path_factory):
    """A copy of the longhaul package to edit."""
    root = tmp_path_factory.mktemp("src") / "longhaul"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def hashes(root) -> dict[str, str]:
    """Every built-in family's content hash over the package at `root`."""
    return {n: content_hash(f.name, f.version, f.modules, {"longhaul": root}) for n, f in FAMILIES.items()}


@pytest.fixture(scope="module")
def baseline(pkg_copy):
    return hashes(pkg_copy)


def stale_after_editing(root, baseline, rel: str) -> set[str]:
    """The families whose hash changes when `rel` (a file under the package) gains a line."""
    path = root / rel
    original = path.read_bytes()
    try:
        path.write_bytes(original + b"\n# edited\n")
        after = hashes(root)
    finally:
        path.write_bytes(original)
    return {n for n in baseline if baseline[n] != after[n]}


def test_the_copy_hashes_like_the_installed_package(baseline):
    assert baseline == {n: f.content_hash() for n, f in FAMILIES.items()}


WORKSPACE = {"bugfix", "terminal", "multistep", "scene3d"}


@pytest.mark.parametrize("rel, stale", [
    ("envs/terminal.py", {"terminal"}),
    ("envs/multistep.py", {"multistep"}),
    ("envs/state_check.py", {"terminal", "multistep"}),  # the checker program, a file state_task.py names
    ("envs/state_task.py", {"terminal", "multistep"}),
    ("envs/kit.py", {"funcgen", "echo", "niah", "terminal", "multistep", "scene3d"}),
    ("envs/wheel.py", {"terminal"}),
    ("envs/workspace.py", WORKSPACE),  # the env every workspace task runs in
    ("sandbox/spec.py", WORKSPACE),  # reached through workspace -> longhaul.sandbox's __init__
    ("envs/patch.py", WORKSPACE),
    ("envs/mutate.py", {"bugfix"}),
    ("envs/repos/catalog.json", {"bugfix"}),  # data a module names ("repos")
    ("envs/code.py", {"humaneval"}),
    ("envs/funcgen.py", {"funcgen"}),
    ("envs/funcgen_structured.py", {"funcgen"}),  # a builder module funcgen imports
    ("types.py", WORKSPACE | {"echo", "niah"}),
    ("envs/registry.py", set()),  # the package __init__ imports it, but no family's module does
    ("envs/__init__.py", set()),
    ("cli.py", set()),
    ("rl/grpo.py", set()),
])
def test_an_edit_makes_exactly_the_dependent_families_stale(pkg_copy, baseline, rel, stale):
    assert (pkg_copy / rel).is_file(), rel
    assert stale_after_editing(pkg_copy, baseline, rel) == stale


def test_sources_are_labelled_from_the_package_root():
    src = family_sources(["longhaul.envs.multistep"])
    assert {"longhaul/envs/multistep.py", "longhaul/envs/state_task.py", "longhaul/envs/state_check.py",
            "longhaul/envs/workspace.py", "longhaul/sandbox/__init__.py"} <= set(src)
    assert not {"longhaul/envs/registry.py", "longhaul/envs/__init__.py", "longhaul/__init__.py"} & set(src)
    assert all(path.is_file() for path in src.values())


# ------------------------------------------------------------------ a plugin package --

PLUGIN = {
    "__init__.py": "",
    "family.py": """
        from pathlib import Path

        from kitplug import helpers
        from .words import WORDS

        NAMES = (Path(__file__).parent / "data" / "names.txt").read_text().split()


        class Fam:
            FAMILY = "kitplug"
            VERSION = "1"

            @staticmethod
            def make_split(split, n, difficulty=1, subfamilies=None):
                return [helpers.task(i, WORDS, NAMES) for i in range(n)]

            @staticmethod
            def score_many(tasks, replies, **_):
                return []

            @staticmethod
            def reference_reply(task):
                return task
        """,
    "helpers.py": """
        from kitplug.util import deep


        def task(i, words, names):
            return deep.join(words[i % len(words)], names[i % len(names)])
        """,
    "util/__init__.py": "",
    "util/deep.py": "def join(a, b):\n    return a + b\n",
    "words.py": "WORDS = ['anchor', 'bridge']\n",
    "reward.py": "def reward(completions, tasks):\n    return [1.0 for _ in completions]\n",
    "unused.py": "X = 1\n",
    "data/names.txt": "ada bob\n",
    "templates/prompt.txt": "a file nothing names\n",
}


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    root = tmp_path / "kitplug"
    for rel, text in PLUGIN.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [m for m in sys.modules if m == "kitplug" or m.startswith("kitplug.")]:
        del sys.modules[name]


@pytest.mark.parametrize("rel, stale", [
    ("family.py", True),
    ("helpers.py", True),  # imported by the family module
    ("util/deep.py", True),  # imported by the helper
    ("words.py", True),  # a relative import
    ("data/names.txt", True),  # data beside the modules
    ("templates/prompt.txt", True),  # a package ships all of its data, named or not
    ("unused.py", False),
    ("reward.py", False),  # only when it is the family's reward function
])
def test_a_plugin_helper_or_data_edit_makes_the_plugin_stale(plugin, rel, stale):
    fam = get_family("kitplug.family:Fam")
    assert fam.make_split("train", 2) == ["anchorada", "bridgebob"]
    before = fam.content_hash()
    (plugin / rel).write_text((plugin / rel).read_text() + "# edited\n")
    assert (fam.content_hash() != before) is stale


def test_a_plugin_reward_function_is_part_of_the_version(plugin):
    fam = reward_family(get_family("kitplug.family:Fam"), "kitplug.reward:reward")
    assert "kitplug/reward.py" in fam.sources() and "kitplug/family.py" in fam.sources()
    before = fam.content_hash()
    (plugin / "reward.py").write_text((plugin / "reward.py").read_text() + "# edited\n")
    assert fam.content_hash() != before


def test_a_single_module_plugin_takes_the_longhaul_modules_it_imports(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "plugins"))
    src = get_family("wordtasks:CountLines").sources()
    assert "wordtasks.py" in src and "longhaul/envs/workspace.py" in src and "longhaul/types.py" in src
    assert not [label for label in src if label.startswith("longhaul/envs/repos")]


def test_the_hash_does_not_depend_on_where_or_under_what_name_the_package_lives(plugin, tmp_path):
    elsewhere = tmp_path / "checkouts" / "kitplug_dev"
    shutil.copytree(plugin, elsewhere)
    fam = get_family("kitplug.family:Fam")
    moved = family_sources(fam.modules, {"kitplug": elsewhere})
    assert set(moved) == set(fam.sources()) and all(label.startswith("kitplug/") for label in moved)
    assert content_hash(fam.name, fam.version, fam.modules, {"kitplug": elsewhere}) == fam.content_hash()


def test_what_a_build_or_a_run_leaves_in_a_package_is_not_part_of_its_version(plugin):
    fam = get_family("kitplug.family:Fam")
    before = fam.content_hash()
    for rel in ("_speedups.so", "build/lib/x.txt", "kitplug.egg-info/PKG-INFO", "data/run.log", "data/cache.lock"):
        (plugin / rel).parent.mkdir(parents=True, exist_ok=True)
        (plugin / rel).write_text("made by a build or a run\n")
    assert fam.content_hash() == before


def test_an_object_of_a_library_type_does_not_tie_the_version_to_that_library():
    import functools
    from types import SimpleNamespace

    from longhaul.envs.registry import _modules_of

    assert _modules_of(SimpleNamespace(), "kitplug.family:FAM") == ("kitplug.family",)
    assert _modules_of(functools.partial(print), "kitplug.reward:score") == ("kitplug.reward",)
    assert _modules_of(shutil.copytree, "kitplug.reward:copy") == ("kitplug.reward",)


def test_data_spelled_in_literal_pieces_is_seen_in_a_single_module_and_a_namespace_package(tmp_path, monkeypatch):
    """`Path(__file__).parent / "data" / "names.txt"` and `os.path.join("data", "more.txt")` name
    files as surely as one literal; a namespace package (no __init__.py) may name a folder."""
    code = ("import os\nfrom pathlib import Path\n"
            "NAMES = (Path(__file__).parent / 'data' / 'names.txt').read_text()\n"
            "MORE = open(os.path.join(os.path.dirname(__file__), 'data', 'more.txt')).read()\n"
            "WORDS = sorted((Path(__file__).parent / 'words').iterdir())\n")
    single, ns = tmp_path / "single", tmp_path / "ns" / "nsplug"
    for root in (single, ns):
        (root / "data").mkdir(parents=True)
        (root / "words").mkdir()
        for f in ("data/names.txt", "data/more.txt", "data/unnamed.txt", "words/a.txt"):
            (root / f).write_text("x\n")
    (single / "singleplug.py").write_text(code)
    (ns / "fam.py").write_text(code)
    monkeypatch.syspath_prepend(str(single))
    monkeypatch.syspath_prepend(str(tmp_path / "ns"))
    one = family_sources(["singleplug"])
    assert {"data/names.txt", "data/more.txt"} <= set(one) and "data/unnamed.txt" not in one
    assert "words/a.txt" not in one  # a folder beside a module on sys.path is not a package's data
    spaced = family_sources(["nsplug.fam"])
    assert {"nsplug/data/names.txt", "nsplug/data/more.txt", "nsplug/words/a.txt"} <= set(spaced)
