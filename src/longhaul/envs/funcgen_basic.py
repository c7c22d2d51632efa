"""`funcgen` sub-families over numbers, strings and lists (one builder each, registered in the
order tasks draw them; `funcgen_structured` continues the registry)."""

from __future__ import annotations

from longhaul.envs.funcgen_spec import SIGN_BODY, Spec, _cases, _ints, _jumble, _register, _sentence, _text
from longhaul.envs.kit import pick


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
