"""textkit: small text-processing helpers."""

from .formatting import (
    camel_to_snake,
    center,
    justify,
    slugify,
    snake_to_camel,
    truncate,
    wrap,
)
from .stats import (
    average_length,
    cooccurrences,
    flesch_reading_ease,
    hapax_legomena,
    longest_words,
    top_k,
    type_token_ratio,
    word_frequencies,
)
from .tokens import (
    char_ngrams,
    context,
    count_syllables,
    ngrams,
    split_sentences,
    tokenize,
)

__all__ = [
    "average_length",
    "camel_to_snake",
    "center",
    "char_ngrams",
    "context",
    "cooccurrences",
    "count_syllables",
    "flesch_reading_ease",
    "hapax_legomena",
    "justify",
    "longest_words",
    "ngrams",
    "slugify",
    "snake_to_camel",
    "split_sentences",
    "tokenize",
    "top_k",
    "truncate",
    "type_token_ratio",
    "word_frequencies",
    "wrap",
]
