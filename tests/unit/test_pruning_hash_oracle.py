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
