"""The `funcgen` family's sub-family registry: what a builder returns (`Spec`), the registry
builders join with `@_register(name, *entry_point_synonyms)`, and the random helpers they draw
inputs with. The builders live in `funcgen_basic` and `funcgen_structured`; `funcgen` turns a
Spec into a task."""

from __future__ import annotations

from dataclasses import dataclass

from longhaul.envs.kit import make_registry


@dataclass
class Spec:
    """What a sub-family builder returns.

    ``body`` is the function body (or, for ``kind == "class"``, the class body)
    without the ``def``/``class`` line.  ``cases`` are argument tuples; the first
    one is shown as the example in the prompt.  For classes a case is
    ``(ops, query)`` with ``ops`` a list of ``(method, *args)`` tuples.
    ``names`` optionally overrides the sub-family's entry-point synonyms.
    """

    params: str
    description: str
    body: str
    cases: list
    names: tuple = ()
    kind: str = "function"


SUBFAMILIES, _register = make_registry()  # a sub-family's `names` are its entry-point synonyms


# ----------------------------------------------------------------- helpers --

WORDS = ("apple", "banana", "cat", "dog", "echo", "fig", "grape", "hat", "ice",
         "jam", "kiwi", "lemon", "moon", "nut", "owl", "pear", "rose", "sun",
         "tree", "up", "vine", "wolf", "yak", "zoo")
SIGN_BODY = "if {v} > 0:\n    return 1\nif {v} < 0:\n    return -1\nreturn 0"
IS_PRIME = "{v} >= 2 and all({v} % i for i in range(2, {v}) if i * i <= {v})"


def _text(rng, alphabet, lo=0, hi=8):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def _ints(rng, lo=-9, hi=9, nmin=1, nmax=7):
    return [rng.randint(lo, hi) for _ in range(rng.randint(nmin, nmax))]


def _jumble(rng, s):
    return "".join(ch.upper() if rng.random() < 0.3 else ch for ch in s)


def _sentence(rng, pool=WORDS, nmin=1, nmax=5, mixcase=False):
    words = [rng.choice(pool) for _ in range(rng.randint(nmin, nmax))]
    return " ".join(_jumble(rng, w) if mixcase else w for w in words)


def _cases(rng, draw, edges=(), n=6):
    """Distinct random cases from ``draw()`` followed by the fixed ``edges``."""
    edges = list(edges)
    out = []
    for _ in range(60):
        if len(out) >= n - len(edges):
            break
        case = draw()
        if case not in out and case not in edges:
            out.append(case)
    return out + edges
