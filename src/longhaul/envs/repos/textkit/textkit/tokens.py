"""Splitting text into words, sentences and n-grams."""

from __future__ import annotations

SENTENCE_ENDINGS = ".!?"
JOINERS = "'-"


def tokenize(text: str, lowercase: bool = True) -> list[str]:
    """Split ``text`` into word tokens.

    A word is a run of letters and digits. An apostrophe or hyphen that sits
    between two such characters joins them ("don't", "well-known").
    """
    tokens: list[str] = []
    start = -1
    for i, ch in enumerate(text):
        if ch.isalnum():
            if start < 0:
                start = i
            continue
        inside_word = start >= 0 and i + 1 < len(text) and text[i + 1].isalnum()
        if ch in JOINERS and inside_word:
            continue
        if start >= 0:
            tokens.append(text[start:i])
            start = -1
    if start >= 0:
        tokens.append(text[start:])
    if lowercase:
        tokens = [token.lower() for token in tokens]
    return tokens


def split_sentences(text: str) -> list[str]:
    """Split ``text`` after ``.``, ``!`` or ``?`` followed by whitespace or the end."""
    sentences: list[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ch not in SENTENCE_ENDINGS:
            continue
        at_end = i + 1 == len(text)
        if at_end or text[i + 1].isspace():
            sentences.append(text[start : i + 1].strip())
            start = i + 1
    rest = text[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


def ngrams(tokens: list[str], n: int = 2) -> list[tuple[str, ...]]:
    """Consecutive ``n``-token tuples of ``tokens``."""
    if n <= 0:
        raise ValueError("n must be positive")
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def char_ngrams(word: str, n: int = 3, pad: str = "_") -> list[str]:
    """Character ``n``-grams of ``word`` padded with ``n - 1`` pad characters per side."""
    if n <= 0:
        raise ValueError("n must be positive")
    padding = pad * (n - 1)
    padded = padding + word + padding
    return [padded[i : i + n] for i in range(len(padded) - n + 1)]


def context(tokens: list[str], index: int, radius: int = 2) -> tuple[list[str], list[str]]:
    """Up to ``radius`` tokens before and after the token at ``index``."""
    if index < 0 or index >= len(tokens):
        raise IndexError(f"token index out of range: {index}")
    left = tokens[max(0, index - radius) : index]
    right = tokens[index + 1 : index + 1 + radius]
    return left, right


def count_syllables(word: str) -> int:
    """Estimate syllables: vowel groups, minus a silent final 'e', at least one."""
    word = word.lower()
    count = 0
    previous_vowel = False
    for ch in word:
        is_vowel = ch in "aeiouy"
        if is_vowel and not previous_vowel:
            count += 1
        previous_vowel = is_vowel
    if word.endswith("e") and not word.endswith("le") and count > 1:
        count -= 1
    return max(count, 1)
