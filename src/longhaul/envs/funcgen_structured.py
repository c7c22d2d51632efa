"""`funcgen` sub-families over dicts, recursion, parsing and classes (registered after
`funcgen_basic`'s, in the order tasks draw them)."""

from __future__ import annotations

import textwrap

from longhaul.envs.funcgen_spec import IS_PRIME, WORDS, Spec, _cases, _ints, _register, _sentence
from longhaul.envs.kit import pick


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
