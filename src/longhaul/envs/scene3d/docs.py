"""Offline documentation search for the scene3d agent: `search(query)` answers from an index of
three.js's own JSDoc and of longhaul's ECS components.

The index holds one `Entry` per three class (its description and constructor), per documented
public member (`Class.member`), per `@typedef` and per documented top-level export outside
`nodes/`, all read from the vendored package's `src/**/*.js`, plus one per component of
`world.SCHEMAS`, read when the index is built so that new components appear by themselves.
Search is BM25 over lowercased word tokens (camelCase and snake_case split, plurals folded), with
words of an entry's name counted `NAME_WEIGHT` times.

This module owns the JSDoc parsing, the index and the ranking. It does not install three (`make
scene3d` does; `export.three_build_dir` finds it), does not run JavaScript, and is no tool
definition: the env decides how the agent calls it. The parser is a few regexes over `/** ... */`
blocks and the line after each, not a JavaScript parser: a block it cannot place is skipped.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from longhaul.envs.scene3d.export import three_build_dir
from longhaul.envs.scene3d.world import COMPONENT_DOCS, SCHEMAS
from longhaul.errors import LonghaulError

K1, B = 1.2, 0.75  # the usual BM25 constants
NAME_WEIGHT = 3  # a query word in an entry's name counts as this many in its text
MAX_CHARS = 2500  # the whole answer; it goes into the agent's context
BODY_LINES = 6  # lines under each entry's header
WIDTH = 100
HELP = ("search the three.js API and the scene components with a few words, "
        "e.g. 'cast shadow directional light', 'roughness', 'camera fov' or 'behaviour spin rate'")
NO_THREE = "(three.js API docs are not installed, so only scene components were searched; run `make scene3d`)"

_BLOCK = re.compile(r"/\*\*(.*?)\*/[ \t]*\n?([^\n]*)", re.DOTALL)
_CLASS = re.compile(r"^(?:export\s+)?(?:default\s+)?class\s+(\w+)(?:\s+extends\s+([\w.]+))?")
_CLASS_AT = re.compile(r"^(?:export\s+)?(?:default\s+)?class\s+(\w+)", re.MULTILINE)
_MEMBER = re.compile(r"^(?:this\.(?P<prop>#?\w+)\s*=|(?P<static>static\s+)?(?:async\s+)?(?P<acc>get\s+|set\s+)?\*?"
                     r"(?P<name>#?\w+)\s*(?P<call>\()?)")
_EXPORT = re.compile(r"^export\s+(?:async\s+)?(?P<what>const|let|function\*?|class)\s+(?P<name>\w+)")
_KEYWORDS = {"if", "for", "while", "switch", "return", "const", "let", "var", "function", "super", "new", "throw", "case"}
_LINK = re.compile(r"\{@link\s+([^}\s|]+)(?:[\s|]+([^}]*))?\}")
_MDLINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_FENCE = re.compile(r"```.*?(```|$)", re.DOTALL)
_WORD = re.compile(r"[A-Za-z0-9]+")
_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+[a-z]*")
_STOP = frozenset(("a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "has", "have",
                   "how", "if", "in", "into", "is", "it", "its", "me", "my", "of", "on", "or", "that", "the", "this",
                   "to", "was", "what", "when", "which", "with"))

# world.SCHEMAS kinds in words; an unknown kind is shown as it is
_KINDS = {"vec3": "[x, y, z]", "posvec3": "[x, y, z], each above 0", "color": "hex colour like \"#ff8800\"",
          "unit": "number from 0 to 1", "pos": "number above 0", "nonneg": "number, 0 or more", "num": "number",
          "bool": "true or false", "vec3list": "a list of [x, y, z] (at most 1,000)", "text": "one line of text",
          "code": "JavaScript, the body of function(self, dt, ctx)", "asset": "an asset name (search_assets)"}


@dataclass(frozen=True)
class Entry:
    name: str  # "DirectionalLight", "Object3D.castShadow", "light" (a component)
    kind: str  # class | property | method | typedef | constant | function | component
    signature: str  # one line: "new DirectionalLight(color = 0xffffff, ...)", "Object3D.castShadow: boolean = false"
    text: str  # the description (its first paragraph for members)
    details: tuple[str, ...] = ()  # parameter, return and field lines
    source: str = ""  # "three src/lights/DirectionalLight.js" or "scene3d world.SCHEMAS"
    parent: str = ""  # the class a class extends

    def render(self, lines: int = BODY_LINES) -> str:
        """A header line and at most `lines` lines under it."""
        if self.kind == "component":  # ours: the whole description, then every field
            lines += 4
        body = textwrap.wrap(self.text, WIDTH - 2, max_lines=5 if self.kind == "component" else 3, placeholder=" …") if self.text else []
        if self.kind == "class":
            head = f"class {self.name}" + (f" extends {self.parent}" if self.parent else "") + f"  ({self.source})"
            body = [self.signature] * bool(self.signature) + body
        elif self.kind == "component":
            head = f"component {self.name}: {self.signature}  ({self.source})"
        else:
            head = f"{self.signature}  ({self.kind}, {self.source})"
        return "\n".join([_clip(head)] + [_clip("  " + line) for line in (body + list(self.details))[:lines]])


def _clip(line: str) -> str:
    return line if len(line) <= WIDTH + 20 else line[:WIDTH + 18] + " …"


# ---- three's JSDoc ---------------------------------------------------------------------
def _clean(text: str) -> str:
    """Markdown and JSDoc links as plain words, code fences dropped, whitespace squeezed."""
    text = _LINK.sub(lambda m: m.group(2) or m.group(1).replace("#", "."), _FENCE.sub(" ", text))
    return " ".join(_MDLINK.sub(r"\1", text).split())


def _group(s: str, open_: str, close: str) -> tuple[str, str]:
    """`s` starting with `open_` split into the balanced group's inside and the rest."""
    depth = 0
    for i, ch in enumerate(s):
        depth += (ch == open_) - (ch == close)
        if depth == 0:
            return s[1:i], s[i + 1:]
    return s[1:], ""


def _jsdoc(block: str) -> tuple[list[str], list[tuple[str, str]]]:
    """A block's description paragraphs and its (tag, text) pairs, in order."""
    lines = [re.sub(r"^\s*\*? ?", "", ln, count=1).rstrip() for ln in block.strip("*").splitlines()]
    desc, tags = [], []
    for ln in lines:
        m = re.match(r"\s*@(\w+)\s*(.*)", ln)
        if m:
            tags.append((m.group(1), m.group(2)))
        elif tags:
            tags[-1] = (tags[-1][0], f"{tags[-1][1]} {ln.strip()}")
        else:
            desc.append(ln)
    paragraphs = [_clean(p) for p in re.split(r"\n\s*\n", _FENCE.sub("", "\n".join(desc)))]
    return [p for p in paragraphs if p], tags


def _param(text: str) -> tuple[str, str, str | None, str]:
    """`{type} [name=default] - desc` as (name, type, default or None, desc); optional names get '?'."""
    text = text.strip()
    kind, text = _group(text, "{", "}") if text.startswith("{") else ("", text)
    text = text.strip()
    default = None
    if text.startswith("["):
        inside, text = _group(text, "[", "]")
        name, _, default = inside.partition("=")
        name, default = name.strip() + ("?" if not default else ""), default.strip() or None
    else:
        name, _, text = text.partition(" ")
    return name, kind.strip(), default, _clean(re.sub(r"^\s*-\s*", "", text))


def _signature(name: str, tags: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """`name(a: T = d, ...) -> R` from the @param and @return tags, and one line per parameter."""
    args, lines, ret = [], [], ""
    for tag, text in tags:
        if tag == "param":
            pname, kind, default, desc = _param(text)
            if "." not in pname:  # `options.foo` documents a field of the `options` argument
                args.append(pname + (f": {kind}" if kind else "") + (f" = {default}" if default else ""))
            if desc:
                lines.append(f"{pname}: {desc}")
        elif tag in ("return", "returns"):
            text = text.strip()
            kind, rest = _group(text, "{", "}") if text.startswith("{") else ("", text)
            ret = f" -> {kind}" if kind else ""
            if rest.strip():
                lines.append(f"returns: {_clean(rest)}")
    return f"{name}({', '.join(args)}){ret}", lines


def _typed(name: str, tags: dict[str, str]) -> str:
    """`name: T = default (read-only)` from @type, @default and @readonly."""
    kind = _group(tags["type"].strip(), "{", "}")[0] if tags.get("type", "").strip().startswith("{") else ""
    out = name + (f": {kind}" if kind else "")
    if tags.get("default", "").strip():
        out += f" = {tags['default'].strip()}"
    return out + (" (read-only)" if "readonly" in tags else "")


def _typedef(tags: list[tuple[str, str]], paragraphs: list[str], source: str) -> Entry | None:
    name = (dict(tags)["typedef"].split() or [""])[-1]
    if not name:
        return None
    props = [_param(t) for tag, t in tags if tag == "property"]
    lines = [f"{p}: {kind}" + (f" = {d}" if d else "") + (f" - {desc}" if desc else "") for p, kind, d, desc in props]
    return Entry(name, "typedef", name, " ".join(paragraphs[:1]), tuple(lines), source)


def parse_file(text: str, source: str, top_level: bool) -> list[Entry]:
    """The entries of one JS file: its classes, their documented public members and typedefs,
    and (if `top_level`) its documented exported constants and functions."""
    spans = [(m.start(), _end(text, m.start()), m.group(1)) for m in _CLASS_AT.finditer(text)]
    classes: dict[str, Entry] = {}
    members: list[Entry] = []
    for m in _BLOCK.finditer(text):
        paragraphs, tag_list = _jsdoc(m.group(1))
        tags = dict(tag_list)
        if "private" in tags or "ignore" in tags:
            continue
        if "typedef" in tags:
            members += filter(None, [_typedef(tag_list, paragraphs, source)])
            continue
        decl = m.group(2).strip()
        c = _CLASS.match(decl)
        if c:
            parent = (tags.get("augments") or tags.get("extends") or c.group(2) or "").strip()
            classes[c.group(1)] = Entry(c.group(1), "class", "", " ".join(paragraphs), (), source, parent)
            continue
        if "#" in tags.get("name", ""):
            cls, _, member = tags["name"].partition("#")
            members.append(_member(cls, member, paragraphs, tag_list, "property", source))
            continue
        cls = next((name for start, end, name in spans if start < m.start() < end), None)
        if cls is not None:
            if decl.startswith("constructor") and cls in classes:
                sig, details = _signature(f"new {cls}", tag_list)
                classes[cls] = replace(classes[cls], signature=sig, details=tuple(details))
                continue
            d = _MEMBER.match(decl)
            if not d or (d.group("name") in _KEYWORDS and not d.group("prop")):
                continue
            kind = "method" if d.group("call") and not d.group("acc") and not d.group("prop") else "property"
            static = "static " if d.group("static") else ""
            members.append(_member(cls, d.group("prop") or d.group("name"), paragraphs, tag_list, kind, source, static))
        elif top_level:
            e = _EXPORT.match(decl)
            if e and e.group("what") != "class":
                kind = "function" if e.group("what").startswith("function") or "function" in tags else "constant"
                members.append(_member("", e.group("name"), paragraphs, tag_list, kind, source))
    return list(classes.values()) + [e for e in members if _public(e.name.rpartition(".")[2])]


def _public(member: str) -> bool:
    """Not private (`_x`, `#x`) and not a type-testing flag (`isMesh`), which every class has."""
    return not member.startswith(("_", "#")) and not re.match(r"is[A-Z]\w*$", member)


def _end(text: str, start: int) -> int:
    """Where the class declared at `start` ends: the first `}` in column 0 after it."""
    end = text.find("\n}", start)
    return len(text) if end < 0 else end


def _member(cls: str, name: str, paragraphs: list[str], tag_list: list[tuple[str, str]], kind: str,
            source: str, static: str = "") -> Entry:
    full = f"{cls}.{name}" if cls else name
    tags = dict(tag_list)
    if kind in ("method", "function"):
        sig, details = _signature(full, tag_list)
    else:
        sig, details = _typed(full, tags), []
    if "deprecated" in tags:
        details.insert(0, "deprecated" + (f": {_clean(tags['deprecated'])}" if tags["deprecated"] else ""))
    return Entry(full, kind, static + sig, paragraphs[0] if paragraphs else "", tuple(details), source)


def three_entries(root: Path) -> list[Entry]:
    """Entries of every `src/**/*.js` of the three package at `root` (the folder holding
    package.json). Top-level exports of `nodes/` (TSL shader-graph functions) are left out."""
    out = []
    for path in sorted((root / "src").rglob("*.js")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        out += parse_file(text, f"three {rel}", top_level=not rel.startswith("src/nodes/"))
    return out


# ---- longhaul's ECS ----------------------------------------------------------------------
def component_entries() -> list[Entry]:
    """One entry per component of `world.SCHEMAS`, with its fields, kinds and defaults."""
    out = []
    for comp, fields in SCHEMAS.items():
        lines = [f"{key}: " + (f"one of {kind[4:]}" if kind.startswith("str:") else _KINDS.get(kind, kind))
                 + f" = {json.dumps(default)}" for key, (kind, default) in fields.items()]
        if len(lines) > BODY_LINES:  # pack several fields a line, never splitting one
            packed = lines[:1]
            for line in lines[1:]:
                if len(packed[-1]) + len(line) + 2 <= WIDTH - 2:
                    packed[-1] += "; " + line
                else:
                    packed.append(line)
            lines = packed
        out.append(Entry(comp, "component", f"set_component(entity, \"{comp}\", {{field: value}})", COMPONENT_DOCS.get(comp, ""),
                         tuple(lines), "scene3d world.SCHEMAS"))
    return out


def three_root() -> Path | None:
    """The vendored three package (the folder holding package.json and src/), or None."""
    try:
        root = three_build_dir().parent
    except LonghaulError:
        return None
    return root if (root / "src").is_dir() else None


@lru_cache(maxsize=4)
def _index(root: Path | None) -> tuple[Entry, ...]:
    return tuple(component_entries() + (three_entries(root) if root else []))


def index() -> list[Entry]:
    """All entries: the scene components, then three's (none when three is not installed)."""
    return list(_index(three_root()))


# ---- search ------------------------------------------------------------------------------
def tokens(text: str) -> list[str]:
    """Lowercased words of `text`, each followed by its camelCase parts; stop words dropped and
    plurals folded ("castShadows" -> castshadow, cast, shadow)."""
    out = []
    for word in _WORD.findall(text):
        parts = _PART.findall(word)
        for t in [word] + (parts if len(parts) > 1 else []):
            t = t.lower()
            if len(t) > 3 and t.endswith("s") and not t.endswith(("ss", "us", "is")):
                t = t[:-1]
            if len(t) > 1 and t not in _STOP and not t.isdigit():
                out.append(t)
    return out


class _Ranker:
    """BM25 over the entries, a word in the name counting NAME_WEIGHT times, plus the words'
    idf again for an entry whose own name is a run of the query's words ("cast shadow" finds
    `Object3D.castShadow` above the many entries that mention shadows)."""

    def __init__(self, entries: tuple[Entry, ...]):
        self.entries = entries
        self.postings: dict[str, list[tuple[int, int]]] = {}
        self.named: dict[str, list[int]] = {}
        lengths = []
        for i, e in enumerate(entries):
            tf = Counter(tokens(f"{e.parent} {e.text} {e.signature} {' '.join(e.details)}"))
            for t in tokens(e.name):
                tf[t] += NAME_WEIGHT
            lengths.append(sum(tf.values()))
            for t, n in tf.items():
                self.postings.setdefault(t, []).append((i, n))
            self.named.setdefault(re.sub(r"\W", "", e.name.rpartition(".")[2]).lower(), []).append(i)
        self.lengths = lengths
        self.avg = sum(lengths) / max(1, len(lengths))

    def idf(self, t: str) -> float:
        df = len(self.postings.get(t, ()))
        return math.log(1 + (len(self.entries) - df + 0.5) / (df + 0.5))

    def top(self, query: str, k: int) -> list[Entry]:
        scores: Counter = Counter()
        for t in dict.fromkeys(tokens(query)):
            idf = self.idf(t)
            for i, tf in self.postings.get(t, ()):
                scores[i] += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * self.lengths[i] / self.avg))
        words = [w.lower() for w in _WORD.findall(query)]
        for a in range(len(words)):
            for b in range(a + 1, min(a + 4, len(words)) + 1):
                for i in self.named.get("".join(words[a:b]), ()):
                    scores[i] += sum(self.idf(t) for t in tokens(" ".join(words[a:b])))
        return [self.entries[i] for i, _ in scores.most_common(k)]


@lru_cache(maxsize=4)
def _ranker(root: Path | None) -> _Ranker:
    return _Ranker(_index(root))


def search(query: str, k: int = 5) -> str:
    """The top `k` entries for `query` as plain text of at most MAX_CHARS characters."""
    if not tokens(query or ""):
        return HELP
    root = three_root()
    hits = _ranker(root).top(query, max(1, k))
    note = [] if root else [NO_THREE]
    if not hits:
        hint = (f"no entries match {query.strip()[:60]!r}; try other words, e.g. a class name (Mesh, DirectionalLight), "
                f"a property (castShadow, roughness) or a component ({', '.join(SCHEMAS)})")
        return "\n".join(note + [hint])
    out = "\n".join(note)
    for e in hits:
        for lines in range(BODY_LINES, -1, -1):
            block = e.render(lines)
            if len(out) + len(block) + 2 <= MAX_CHARS:
                out += ("\n\n" if out else "") + block
                break
        else:
            break
    return out[:MAX_CHARS]
