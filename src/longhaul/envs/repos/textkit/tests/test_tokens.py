import pytest
from textkit.tokens import (
    char_ngrams,
    context,
    count_syllables,
    ngrams,
    split_sentences,
    tokenize,
)


def test_tokenize_basic_sentence():
    text = "Hello, World! It's a well-known fact."
    assert tokenize(text) == ["hello", "world", "it's", "a", "well-known", "fact"]


def test_tokenize_keeps_case_when_asked():
    assert tokenize("Hello World") == ["hello", "world"]
    assert tokenize("Hello World", lowercase=False) == ["Hello", "World"]
    assert tokenize("ab cd", False) == ["ab", "cd"]


def test_tokenize_empty_and_punctuation_only():
    assert tokenize("") == []
    assert tokenize("  ...  !! ") == []


def test_tokenize_joiners_need_letters_on_both_sides():
    assert tokenize("rock 'n' roll") == ["rock", "n", "roll"]
    assert tokenize("the dogs'") == ["the", "dogs"]
    assert tokenize("x- -y") == ["x", "y"]
    assert tokenize("a--b") == ["a", "b"]
    assert tokenize("-start end-") == ["start", "end"]
    assert tokenize("don't stop") == ["don't", "stop"]
    assert tokenize("so it's") == ["so", "it's"]


def test_tokenize_digits_and_underscores():
    assert tokenize("route 66 and v2") == ["route", "66", "and", "v2"]
    assert tokenize("snake_case") == ["snake", "case"]
    assert tokenize("a") == ["a"]


def test_split_sentences():
    text = "Hi there. How are you? Fine!"
    assert split_sentences(text) == ["Hi there.", "How are you?", "Fine!"]


def test_split_sentences_ignores_inner_periods():
    assert split_sentences("Pi is 3.14 today. Yes") == ["Pi is 3.14 today.", "Yes"]
    assert split_sentences("Wait... what?!") == ["Wait...", "what?!"]
    assert split_sentences("Hi.\nBye.") == ["Hi.", "Bye."]


def test_split_sentences_edge_cases():
    assert split_sentences("") == []
    assert split_sentences("   ") == []
    assert split_sentences("No ending here") == ["No ending here"]
    assert split_sentences("!! Hello.") == ["!!", "Hello."]
    assert split_sentences("One.  ") == ["One."]


def test_ngrams_default_bigrams():
    assert ngrams(["a", "b", "c"]) == [("a", "b"), ("b", "c")]


def test_ngrams_other_sizes():
    tokens = ["a", "b", "c"]
    assert ngrams(tokens, 1) == [("a",), ("b",), ("c",)]
    assert ngrams(tokens, 3) == [("a", "b", "c")]
    assert ngrams(tokens, 4) == []
    assert ngrams([], 2) == []
    with pytest.raises(ValueError):
        ngrams(tokens, 0)


def test_char_ngrams():
    assert char_ngrams("cat") == ["__c", "_ca", "cat", "at_", "t__"]
    assert char_ngrams("cat", 2, "#") == ["#c", "ca", "at", "t#"]
    assert char_ngrams("cat", 1) == ["c", "a", "t"]
    with pytest.raises(ValueError):
        char_ngrams("cat", 0)


def test_context_middle_and_edges():
    tokens = ["a", "b", "c", "d", "e", "f"]
    assert context(tokens, 3) == (["b", "c"], ["e", "f"])
    assert context(tokens, 0) == ([], ["b", "c"])
    assert context(tokens, 1) == (["a"], ["c", "d"])
    assert context(tokens, 5) == (["d", "e"], [])
    assert context(tokens, 2, 1) == (["b"], ["d"])


def test_context_index_out_of_range():
    tokens = ["a", "b"]
    with pytest.raises(IndexError):
        context(tokens, -1)
    with pytest.raises(IndexError):
        context(tokens, 2)
    assert context(tokens, 1) == (["a"], [])


def test_count_syllables():
    assert count_syllables("cat") == 1
    assert count_syllables("table") == 2
    assert count_syllables("cake") == 1
    assert count_syllables("Make") == 1
    assert count_syllables("the") == 1
    assert count_syllables("rhythm") == 1
    assert count_syllables("beautiful") == 3
    assert count_syllables("queue") == 1
    assert count_syllables("hmm") == 1
    assert count_syllables("banana") == 3
    assert count_syllables("translate") == 2
