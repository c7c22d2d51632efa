"""Line wrapping, justification and identifier/slug conversions."""

from __future__ import annotations


def wrap(text: str, width: int = 20) -> list[str]:
    """Greedily wrap ``text`` into lines of at most ``width`` characters.

    Words longer than ``width`` are split into ``width``-sized pieces.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    current = ""
    for word in text.split():
        while len(word) > width:
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:width])
            word = word[width:]
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def justify(line: str, width: int) -> str:
    """Stretch ``line`` to ``width`` by widening the gaps between words.

    Leftmost gaps receive the extra spaces. A single word is padded on the right.
    """
    words = line.split()
    if len(words) < 2:
        return line.strip().ljust(width)
    gaps = len(words) - 1
    spaces = width - sum(len(word) for word in words)
    if spaces < gaps:
        raise ValueError("line is too long to justify")
    base, extra = divmod(spaces, gaps)
    out = words[0]
    for i, word in enumerate(words[1:]):
        out += " " * (base + (1 if i < extra else 0)) + word
    return out


def truncate(text: str, limit: int, ellipsis: str = "...") -> str:
    """Shorten ``text`` to at most ``limit`` characters, ending in ``ellipsis``.

    The cut moves back to a space when one lies in the second half of the kept
    text. When ``limit`` leaves no room for the ellipsis the text is hard-cut.
    """
    if len(text) <= limit:
        return text
    if limit <= len(ellipsis):
        return text[:limit]
    cut = text[: limit - len(ellipsis)]
    space = cut.rfind(" ")
    if space > len(cut) // 2:
        cut = cut[:space]
    return cut.rstrip() + ellipsis


def slugify(text: str, sep: str = "-", max_length: int = 40) -> str:
    """Lowercase ASCII slug of ``text`` with runs of other characters turned into ``sep``."""
    parts: list[str] = []
    current: list[str] = []
    for ch in text.lower():
        if ch.isascii() and ch.isalnum():
            current.append(ch)
        elif current:
            parts.append("".join(current))
            current = []
    if current:
        parts.append("".join(current))
    slug = sep.join(parts)
    if len(slug) > max_length:
        slug = slug[:max_length].rstrip(sep)
    return slug


def camel_to_snake(name: str) -> str:
    """Convert ``getHTTPResponse`` to ``get_http_response``."""
    out: list[str] = []
    for i, ch in enumerate(name):
        if not ch.isupper():
            out.append(ch)
            continue
        if i > 0:
            before = name[i - 1]
            after_lower = i + 1 < len(name) and name[i + 1].islower()
            if before.islower() or before.isdigit() or (before.isupper() and after_lower):
                out.append("_")
        out.append(ch.lower())
    return "".join(out)


def snake_to_camel(name: str, upper_first: bool = False) -> str:
    """Convert ``get_http_response`` to ``getHttpResponse`` (or ``GetHttpResponse``)."""
    parts = [part for part in name.split("_") if part]
    if not parts:
        return ""
    head = parts[0].capitalize() if upper_first else parts[0].lower()
    return head + "".join(part.capitalize() for part in parts[1:])


def center(text: str, width: int, fill: str = " ") -> str:
    """Center ``text`` in ``width`` columns; an odd extra fill goes on the right."""
    if len(fill) != 1:
        raise ValueError("fill must be a single character")
    total = width - len(text)
    if total <= 0:
        return text
    left = total // 2
    return fill * left + text + fill * (total - left)
