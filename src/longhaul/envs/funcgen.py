"""Procedurally generated "write a Python function" tasks (family ``funcgen``).

Each task is a pure function of ``(seed, difficulty)`` (and optionally a forced
sub-family): a private ``random.Random(seed)`` picks the sub-family, its
constants, the entry-point name and the hidden test inputs.  Expected test
values are computed by executing the reference solution at generation time.

A sub-family is a small builder ``(rng, difficulty) -> Spec`` registered with
``@_register(name, *entry_point_synonyms)`` in the task kit's registry (``longhaul.envs.kit``,
which also draws the sub-family and makes the splits).  Difficulty 1 is one plain
operation, 2 adds a condition or a second step, 3 composes two steps and adds
an edge case (empty input, negative numbers).
"""

from __future__ import annotations

import ast
import copy
import textwrap
from dataclasses import dataclass

from longhaul.envs import kit
from longhaul.envs.kit import make_registry, pick

FAMILY = "funcgen"
VERSION = "1"
DIFFICULTIES = kit.DIFFICULTIES
SPLIT_SEED_BASE = kit.SPLIT_SEED_BASE
_MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class Task:
    task_id: str
    family: str
    version: str
    subfamily: str
    seed: int
    difficulty: int
    entry_point: str
    prompt: str
    reference: str
    tests: str


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


# -------------------------------------------------------------- arithmetic --

@_register("arith.scale_shift", "transform", "compute", "apply_rule")
def _scale_shift(rng, d):
    k, b = rng.randint(2, 9), rng.randint(1, 20)
    desc, body = pick(
        d,
        (f"returns n multiplied by {k}", f"return n * {k}"),
        (f"returns n multiplied by {k} plus {b}", f"return n * {k} + {b}"),
        (f"returns n multiplied by {k} plus {b}, or 0 if n is negative",
         f"if n < 0:\n    return 0\nreturn n * {k} + {b}"))
    return Spec("n", desc, body, _cases(rng, lambda: (rng.randint(-50, 50),), [(0,), (-1,)]))


@_register("arith.clamp", "clamp", "limit", "bound")
def _clamp(rng, d):
    lo, hi = rng.randint(-20, 0), rng.randint(1, 30)
    if d == 3:
        def draw():
            a, b = rng.randint(-20, 0), rng.randint(1, 30)
            return (rng.randint(-40, 40),) + ((a, b) if rng.random() < 0.5 else (b, a))
        return Spec("n, lo, hi", "returns n limited to the inclusive range between lo and hi, "
                    "where lo and hi may be given in either order",
                    "if lo > hi:\n    lo, hi = hi, lo\nreturn max(lo, min(hi, n))",
                    _cases(rng, draw, [(0, 10, -10), (-7, -7, -7)]))
    expr = pick(d, "n", "n * 2")
    desc = pick(d, "returns n", "returns n multiplied by 2 and then")
    return Spec("n", f"{desc} limited to the range {lo} to {hi} inclusive (smaller values "
                f"become {lo}, larger values become {hi})", f"return max({lo}, min({hi}, {expr}))",
                _cases(rng, lambda: (rng.randint(-40, 40),), [(0,), (lo,), (hi + 1,)], n=7))


@_register("arith.abs_diff", "abs_diff", "distance", "gap")
def _abs_diff(rng, d):
    k = rng.randint(2, 9)
    desc, body = pick(
        d,
        ("returns the absolute difference between a and b", "return abs(a - b)"),
        (f"returns the absolute difference between a and b, or 0 if that difference is less than {k}",
         f"diff = abs(a - b)\nreturn diff if diff >= {k} else 0"),
        (f"returns the absolute difference between a and b multiplied by {k}, or -1 if a or b is negative",
         f"if a < 0 or b < 0:\n    return -1\nreturn abs(a - b) * {k}"))
    draw = lambda: (rng.randint(-10, 40), rng.randint(-10, 40))
    return Spec("a, b", desc, body, _cases(rng, draw, [(0, 0), (3, 3 + k - 1), (-5, 5)]))


@_register("arith.sign", "sign", "signum", "sign_of")
def _sign(rng, d):
    params, subject, v, draw, edges = pick(
        d,
        ("n", "n", "n", lambda: (rng.randint(-50, 50),), [(0,), (-3,), (8,)]),
        ("a, b", "the product a * b", "p", lambda: (rng.randint(-9, 9), rng.randint(-9, 9)),
         [(0, -5), (-2, -3), (4, -1)]),
        ("xs", "the sum of the list xs", "t", lambda: (_ints(rng),), [([],), ([3, -3],)]))
    setup = pick(d, "", "p = a * b\n", "t = sum(xs)\n")
    edge = " (an empty list sums to 0)" if d == 3 else ""
    desc = f"returns the sign of {subject}: 1 if it is positive, -1 if it is negative and 0 if it is zero{edge}"
    return Spec(params, desc, setup + SIGN_BODY.format(v=v), _cases(rng, draw, edges))


@_register("arith.digit_sum", "digit_sum", "sum_digits", "add_digits")
def _digit_sum(rng, d):
    desc, body, lo = pick(
        d,
        ("returns the sum of the decimal digits of the non-negative integer n",
         "return sum(int(c) for c in str(n))", 0),
        ("returns the sum of the decimal digits of the integer n, ignoring its sign",
         "return sum(int(c) for c in str(abs(n)))", -99999),
        ("returns the digital root of n: its digit sum (ignoring the sign) repeated until a single digit remains",
         "n = abs(n)\nwhile n >= 10:\n    n = sum(int(c) for c in str(n))\nreturn n", -99999))
    edges = [(0,), (7,)] + ([(-486,)] if lo < 0 else [])
    return Spec("n", desc, body, _cases(rng, lambda: (rng.randint(lo, 99999),), edges))


# ----------------------------------------------------------------- strings --

@_register("strings.reverse", "reverse", "reverse_string", "flip")
def _reverse(rng, d):
    desc, body = pick(
        d,
        ("returns the string s reversed", "return s[::-1]"),
        ("returns the string s reversed and converted to uppercase", "return s[::-1].upper()"),
        ("returns the whitespace-separated words of s in reverse order, each uppercased and "
         "joined by single spaces ('' for an empty string)",
         "return \" \".join(w.upper() for w in reversed(s.split()))"))
    draw = (lambda: (_sentence(rng, nmin=2),)) if d == 3 else (lambda: (_text(rng, "abcdefgxyz", 2, 8),))
    return Spec("s", desc, body, _cases(rng, draw, [("",), ("a",)]))


@_register("strings.count_char", "count_char", "char_count", "occurrences")
def _count_char(rng, d):
    c = rng.choice("aeiou")
    desc, body = pick(
        d,
        (f"returns the number of times the character {c!r} appears in the string s", f"return s.count({c!r})"),
        (f"returns the number of times the letter {c!r} appears in the string s, ignoring case",
         f"return s.lower().count({c!r})"),
        (f"returns the number of times the letter {c!r} appears in the string s ignoring case, "
         "or -1 if s is empty",
         f"if not s:\n    return -1\nreturn s.lower().count({c!r})"))
    draw = lambda: (_text(rng, c + "bcdxyz" + c.upper() + c, 2, 12),)
    return Spec("s", desc, body, _cases(rng, draw, [("",), ("xyz",)]))


@_register("strings.count_vowels", "count_vowels", "vowel_count", "num_vowels")
def _count_vowels(rng, d):
    desc, body = pick(
        d,
        ("returns the number of lowercase vowels (a, e, i, o, u) in the string s",
         "return sum(1 for ch in s if ch in \"aeiou\")"),
        ("returns the number of vowels (a, e, i, o, u, in either case) in the string s",
         "return sum(1 for ch in s if ch.lower() in \"aeiou\")"),
        ("returns how many whitespace-separated words of s start with a vowel (a, e, i, o, u, in either case)",
         "return sum(1 for w in s.split() if w[0].lower() in \"aeiou\")"))
    if d == 3:
        pool = ("apple", "echo", "ice", "oak", "up", "cat", "dog", "sun", "tree", "moon")
        draw = lambda: (_sentence(rng, pool, nmin=2, mixcase=True),)
    else:
        draw = lambda: (_jumble(rng, _text(rng, "abeiklostu", 1, 10)),)
    return Spec("s", desc, body, _cases(rng, draw, [("",)]))


@_register("strings.repeat", "repeat", "repeat_string", "duplicate")
def _repeat(rng, d):
    sep = rng.choice("-+|,")
    desc, body = pick(
        d,
        ("returns the string s repeated n times", "return s * n"),
        (f"returns n copies of the string s joined by {sep!r}", f"return {sep!r}.join([s] * n)"),
        ("returns s with its spaces removed and every remaining character repeated n times "
         "(an empty string if n is 0 or less)",
         "if n <= 0:\n    return \"\"\nreturn \"\".join(ch * n for ch in s if ch != \" \")"))
    draw = lambda: (_text(rng, "abc xyz" if d == 3 else "abcxyz", 1, 4), rng.randint(1, 4))
    return Spec("s, n", desc, body, _cases(rng, draw, [("ab", 0), ("", 3), ("q r", 1)]))


@_register("strings.replace", "replace_char", "substitute", "swap_chars")
def _replace(rng, d):
    a, b = rng.sample("abdeilmnorst", 2)
    mark = rng.choice("#*_?")
    desc, body = pick(
        d,
        (f"returns s with every {a!r} replaced by {b!r}", f"return s.replace({a!r}, {b!r})"),
        (f"returns s with every {a!r} replaced by {b!r} and every {b!r} replaced by {a!r}",
         f"return \"\".join({b!r} if ch == {a!r} else {a!r} if ch == {b!r} else ch for ch in s)"),
        (f"returns s converted to lowercase with every digit replaced by {mark!r}",
         f"return \"\".join({mark!r} if ch.isdigit() else ch.lower() for ch in s)"))
    alphabet = "xyzWQ0123" + a + b if d == 3 else "xy" + a + b + a
    return Spec("s", desc, body, _cases(rng, lambda: (_text(rng, alphabet, 1, 9),), [("",)]))


@_register("strings.capitalize_words", "capitalize_words", "title_case", "cap_words")
def _capitalize_words(rng, d):
    k = rng.randint(3, 5)
    desc, body = pick(
        d,
        ("returns s with the first character of every space-separated word converted to uppercase",
         "return \" \".join(w[:1].upper() + w[1:] for w in s.split(\" \"))"),
        ("returns s with every space-separated word capitalized: first character uppercase, the rest lowercase",
         "return \" \".join(w[:1].upper() + w[1:].lower() for w in s.split(\" \"))"),
        (f"returns the whitespace-separated words of s that are at least {k} characters long, each "
         "capitalized (first character uppercase, the rest lowercase) and joined by single spaces",
         f"return \" \".join(w[:1].upper() + w[1:].lower() for w in s.split() if len(w) >= {k})"))
    return Spec("s", desc, body, _cases(rng, lambda: (_sentence(rng, nmin=2, mixcase=d > 1),), [("",)]))


@_register("strings.is_palindrome", "is_palindrome", "palindrome", "reads_same")
def _is_palindrome(rng, d):
    desc, body = pick(
        d,
        ("returns True if the string s reads the same forwards and backwards, otherwise False",
         "return s == s[::-1]"),
        ("returns True if s reads the same forwards and backwards when case is ignored, otherwise False",
         "t = s.lower()\nreturn t == t[::-1]"),
        ("returns True if s reads the same forwards and backwards when only its letters are kept and "
         "case is ignored (so an empty string is a palindrome), otherwise False",
         "t = [ch.lower() for ch in s if ch.isalpha()]\nreturn t == t[::-1]"))

    def draw():
        w = _text(rng, "abcde", 1, 4)
        s = w + rng.choice(["", "x"]) + w[::-1] if rng.random() < 0.5 else _text(rng, "abcde", 2, 7)
        if d >= 2:
            s = _jumble(rng, s)
        if d == 3:
            s = "".join(ch + (rng.choice(" ,!") if rng.random() < 0.25 else "") for ch in s)
        return (s,)
    edges = [("",), ("ab",)] + ([("Aba",)] if d == 1 else [("A, b a!",)])
    return Spec("s", desc, body, _cases(rng, draw, edges, n=7))


@_register("strings.remove_char", "remove_char", "strip_char", "without_char")
def _remove_char(rng, d):
    c = rng.choice("aeilnorst")
    desc, body = pick(
        d,
        (f"returns s with every occurrence of the character {c!r} removed", f"return s.replace({c!r}, \"\")"),
        (f"returns s with every {c!r} and every {c.upper()!r} removed",
         f"return s.replace({c!r}, \"\").replace({c.upper()!r}, \"\")"),
        (f"returns s with every {c!r} and every {c.upper()!r} removed and the result reversed",
         f"return s.replace({c!r}, \"\").replace({c.upper()!r}, \"\")[::-1]"))
    draw = lambda: (_text(rng, c + "bgkw" + c.upper() + c, 1, 9),)
    return Spec("s", desc, body, _cases(rng, draw, [("",), (c * 3,)]))


@_register("strings.affix", "check_affixes", "starts_and_ends", "has_affix")
def _affix(rng, d):
    p, q = _text(rng, "abcxyz", 2, 2), _text(rng, "abcxyz", 2, 2)
    desc, body = pick(
        d,
        (f"returns True if the string s starts with {p!r}, otherwise False", f"return s.startswith({p!r})"),
        (f"returns True if the string s starts with {p!r} and ends with {q!r}, otherwise False",
         f"return s.startswith({p!r}) and s.endswith({q!r})"),
        (f"returns True if s, after removing leading and trailing spaces and ignoring case, starts with "
         f"{p!r} and ends with {q!r}, otherwise False",
         f"t = s.strip().lower()\nreturn t.startswith({p!r}) and t.endswith({q!r})"))

    def draw():
        s = (p if rng.random() < 0.6 else "") + _text(rng, "abxyz", 0, 4) + (q if rng.random() < 0.6 else "")
        if d == 3:
            s = " " * rng.randint(0, 2) + _jumble(rng, s) + " " * rng.randint(0, 2)
        return (s,)
    return Spec("s", desc, body, _cases(rng, draw, [("",), (p + "k" + q,)], n=7))


# ------------------------------------------------------------------- lists --

@_register("lists.sum_even", "sum_even", "even_sum", "sum_of_evens")
def _sum_even(rng, d):
    k = rng.randint(-4, 6)
    desc, body = pick(
        d,
        ("returns the sum of the even numbers in the list xs", "return sum(x for x in xs if x % 2 == 0)"),
        (f"returns the sum of the even numbers in the list xs that are greater than {k}",
         f"return sum(x for x in xs if x % 2 == 0 and x > {k})"),
        ("returns the sum of the squares of the even numbers in the list xs (0 for an empty list)",
         "return sum(x * x for x in xs if x % 2 == 0)"))
    return Spec("xs", desc, body, _cases(rng, lambda: (_ints(rng, -20, 20, 2, 8),), [([],), ([1, 3],)]))


@_register("lists.filter_greater", "filter_greater", "greater_than", "above")
def _filter_greater(rng, d):
    desc, body = pick(
        d,
        ("returns a list of the elements of xs that are greater than k, in their original order",
         "return [x for x in xs if x > k]"),
        ("returns the elements of xs that are greater than k, sorted in ascending order",
         "return sorted(x for x in xs if x > k)"),
        ("returns, in their original order, the elements of xs whose absolute value is greater than k, "
         "each multiplied by 2 (an empty list if there are none)",
         "return [x * 2 for x in xs if abs(x) > k]"))
    draw = lambda: (_ints(rng, -15, 15, 2, 8), rng.randint(0, 8))
    return Spec("xs, k", desc, body, _cases(rng, draw, [([], 3), ([1, -2, 2], 5)]))


@_register("lists.scale", "scale", "scale_list", "multiply_all")
def _scale(rng, d):
    k, b = rng.randint(2, 9), rng.randint(1, 9)
    desc, expr = pick(
        d,
        (f"returns a new list with every element of xs multiplied by {k}", f"x * {k}"),
        (f"returns a new list with every element of xs multiplied by {k} and then increased by {b}",
         f"x * {k} + {b}"),
        (f"returns a new list in which every negative element of xs is replaced by 0 and every element "
         f"is then multiplied by {k}", f"max(x, 0) * {k}"))
    return Spec("xs", desc, f"return [{expr} for x in xs]",
                _cases(rng, lambda: (_ints(rng, -10, 10),), [([],), ([0, -1],)]))


@_register("lists.extreme", "extreme")
def _extreme(rng, d):
    which, fn = rng.choice([("largest", "max"), ("smallest", "min")])
    k = rng.randint(2, 5)
    desc, body = pick(
        d,
        (f"returns the {which} element of the non-empty list xs", f"return {fn}(xs)"),
        (f"returns the {which} absolute value of the elements of the non-empty list xs",
         f"return {fn}(abs(x) for x in xs)"),
        (f"returns the {which} element of xs multiplied by {k}, or 0 if xs is empty",
         f"if not xs:\n    return 0\nreturn {fn}(xs) * {k}"))
    edges = [([-4],), ([-9, 3, 5],)] + ([([],)] if d == 3 else [])
    names = (f"find_{fn}", which, f"{fn}_value")
    return Spec("xs", desc, body, _cases(rng, lambda: (_ints(rng, -30, 30),), edges), names=names)


@_register("lists.count_occurrences", "count_occurrences", "count_value", "how_many")
def _count_occurrences(rng, d):
    desc, body = pick(
        d,
        ("returns how many times x appears in the list xs", "return xs.count(x)"),
        ("returns how many elements of the list xs are equal to x or to -x",
         "return sum(1 for v in xs if v == x or v == -x)"),
        ("returns the length of the longest run of consecutive elements of xs that are equal to x "
         "(0 if x does not appear)",
         "best = run = 0\nfor v in xs:\n    run = run + 1 if v == x else 0\n"
         "    best = max(best, run)\nreturn best"))
    top = pick(d, 3, 3, 1)
    draw = lambda: (_ints(rng, -top if d == 2 else 0, top, 3, 10), rng.randint(0, top))
    return Spec("xs, x", desc, body, _cases(rng, draw, [([], 2), ([5, 6], 7)]))


@_register("lists.running_sum", "running_sum", "cumulative_sum", "prefix_sums")
def _running_sum(rng, d):
    k = rng.randint(2, 5)
    desc, term = pick(
        d,
        ("returns a list whose i-th element is the sum of the first i+1 elements of xs", "x"),
        (f"returns the running sums of xs after multiplying each element by {k} (the i-th output is "
         f"the sum of the first i+1 scaled elements)", f"x * {k}"),
        ("returns the running sums of xs with every negative element counted as 0 (the i-th output is "
         "the sum of the first i+1 adjusted elements; [] for an empty list)", "max(x, 0)"))
    body = f"out = []\ntotal = 0\nfor x in xs:\n    total += {term}\n    out.append(total)\nreturn out"
    return Spec("xs", desc, body, _cases(rng, lambda: (_ints(rng, -9, 9, 2, 7),), [([],), ([-4],)]))


@_register("lists.dedupe", "dedupe", "unique", "remove_duplicates")
def _dedupe(rng, d):
    desc, body = pick(
        d,
        ("returns the elements of xs with duplicates removed, keeping the first occurrence of each "
         "in the original order",
         "out = []\nfor x in xs:\n    if x not in out:\n        out.append(x)\nreturn out"),
        ("returns the distinct elements of xs sorted in descending order", "return sorted(set(xs), reverse=True)"),
        ("returns the strings in xs with duplicates removed ignoring case, keeping the first occurrence "
         "of each in its original spelling and order",
         "seen = []\nout = []\nfor w in xs:\n    if w.lower() not in seen:\n        seen.append(w.lower())\n"
         "        out.append(w)\nreturn out"))
    if d == 3:
        draw = lambda: ([_jumble(rng, rng.choice(("ab", "cat", "dog", "b"))) for _ in range(rng.randint(2, 7))],)
    else:
        draw = lambda: (_ints(rng, -3, 6, 2, 9),)
    return Spec("xs", desc, body, _cases(rng, draw, [([],)]))


@_register("lists.pairwise_diff", "pairwise_diff", "differences", "deltas")
def _pairwise_diff(rng, d):
    desc, body = pick(
        d,
        ("returns a list of the differences between consecutive elements of xs (each element minus "
         "the one before it)", "return [xs[i + 1] - xs[i] for i in range(len(xs) - 1)]"),
        ("returns a list of the absolute differences between consecutive elements of xs",
         "return [abs(xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]"),
        ("returns the largest absolute difference between consecutive elements of xs, or 0 if xs has "
         "fewer than two elements",
         "if len(xs) < 2:\n    return 0\nreturn max(abs(xs[i + 1] - xs[i]) for i in range(len(xs) - 1))"))
    return Spec("xs", desc, body, _cases(rng, lambda: (_ints(rng, -20, 20, 2, 7),), [([5],), ([3, 1, 0],)]))


# ------------------------------------------------------------------- dicts --

def _dict(rng, keys, values, nmin=0, nmax=5):
    n = rng.randint(nmin, nmax)
    return dict(zip(rng.sample(keys, n), (rng.choice(values) for _ in range(n))))


@_register("dicts.invert", "invert", "invert_dict", "flip_dict")
def _invert(rng, d):
    k = rng.randint(0, 10)
    desc, body = pick(
        d,
        ("returns a new dict mapping each value of d to its key (the values of d are all distinct)",
         "return {v: key for key, v in d.items()}"),
        (f"returns a new dict mapping each value of d that is greater than {k} to its key (the values "
         "of d are all distinct)", f"return {{v: key for key, v in d.items() if v > {k}}}"),
        ("returns a new dict mapping each value of d to the alphabetically sorted list of keys that "
         "have that value ({} for an empty dict)",
         "out = {}\nfor key, v in d.items():\n    out.setdefault(v, []).append(key)\n"
         "return {v: sorted(keys) for v, keys in out.items()}"))

    def draw():
        if d == 3:
            return (_dict(rng, WORDS, range(4), 1, 6),)
        keys = rng.sample(WORDS, rng.randint(1, 5))
        return (dict(zip(keys, rng.sample(range(-5, 20), len(keys)))),)
    return Spec("d", desc, body, _cases(rng, draw, [({},)]))


@_register("dicts.word_count", "word_count", "count_words", "word_freq")
def _word_count(rng, d):
    k = rng.randint(3, 4)
    word, cond, extra = pick(
        d,
        ("w", "", "each whitespace-separated word of s"),
        ("w.lower()", "", "each lowercased whitespace-separated word of s"),
        ("w.lower()", f"\n    if len(w) < {k}:\n        continue",
         f"each lowercased whitespace-separated word of s that is at least {k} characters long"))
    case = " ignoring case" if d > 1 else ""
    desc = f"returns a dict mapping {extra} to the number of times it appears{case} ({{}} for an empty string)"
    body = f"counts = {{}}\nfor w in s.split():{cond}\n    counts[{word}] = counts.get({word}, 0) + 1\nreturn counts"
    pool = ("a", "to", "the", "cat", "dog", "bird", "tree", "apple")
    return Spec("s", desc, body, _cases(rng, lambda: (_sentence(rng, pool, 2, 7, mixcase=d > 1),), [("",)]))


@_register("dicts.sum_values", "sum_values", "total_values", "value_sum")
def _sum_values(rng, d):
    p = rng.choice("ab")
    keys = ("a", "b", "c", "ab", "ba", "bc", "ca", "abc", "bca", "cab")
    if d == 3:
        def draw():
            dd = _dict(rng, keys, range(-9, 20), 1, 5)
            return (dd, [rng.choice(list(dd) + ["zz"]) for _ in range(rng.randint(1, 4))])
        return Spec("d, keys", "returns the sum of d[key] for every key in the list keys that is present in d "
                    "(missing keys are ignored, repeated keys count each time)",
                    "return sum(d[key] for key in keys if key in d)",
                    _cases(rng, draw, [({}, ["a"]), ({"a": 2}, [])]))
    desc, body = pick(
        d,
        ("returns the sum of all values in the dict d", "return sum(d.values())"),
        (f"returns the sum of the values in the dict d whose keys start with {p!r}",
         f"return sum(v for key, v in d.items() if key.startswith({p!r}))"))
    return Spec("d", desc, body, _cases(rng, lambda: (_dict(rng, keys, range(-9, 20), 1, 6),), [({},)]))


@_register("dicts.keys_above", "keys_above", "keys_over", "big_keys")
def _keys_above(rng, d):
    if d == 2:
        def draw():
            lo = rng.randint(-3, 6)
            return (_dict(rng, WORDS, range(-5, 15), 1, 6), lo, lo + rng.randint(0, 6))
        return Spec("d, lo, hi", "returns an alphabetically sorted list of the keys of d whose value is "
                    "between lo and hi inclusive", "return sorted(key for key, v in d.items() if lo <= v <= hi)",
                    _cases(rng, draw, [({}, 0, 5), ({"x": 3, "y": 4}, 4, 4)]))
    desc, body = pick(
        d,
        ("returns an alphabetically sorted list of the keys of d whose value is greater than k",
         "return sorted(key for key, v in d.items() if v > k)"),
        None,
        ("returns the keys of d whose value is greater than k, sorted by value from largest to smallest "
         "with ties broken alphabetically ([] if there are none)",
         "return sorted((key for key, v in d.items() if v > k), key=lambda key: (-d[key], key))"))
    draw = lambda: (_dict(rng, WORDS, range(-5, 10), 1, 6), rng.randint(-2, 6))
    return Spec("d, k", desc, body, _cases(rng, draw, [({}, 0), ({"b": 7, "a": 7}, 1)]))


# -------------------------------------------------------- math / recursion --

@_register("math.factorial", "factorial", "fact", "product_up_to")
def _factorial(rng, d):
    m = rng.randint(7, 1000)
    loop = "result = 1\nfor i in range(2, n + 1):\n    result *= i\n"
    desc, body = pick(
        d,
        ("returns n factorial (the product of the integers from 1 to n, where 0 factorial is 1)",
         loop + "return result"),
        (f"returns n factorial modulo {m} (where 0 factorial is 1)", loop + f"return result % {m}"),
        ("returns the sum of the decimal digits of n factorial, or -1 if n is negative",
         "if n < 0:\n    return -1\n" + loop + "return sum(int(c) for c in str(result))"))
    edges = [(0,), (1,)] + ([(-3,)] if d == 3 else [])
    return Spec("n", desc, body, _cases(rng, lambda: (rng.randint(2, 15),), edges))


@_register("math.fibonacci", "fib", "fibonacci", "nth_fib")
def _fibonacci(rng, d):
    seq = "the Fibonacci sequence 0, 1, 1, 2, 3, 5, ... (each number is the sum of the two before it)"
    step = "a, b = 0, 1\nfor _ in range(n):\n{inner}    a, b = b, a + b\n"
    desc, inner, ret, lo = pick(
        d,
        (f"returns the n-th number (counting from 0) of {seq}", "", "a", 0),
        (f"returns a list of the first n numbers of {seq}", "    out.append(a)\n", "out", 0),
        (f"returns the sum of the even numbers among the first n numbers of {seq}, or 0 if n is 0 or negative",
         "    if a % 2 == 0:\n        out += a\n", "out", -5))
    init = pick(d, "", "out = []\n", "out = 0\n")
    edges = [(0,), (1,)] + ([(-2,)] if lo < 0 else [])
    return Spec("n", desc, init + step.format(inner=inner) + f"return {ret}",
                _cases(rng, lambda: (rng.randint(2, 25),), edges))


@_register("math.gcd", "gcd")
def _gcd(rng, d):
    euclid = "while b:\n    a, b = b, a % b\n"
    desc, body, names = pick(
        d,
        ("returns the greatest common divisor of the positive integers a and b",
         euclid + "return a", ("gcd", "greatest_common_divisor", "common_divisor")),
        ("returns the least common multiple of the positive integers a and b",
         "product = a * b\n" + euclid + "return product // a", ("lcm", "least_common_multiple", "common_multiple")),
        ("returns the greatest common divisor of the absolute values of the integers in xs "
         "(0 for an empty list or a list of zeros)",
         "g = 0\nfor x in xs:\n    a, b = g, abs(x)\n" + textwrap.indent(euclid, "    ") + "    g = a\nreturn g",
         ("gcd_list", "list_gcd", "common_divisor")))
    if d == 3:
        def draw():
            g = rng.randint(1, 9)
            return ([g * rng.randint(-12, 12) for _ in range(rng.randint(1, 5))],)
        return Spec("xs", desc, body, _cases(rng, draw, [([],), ([0, 0],), ([-6],)]), names=names)

    def draw():
        g = rng.randint(1, 12)
        return (g * rng.randint(1, 15), g * rng.randint(1, 15))
    return Spec("a, b", desc, body, _cases(rng, draw, [(7, 7), (13, 1)]), names=names)


@_register("math.primes", "is_prime")
def _primes(rng, d):
    params, desc, body, names, draw, edges = pick(
        d,
        ("n", "returns True if n is a prime number, otherwise False (numbers below 2 are not prime)",
         "return " + IS_PRIME.format(v="n"), ("is_prime", "prime", "check_prime"),
         lambda: (rng.choice([2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 97]) if rng.random() < 0.5
                  else rng.randint(4, 120),), [(1,), (0,), (-7,), (2,)]),
        ("n", "returns how many prime numbers are less than or equal to n",
         f"return sum(1 for m in range(2, n + 1) if {IS_PRIME.format(v='m')})",
         ("count_primes", "prime_count", "primes_up_to"), lambda: (rng.randint(3, 150),), [(1,), (2,)]),
        ("a, b", "returns a list of the prime numbers between a and b inclusive, in ascending order "
         "([] if a is greater than b)", f"return [m for m in range(a, b + 1) if {IS_PRIME.format(v='m')}]",
         ("primes_between", "prime_range", "list_primes"),
         lambda: (rng.randint(-5, 40), rng.randint(10, 70)), [(20, 3), (-3, 2)]))
    return Spec(params, desc, body, _cases(rng, draw, edges, n=7), names=names)


@_register("math.power_sum", "power_sum", "sum_of_powers", "powers_total")
def _power_sum(rng, d):
    p, k = rng.randint(2, 3), rng.randint(2, 4)
    desc, body = pick(
        d,
        (f"returns the sum of i**{p} for every integer i from 1 to n (0 if n is less than 1)",
         f"return sum(i ** {p} for i in range(1, n + 1))"),
        (f"returns the sum of i**{p} for every odd integer i from 1 to n (0 if n is less than 1)",
         f"return sum(i ** {p} for i in range(1, n + 1) if i % 2 == 1)"),
        (f"returns the sum of i**{p} for every integer i from 1 to n that is divisible by {k}, "
         "or -1 if n is negative",
         f"if n < 0:\n    return -1\nreturn sum(i ** {p} for i in range(1, n + 1) if i % {k} == 0)"))
    return Spec("n", desc, body, _cases(rng, lambda: (rng.randint(2, 20),), [(0,), (1,), (-4,)]))


# ----------------------------------------------------------------- parsing --

@_register("parse.csv_sum", "sum_csv", "parse_sum", "add_numbers")
def _csv_sum(rng, d):
    sep = rng.choice(",;|") if d == 2 else ","
    desc, body = pick(
        d,
        ("returns the sum of the integers in s, a string of integers separated by commas such as '1,2,3'",
         "return sum(int(part) for part in s.split(\",\"))"),
        (f"returns the sum of the integers in s, a string of integers separated by {sep!r} with optional "
         "spaces around each integer", f"return sum(int(part) for part in s.split({sep!r}))"),
        ("returns the sum of the integers in the comma-separated string s, skipping empty or blank fields "
         "(so '' gives 0)", "return sum(int(part) for part in s.split(\",\") if part.strip())"))

    def draw():
        nums = [str(x) for x in _ints(rng, -20 if d == 3 else 0, 50, 1, 6)]
        if d == 2:
            nums = [" " * rng.randint(0, 1) + x + " " * rng.randint(0, 1) for x in nums]
        if d == 3:
            nums = [x if rng.random() < 0.8 else rng.choice(["", " "]) for x in nums] + [""] * rng.randint(0, 1)
        return (sep.join(nums),)
    edges = {1: [("7",)], 2: [(" 0 ",)], 3: [("",), (",,",), ("4, -9",)]}[d]
    return Spec("s", desc, body, _cases(rng, draw, edges))


@_register("parse.key_values", "parse_pairs", "parse_kv", "to_dict")
def _key_values(rng, d):
    desc, conv = pick(
        d,
        ("parses s, a string like 'a=1;b=2', into a dict mapping each key to its value as a string", "value"),
        ("parses s, a string like 'a=1;b=2', into a dict mapping each key to its value converted to an int",
         "int(value)"),
        ("parses s, a string like 'a = 1; b = -2', into a dict mapping each key (with surrounding spaces "
         "removed) to its value converted to an int; blank items are skipped, a repeated key keeps its last "
         "value, and '' gives {}", "int(value)"))
    skip = "    if not item.strip():\n        continue\n" if d == 3 else ""
    key = "key.strip()" if d == 3 else "key"
    body = (f"out = {{}}\nfor item in s.split(\";\"):\n{skip}    key, value = item.split(\"=\")\n"
            f"    out[{key}] = {conv}\nreturn out")

    def draw():
        n = rng.randint(1, 4)
        keys = rng.sample("abcxyz", n) + ([rng.choice("abcxyz")] if d == 3 and rng.random() < 0.4 else [])
        pad = (lambda t: " " * rng.randint(0, 1) + t + " " * rng.randint(0, 1)) if d == 3 else (lambda t: t)
        items = [f"{pad(k)}={pad(str(rng.randint(-9 if d == 3 else 0, 99)))}" for k in keys]
        return (";".join(items + ([""] if d == 3 and rng.random() < 0.3 else [])),)
    edges = [("",), (" ; q=1",)] if d == 3 else [("z=0",)]
    return Spec("s", desc, body, _cases(rng, draw, edges))


# ------------------------------------------------------------------- class --

@_register("classes.counter", "Tally", "Accumulator", "RunningTotal")
def _counter(rng, d):
    add = "def add(self, x):\n    self.items.append(x)"
    extra = {1: [], 2: ["def count(self):\n    return len(self.items)"],
             3: ["def undo(self):\n    if self.items:\n        self.items.pop()"]}[d]
    if d == 2:
        add = "def add(self, x):\n    if x >= 0:\n        self.items.append(x)"
    body = "\n\n".join(["def __init__(self):\n    self.items = []", add,
                        "def total(self):\n    return sum(self.items)"] + extra)
    desc = pick(
        d,
        "that keeps a running total: its method `add(x)` adds the number x to the total and its method "
        "`total()` returns the total (0 before any call to add)",
        "whose method `add(x)` records the number x unless x is negative, whose method `total()` returns the "
        "sum of the recorded numbers, and whose method `count()` returns how many numbers were recorded",
        "whose method `add(x)` records the number x, whose method `undo()` removes the most recently added "
        "number that has not been removed yet (doing nothing if there is none), and whose method `total()` "
        "returns the sum of the recorded numbers (0 if there are none)")

    def draw():
        ops = [("add", rng.randint(-5 if d > 1 else 0, 20)) for _ in range(rng.randint(1, 4))]
        if d == 3:
            for _ in range(rng.randint(1, 2)):
                ops.insert(rng.randint(1, len(ops)), ("undo",))
        return (ops, rng.choice(["total", "count"]) if d == 2 else "total")
    edges = {1: [([], "total")], 2: [([("add", -3)], "count"), ([], "total")],
             3: [([("undo",), ("add", 4)], "total"), ([("add", 2), ("undo",), ("undo",)], "total")]}[d]
    return Spec("", desc, body, _cases(rng, draw, edges), kind="class")


# ----------------------------------------------------------------- assembly --

def _render(entry, impl, case, kind):
    """Return (setup lines, expression, expected value) for one test case."""
    if kind == "class":
        ops, query = case
        setup = [f"c = {entry}()"] + [f"c.{op}({', '.join(map(repr, args))})" for op, *args in ops]
        obj = impl()
        for op, *args in ops:
            getattr(obj, op)(*copy.deepcopy(args))
        return setup, f"c.{query}()", getattr(obj, query)()
    expr = f"{entry}({', '.join(map(repr, case))})"
    return [], expr, impl(*copy.deepcopy(case))


def _build(subfamily, seed, difficulty, entry, spec, allow_constant=False):
    """Assemble the Task, or return None when every expected value is the same
    (a constant-returning agent would pass) unless ``allow_constant``."""
    head = f"class {entry}:" if spec.kind == "class" else f"def {entry}({spec.params}):"
    reference = f"{head}\n{textwrap.indent(spec.body, '    ')}\n"
    namespace: dict = {}
    exec(reference, namespace)
    impl = namespace[entry]
    rendered = [_render(entry, impl, case, spec.kind) for case in spec.cases]
    if not 5 <= len(rendered) <= 8:
        raise RuntimeError(f"{subfamily}/d{difficulty}/{seed}: {len(rendered)} test cases")
    lines = []
    for setup, expr, value in rendered:
        if value is None or ast.literal_eval(repr(value)) != value:
            raise RuntimeError(f"{subfamily}: bad expected value {value!r} for {expr}")
        lines += setup + [f"assert {expr} == {value!r}"]
    if len({repr(value) for _, _, value in rendered}) == 1 and not allow_constant:
        return None
    setup, expr, value = rendered[0]
    if spec.kind == "class":
        first = f"Write a Python class `{entry}` {spec.description}."
        shown = f"For example, after `{'; '.join(setup)}`, `{expr}` should return `{value!r}`."
    else:
        first = f"Write a Python function `{entry}({spec.params})` that {spec.description}."
        shown = f"For example, `{expr}` should return `{value!r}`."
    prompt = f"{first}\n{shown}\nReply with only the code in one ```python block."
    return Task(task_id=f"{FAMILY}/v{VERSION}/{subfamily}/d{difficulty}/{seed}", family=FAMILY,
                version=VERSION, subfamily=subfamily, seed=seed, difficulty=difficulty, entry_point=entry,
                prompt=prompt, reference=reference, tests="\n".join(lines) + "\n")


def make_task(seed: int, difficulty: int = 1, subfamily: str | None = None) -> Task:
    """Build the task for ``seed``; the sub-family is drawn from the seed unless given."""
    kit.check_difficulty(difficulty)
    rng, family = kit.draw(SUBFAMILIES, seed, subfamily)
    for attempt in range(_MAX_ATTEMPTS):  # redraw (deterministically) if the tests are degenerate
        spec = family.build(rng, difficulty)
        entry = rng.choice(spec.names or family.names)
        task = _build(family.name, seed, difficulty, entry, spec, allow_constant=attempt == _MAX_ATTEMPTS - 1)
        if task is not None:
            return task


def make_split(split: str, n: int, difficulty: int = 1, subfamilies: list[str] | None = None) -> list[Task]:
    """``n`` tasks with seeds ``base, base+1, ...`` (train: 0, heldout: 1_000_000)."""
    return kit.split_tasks(make_task, SUBFAMILIES, split, n, difficulty, subfamilies)
