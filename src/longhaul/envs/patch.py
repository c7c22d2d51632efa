"""Apply a unified diff to text files, strictly: every context and removed line must match.

Reads what `diff -u`, `git diff` and models write: `--- a/path` / `+++ b/path` headers (the
`a/` `b/` prefixes optional, `/dev/null` for created or deleted files), `@@ -l,n +l,n @@` hunks,
and "\\ No newline at end of file". A hunk may sit a few lines away from where its header says
(the file may have changed since); it never applies with mismatched context. Errors say which
file and hunk did not match, so a model can re-read the file and try again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    pass


@dataclass
class FilePatch:
    old: str | None  # None: the file is created
    new: str | None  # None: the file is deleted
    hunks: list[list[str]] = field(default_factory=list)  # lines with their ' ', '-', '+' prefix
    starts: list[int] = field(default_factory=list)  # old start line of each hunk (1-based)

    @property
    def path(self) -> str:
        return self.new if self.new is not None else self.old


def _strip_path(raw: str) -> str | None:
    p = raw.split("\t")[0].strip()
    if p == "/dev/null":
        return None
    if p.startswith(("a/", "b/")):
        p = p[2:]
    return p


def parse(patch: str) -> list[FilePatch]:
    lines = patch.splitlines()
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(FilePatch(_strip_path(line[4:]), _strip_path(lines[i + 1][4:])))
            i += 2
            continue
        m = _HUNK.match(line)
        if m:
            if not files:
                raise PatchError("the patch has a hunk before any '--- a/FILE' / '+++ b/FILE' header")
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            hunk, i = [], i + 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_n or seen_new < new_n):
                body = lines[i]
                if body.startswith("\\"):
                    i += 1
                    continue
                tag = body[:1] if body else " "  # editors drop the space of empty context lines
                if tag not in " -+":
                    break
                hunk.append(tag + body[1:])
                seen_old += tag in " -"
                seen_new += tag in " +"
                i += 1
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            if seen_old != old_n or seen_new != new_n:
                raise PatchError(f"hunk '{line}' of {files[-1].path} has {seen_old} old and {seen_new} new lines, "
                                 f"its header says {old_n} and {new_n}")
            files[-1].hunks.append(hunk)
            files[-1].starts.append(int(m.group(1)))
            continue
        i += 1  # `diff --git`, `index ...` and commentary lines are skipped
    if not files or not any(f.hunks for f in files):
        raise PatchError("no hunks found; a unified diff needs '--- a/FILE', '+++ b/FILE' and '@@ -l,n +l,n @@' lines")
    return files


def _apply_hunks(text: str, fp: FilePatch, max_offset: int = 50) -> str:
    had_newline = text.endswith("\n") or text == ""
    lines = text.splitlines()
    out, cursor = [], 0
    for k, (hunk, start) in enumerate(zip(fp.hunks, fp.starts)):
        old = [h[1:] for h in hunk if h[0] in " -"]
        new = [h[1:] for h in hunk if h[0] in " +"]
        want = max(start - 1, 0) if old else start  # a pure insertion's start is the line before it
        at = None
        for off in sorted(range(-max_offset, max_offset + 1), key=abs):
            pos = want + off
            if cursor <= pos <= len(lines) - len(old) and lines[pos:pos + len(old)] == old:
                at = pos
                break
        if at is None:
            raise PatchError(f"hunk {k + 1} of {fp.path} does not match the file near line {start}; read the file and "
                             "make the context and '-' lines match it exactly")
        out += lines[cursor:at] + new
        cursor = at + len(old)
    out += lines[cursor:]
    return "\n".join(out) + ("\n" if out and had_newline else "")


def apply(patch: str, read) -> dict[str, str | None]:
    """New contents by path (None: delete) for a patch; `read(path)` returns a file's text or
    None when it does not exist. Nothing is written: the caller writes all files or none."""
    result: dict[str, str | None] = {}
    for fp in parse(patch):
        if fp.old is None:
            if read(fp.new) is not None:
                raise PatchError(f"the patch creates {fp.new}, which already exists")
            result[fp.new] = _apply_hunks("", fp)
            continue
        current = result[fp.old] if fp.old in result else read(fp.old)
        if current is None:
            raise PatchError(f"the patch changes {fp.old}, which does not exist")
        new_text = _apply_hunks(current, fp)
        if fp.new is None:
            result[fp.old] = None
        else:
            if fp.new != fp.old:
                result[fp.old] = None
            result[fp.new] = new_text
    return result


def make(path: str, old: str, new: str, context: int = 3) -> str:
    """A unified diff from `old` to `new` for one file, as `git diff` writes it."""
    import difflib

    body = difflib.unified_diff(old.splitlines(), new.splitlines(), f"a/{path}", f"b/{path}", n=context, lineterm="")
    return "\n".join(body) + "\n"
