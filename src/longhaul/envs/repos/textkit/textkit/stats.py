"""Frequency statistics over token lists."""

from __future__ import annotations

from .tokens import count_syllables, split_sentences, tokenize


def word_frequencies(tokens: list[str], min_length: int = 1) -> dict[str, int]:
    """Count tokens of at least ``min_length`` characters."""
    counts: dict[str, int] = {}
    for token in tokens:
        if len(token) < min_length:
            continue
        counts[token] = counts.get(token, 0) + 1
    return counts


def top_k(counts: dict[str, int], k: int = 3) -> list[tuple[str, int]]:
    """The ``k`` most frequent entries; ties are broken alphabetically."""
    if k < 0:
        raise ValueError("k must not be negative")
    ranked = sorted(counts.items(), key=lambda pair: (-pair[1], pair[0]))
    return ranked[:k]


def type_token_ratio(tokens: list[str]) -> float:
    """Distinct tokens divided by total tokens (0.0 for no tokens)."""
    if not tokens:
        return 0.0
    return len(set(tokens)) / len(tokens)


def average_length(tokens: list[str]) -> float:
    """Mean token length in characters (0.0 for no tokens)."""
    if not tokens:
        return 0.0
    total = 0
    for token in tokens:
        total += len(token)
    return total / len(tokens)


def hapax_legomena(tokens: list[str]) -> list[str]:
    """Sorted tokens that occur exactly once."""
    counts = word_frequencies(tokens)
    return sorted(token for token, count in counts.items() if count == 1)


def cooccurrences(tokens: list[str], window: int = 2) -> dict[tuple[str, str], int]:
    """Count unordered pairs of different tokens at most ``window`` positions apart."""
    pairs: dict[tuple[str, str], int] = {}
    for i, left in enumerate(tokens):
        for j in range(i + 1, min(i + window + 1, len(tokens))):
            right = tokens[j]
            if left == right:
                continue
            key = (left, right) if left < right else (right, left)
            pairs[key] = pairs.get(key, 0) + 1
    return pairs


def flesch_reading_ease(text: str) -> float:
    """Flesch reading-ease score of ``text`` rounded to two decimals."""
    words = tokenize(text)
    sentences = split_sentences(text)
    if not words or not sentences:
        return 0.0
    syllables = sum(count_syllables(word) for word in words)
    words_per_sentence = len(words) / len(sentences)
    syllables_per_word = syllables / len(words)
    return round(206.835 - 1.015 * words_per_sentence - 84.6 * syllables_per_word, 2)


def longest_words(tokens: list[str], n: int = 1) -> list[str]:
    """The ``n`` longest distinct tokens, longest first, ties alphabetical."""
    unique = sorted(set(tokens), key=lambda token: (-len(token), token))
    return unique[:n]
