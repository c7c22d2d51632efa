import pytest
from textkit.stats import (
    average_length,
    cooccurrences,
    flesch_reading_ease,
    hapax_legomena,
    longest_words,
    top_k,
    type_token_ratio,
    word_frequencies,
)


def test_word_frequencies():
    tokens = ["a", "bb", "a", "ccc", "bb", "a"]
    assert word_frequencies(tokens) == {"a": 3, "bb": 2, "ccc": 1}
    assert word_frequencies([]) == {}
    assert word_frequencies(["", "a", ""]) == {"a": 1}


def test_word_frequencies_min_length():
    tokens = ["a", "bb", "a", "ccc", "bb", "a"]
    assert word_frequencies(tokens, 2) == {"bb": 2, "ccc": 1}
    assert word_frequencies(tokens, min_length=3) == {"ccc": 1}


def test_top_k_default_and_ties():
    counts = {"d": 1, "ccc": 2, "a": 3, "bb": 2}
    assert top_k(counts) == [("a", 3), ("bb", 2), ("ccc", 2)]
    assert top_k(counts, 1) == [("a", 3)]
    assert top_k(counts, 10) == [("a", 3), ("bb", 2), ("ccc", 2), ("d", 1)]


def test_top_k_zero_and_negative():
    assert top_k({"a": 1}, 0) == []
    with pytest.raises(ValueError):
        top_k({"a": 1}, -1)


def test_type_token_ratio():
    assert type_token_ratio(["a", "b", "a", "c"]) == 0.75
    assert type_token_ratio(["x"]) == 1.0
    assert type_token_ratio([]) == 0.0


def test_average_length():
    assert average_length(["ab", "abcd"]) == 3.0
    assert average_length(["a", "bb", "cccccc"]) == 3.0
    assert average_length(["abc"]) == 3.0
    assert average_length([]) == 0.0


def test_hapax_legomena():
    assert hapax_legomena(["b", "a", "c", "a"]) == ["b", "c"]
    assert hapax_legomena(["a", "a"]) == []


def test_cooccurrences_default_window():
    result = cooccurrences(["a", "b", "c", "a"])
    assert result == {("a", "b"): 2, ("a", "c"): 2, ("b", "c"): 1}
    result = cooccurrences(["a", "b", "c", "d"])
    assert result == {("a", "b"): 1, ("a", "c"): 1, ("b", "c"): 1, ("b", "d"): 1, ("c", "d"): 1}


def test_cooccurrences_window_one_and_repeats():
    assert cooccurrences(["a", "b", "c", "a"], 1) == {("a", "b"): 1, ("b", "c"): 1, ("a", "c"): 1}
    assert cooccurrences(["x", "x", "y"], window=1) == {("x", "y"): 1}
    assert cooccurrences(["b", "a"], 3) == {("a", "b"): 1}
    assert cooccurrences([]) == {}


def test_flesch_reading_ease():
    assert flesch_reading_ease("The cat sat. The dog ran.") == pytest.approx(119.19)
    assert flesch_reading_ease("Hello world") == pytest.approx(77.91)


def test_flesch_reading_ease_long_sentence():
    text = "Beautiful tables and simple chairs are available today."
    assert flesch_reading_ease(text) == pytest.approx(29.52)


def test_flesch_reading_ease_empty():
    assert flesch_reading_ease("") == 0.0
    assert flesch_reading_ease("...") == 0.0


def test_longest_words():
    tokens = ["aa", "bbb", "c", "dd", "bbb"]
    assert longest_words(tokens) == ["bbb"]
    assert longest_words(tokens, 3) == ["bbb", "aa", "dd"]
    assert longest_words([], 2) == []
