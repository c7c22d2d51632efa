"""Bug injection: small source mutations of the kinds real bugs have, applied as text edits.

A `Mutant` changes one span on one line of one file: an integer off by one, a comparison that
includes or excludes its boundary, a swapped arithmetic or boolean operator, a negated
condition, two swapped call arguments, a wrong default. Operators are edited in place (the text
between the operands), so the rest of the line, its spacing and its comments stay as they were
and the diff shows a one-line change. `enumerate_mutants` lists every candidate in a stable
order; whether a candidate is a real bug (some test fails) is decided by running the tests
(`longhaul.envs.bugfix` does that once and ships the result as a catalog).
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

_CMP_SWAP = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "=="}
_CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_BIN_SWAP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.FloorDiv: ("//", "*"), ast.Mod: ("%", "//")}
_BOOL_SWAP = {ast.And: ("and", "or"), ast.Or: ("or", "and")}


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to the project root
    line: int  # 1-based
    col: int  # 0-based start of the replaced span
    end_col: int
    old: str  # the replaced text, checked before applying
    new: str
    kind: str  # off_by_one, comparison, arithmetic, boolean, negation, swapped_args, default

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        if text[self.col:self.end_col] != self.old:
            raise ValueError(f"mutant {self.kind} at {self.path}:{self.line} does not match the source")
        lines[self.line - 1] = text[: self.col] + self.new + text[self.end_col:]
        return "".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)


def _between(lines: list[str], left: ast.AST, right: ast.AST, token: str):
    """(line, col, end_col) of `token` in the text between two operands on one line, else None."""
    if left.end_lineno != right.lineno:
        return None
    text = lines[left.end_lineno - 1]
    gap = text[left.end_col_offset:right.col_offset]
    k = gap.find(token)
    if k < 0 or gap.count(token) != 1:
        return None
    if token.isalpha() and gap[k - 1:k].isalnum():
        return None
    start = left.end_col_offset + k
    return left.end_lineno, start, start + len(token)


def _segment(lines: list[str], node: ast.AST):
    if node.lineno != node.end_lineno:
        return None
    text = lines[node.lineno - 1]
    return node.lineno, node.col_offset, node.end_col_offset, text[node.col_offset:node.end_col_offset]


def _int_const(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def enumerate_mutants(path: str, source: str) -> list[Mutant]:
    """Every candidate mutant of one Python file, in source order. Docstrings are left alone."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    out: list[Mutant] = []

    def add(span, old, new, kind):
        if span is None:
            return
        line, col, end = span[:3]
        out.append(Mutant(path, line, col, end, old, new, kind))

    defaults_seen: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in [*node.args.defaults, *(x for x in node.args.kw_defaults if x is not None)]:
                defaults_seen.add(id(d))
                seg = _segment(lines, d)
                if seg and isinstance(d, ast.Constant) and type(d.value) in (int, float, bool):
                    v = d.value
                    new = repr(not v) if isinstance(v, bool) else repr(v + 1 if isinstance(v, int) else v * 2 if v else 1.0)
                    add(seg, seg[3], new, "default")
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP_SWAP:
            op = type(node.ops[0])
            add(_between(lines, node.left, node.comparators[0], _CMP_TEXT[op]), _CMP_TEXT[op], _CMP_SWAP[op], "comparison")
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAP:
            old, new = _BIN_SWAP[type(node.op)]
            add(_between(lines, node.left, node.right, old), old, new, "arithmetic")
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BIN_SWAP:
            old, new = _BIN_SWAP[type(node.op)]
            add(_between(lines, node.target, node.value, old + "="), old + "=", new + "=", "arithmetic")
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            old, new = _BOOL_SWAP[type(node.op)]
            add(_between(lines, node.values[0], node.values[1], old), old, new, "boolean")
        elif isinstance(node, (ast.If, ast.While)) or isinstance(node, ast.IfExp):
            test = node.test
            seg = _segment(lines, test)
            if seg is None:
                continue
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                inner = _segment(lines, test.operand)
                if inner:
                    add(seg, seg[3], inner[3], "negation")
            elif isinstance(test, (ast.Name, ast.Attribute, ast.Call)):
                add(seg, seg[3], "not " + seg[3], "negation")
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
            a, b = node.args[0], node.args[1]
            sa, sb = _segment(lines, a), _segment(lines, b)
            if sa and sb and sa[0] == sb[0] and sa[3] != sb[3] and isinstance(a, (ast.Name, ast.Attribute)) \
                    and isinstance(b, (ast.Name, ast.Attribute)):
                text = lines[sa[0] - 1]
                old = text[sa[1]:sb[2]]
                add((sa[0], sa[1], sb[2]), old, sb[3] + text[sa[2]:sb[1]] + sa[3], "swapped_args")
    for node in ast.walk(tree):  # integer constants in comparisons, slices, ranges and arithmetic
        if _int_const(node) and id(node) not in defaults_seen:
            seg = _segment(lines, node)
            if seg and seg[3].lstrip("-").isdigit():
                add(seg, seg[3], str(node.value + 1), "off_by_one")
                if node.value > 0:
                    add(seg, seg[3], str(node.value - 1), "off_by_one")
    out.sort(key=lambda m: (m.line, m.col, m.kind, m.new))
    seen, unique = set(), []
    for m in out:
        key = (m.line, m.col, m.end_col, m.new)
        if key not in seen:
            seen.add(key)
            unique.append(m)
    return unique
