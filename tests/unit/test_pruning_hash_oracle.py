"""The content hash (capture.content_hash) against its definition, kept here as the oracle:
lone surrogates replaced by U+FFFD over the whole `tool NUL normalized text`, then SHA-1 of
the UTF-8. The hash encodes first and scans for surrogates only when the encoder refuses."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given
from hypothesis import strategies as st

from sessionfold.projections.pruning.capture import content_hash, normalize_text

_SURROGATE = re.compile("[\ud800-\udfff]")
# Every code point, lone surrogates (category Cs) included, with the whitespace normalize_text
# trims and the pairs that make astral characters more likely than a uniform draw would.
_TEXT = st.lists(
    st.characters(blacklist_categories=())
    | st.sampled_from(("\ud83d", "\ude00", "\U0001f600", " ", "\t", "\r\n", "\n", "é"))
).map("".join)


def _oracle(tool_name: str, text: str) -> str:
    data = _SURROGATE.sub("\ufffd", f"{tool_name}\0{normalize_text(text)}")
    return hashlib.sha1(data.encode("utf-8")).hexdigest()


@given(st.sampled_from(("bash", "read", "outil\u00e9", "\udc80")), _TEXT)
def test_content_hash_is_the_sha1_of_the_text_with_surrogates_replaced(
    tool_name: str, text: str
) -> None:
    """Same hex digest as replacing every surrogate first, for any text and tool name."""
    assert content_hash(tool_name, text) == _oracle(tool_name, text)


def _normalize_oracle(text: str) -> str:
    """normalize_text as first written (§5.3): CRLF to LF, each line's trailing spaces and
    tabs stripped, the whole text trimmed as JavaScript's `trim`."""
    text = text.replace("\r\n", "\n")
    text = "\n".join(line.rstrip(" \t") for line in text.split("\n"))
    return text.strip(_JS_SPACE)


_JS_SPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_LINES = st.lists(
    st.sampled_from(("a", " ", "\t", "\r", "\n", "\r\n", " \n", "\t\n", "\u3000", "é", "x\ty"))
    | st.text(max_size=3)
).map("".join)


@given(_LINES)
def test_normalize_text_is_its_definition(text: str) -> None:
    """The skips (no CR, no tab, no space before a newline) change nothing."""
    assert normalize_text(text) == _normalize_oracle(text)
