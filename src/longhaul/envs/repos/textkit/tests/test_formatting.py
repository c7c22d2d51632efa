import pytest
from textkit.formatting import (
    camel_to_snake,
    center,
    justify,
    slugify,
    snake_to_camel,
    truncate,
    wrap,
)


def test_wrap_greedy():
    text = "the quick brown fox jumps over the lazy dog"
    assert wrap(text, 10) == ["the quick", "brown fox", "jumps over", "the lazy", "dog"]


def test_wrap_default_width_boundary():
    assert wrap("aaaa bbbb cccc ddddd") == ["aaaa bbbb cccc ddddd"]
    assert wrap("aaaa bbbb cccc dddddd") == ["aaaa bbbb cccc", "dddddd"]
    assert wrap("aaaa bbbb cccc ddddd", 19) == ["aaaa bbbb cccc", "ddddd"]


def test_wrap_splits_long_words():
    assert wrap("abcdefghij xy", 4) == ["abcd", "efgh", "ij", "xy"]
    assert wrap("ab abcdefg", 4) == ["ab", "abcd", "efg"]
    assert wrap("ab c", 1) == ["a", "b", "c"]


def test_wrap_empty_and_invalid_width():
    assert wrap("", 5) == []
    assert wrap("   ", 5) == []
    with pytest.raises(ValueError):
        wrap("a", 0)


def test_justify_even_gaps():
    assert justify("a bb ccc", 12) == "a   bb   ccc"
    assert justify("a b c d", 10) == "a  b  c  d"


def test_justify_extra_spaces_go_left():
    assert justify("a bb ccc", 11) == "a   bb  ccc"
    assert justify("a b c d", 11) == "a   b  c  d"
    assert justify("a b c d", 12) == "a   b   c  d"


def test_justify_tight_and_too_long():
    assert justify("aa bb", 5) == "aa bb"
    assert justify("aa bb", 7) == "aa   bb"
    with pytest.raises(ValueError):
        justify("aa bb", 4)


def test_justify_single_word_is_left_aligned():
    assert justify("hello", 8) == "hello   "
    assert justify("  hi ", 4) == "hi  "
    assert justify("", 3) == "   "


def test_truncate_short_text_unchanged():
    assert truncate("hello", 5) == "hello"
    assert truncate("hello", 10) == "hello"


def test_truncate_cuts_and_prefers_spaces():
    assert truncate("hello world", 8) == "hello..."
    assert truncate("the quick brown fox", 15) == "the quick..."
    assert truncate("a quickbrownfox", 10) == "a quick..."
    assert truncate("abcd efghijk", 11) == "abcd efg..."
    assert truncate("abcd efghijkl", 10) == "abcd..."


def test_truncate_tiny_limits_and_custom_ellipsis():
    assert truncate("hello", 2) == "he"
    assert truncate("hello", 3) == "hel"
    assert truncate("hello", 4) == "h..."
    assert truncate("hello world", 7, "~") == "hello~"
    assert truncate("hello world", 4, "~") == "hel~"


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  Crème brûlée  recipe ") == "cr-me-br-l-e-recipe"
    assert slugify("Hello World", "_") == "hello_world"
    assert slugify("") == ""
    assert slugify("!!!") == ""


def test_slugify_max_length():
    assert slugify("word " * 10) == "word-word-word-word-word-word-word-word"
    assert slugify("a" * 40) == "a" * 40
    assert slugify("Hello World", max_length=9) == "hello-wor"
    assert slugify("Hello World", max_length=6) == "hello"


def test_camel_to_snake():
    assert camel_to_snake("getHTTPResponse") == "get_http_response"
    assert camel_to_snake("HTTPServer") == "http_server"
    assert camel_to_snake("userID") == "user_id"
    assert camel_to_snake("version2Update") == "version2_update"
    assert camel_to_snake("XMLHttp") == "xml_http"
    assert camel_to_snake("aB") == "a_b"
    assert camel_to_snake("ABc") == "a_bc"


def test_camel_to_snake_trivial_inputs():
    assert camel_to_snake("simple") == "simple"
    assert camel_to_snake("A") == "a"
    assert camel_to_snake("ABC") == "abc"
    assert camel_to_snake("already_snake") == "already_snake"
    assert camel_to_snake("") == ""


def test_snake_to_camel():
    assert snake_to_camel("get_http_response") == "getHttpResponse"
    assert snake_to_camel("get_http_response", upper_first=True) == "GetHttpResponse"
    assert snake_to_camel("__private__name") == "privateName"
    assert snake_to_camel("Mixed_CASE") == "mixedCase"
    assert snake_to_camel("") == ""
    assert snake_to_camel("___") == ""


def test_center():
    assert center("ab", 6) == "  ab  "
    assert center("ab", 5) == " ab  "
    assert center("x", 4, "*") == "*x**"
    assert center("ab", 3) == "ab "
    assert center("abc", 3) == "abc"
    assert center("abc", 2) == "abc"
    with pytest.raises(ValueError):
        center("x", 5, "ab")
    with pytest.raises(ValueError):
        center("x", 5, "")
