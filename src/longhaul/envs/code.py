"""Pull a Python program out of a model's reply."""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)


def extract_code(reply: str) -> str:
    """The first fenced block (an unclosed final block counts); with no fence, the whole reply."""
    m = _FENCE.search(reply)
    if m:
        return m.group(1)
    return reply.strip("`\n ")
