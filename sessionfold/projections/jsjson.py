"""The length of JavaScript's `JSON.stringify(value)`, for values parsed from JSON.

pi-condense measures every message as `JSON.stringify(message).length`: UTF-16 code units of
JavaScript's output. orjson's output is the same text for everything JSON parsing yields except
numbers, so the fast path takes orjson's length, converts it from UTF-8 bytes to UTF-16 units,
and corrects each float (and each integer beyond 2**53, which JavaScript holds as a double) by
the difference between how orjson and JavaScript print it. Key order never changes a length, so
JavaScript's index-like-keys-first ordering needs no work. Values orjson refuses (lone
surrogates, integers past 64 bits) take a slower pure-Python path with the same rules.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson

_SAFE_INT = 2**53
_MIN_SAFE_INT = -_SAFE_INT  # a constant: `-_SAFE_INT` in a loop negates (allocates) each time

# JavaScript escapes these five controls with a letter (2 chars); other controls as \u00xx (6).
_SHORT_ESCAPES = frozenset('\b\f\n\r\t"\\')


def js_json_length(value: Any) -> int:
    """Length of JSON.stringify(value) in UTF-16 code units."""
    try:
        out = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return _slow_length(value)
    length = len(out) if out.isascii() else _utf16_units(out)
    return length + _number_delta(value)


# What JavaScript's String.prototype.trim removes (WhiteSpace and LineTerminator).
_JS_SPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


def js_length(text: str) -> int:
    """JavaScript's `text.length`: UTF-16 code units."""
    if text.isascii():
        return len(text)
    # UTF-16 in C: an astral character is two units, a lone surrogate one.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def js_head(text: str, units: int) -> str:
    """The longest prefix of `text` of at most `units` UTF-16 units, never half a pair."""
    head = text[:units]
    if js_length(head) <= units:
        return head  # no astral character in the first `units` code points: the common case
    used = 0
    for index, ch in enumerate(text):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > units:
            return text[:index]
    return text


def js_trim(text: str) -> str:
    """JavaScript's `String.prototype.trim`."""
    return text.strip(_JS_SPACE)


def js_number_length(number: int | float) -> int:
    """Length of JavaScript's String(number) for a number parsed from JSON (NaN/inf as null)."""
    if isinstance(number, bool):
        return 4 if number else 5
    if isinstance(number, int):
        if -_SAFE_INT <= number <= _SAFE_INT:
            return len(str(number))
        try:
            number = float(number)
        except OverflowError:
            return 4  # JavaScript's Infinity, which JSON.stringify writes as null
    return _float_length(number)


def js_number_text(number: int | float) -> str:
    """JavaScript's String(number), e.g. for template literals such as occurrence keys."""
    if isinstance(number, int) and not isinstance(number, bool) and abs(number) <= _SAFE_INT:
        return str(number)
    value = float(number)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    digits, point = _shortest_digits(abs(value))
    count = len(digits)
    if count <= point <= 21:
        return sign + digits + "0" * (point - count)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    exponent = point - 1
    mantissa = digits if count == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{mantissa}e{'+' if exponent >= 0 else '-'}{abs(exponent)}"


def _utf16_units(utf8: bytes) -> int:
    # UTF-16 in C, one pass each way: an astral character is two units. orjson never prints a
    # lone surrogate, so the re-encoding cannot fail.
    return len(utf8.decode("utf-8").encode("utf-16-le")) // 2


def _number_delta(value: Any) -> int:
    """JavaScript's printed length minus orjson's, summed over the numbers inside value."""
    kind = type(value)
    if kind is dict:
        stack: list[Any] = [value.values()]
    elif kind is list:
        stack = [value]
    else:
        return _scalar_delta(value)
    delta = 0
    pop, push = stack.pop, stack.append
    # Containers are pushed and iterated; strings, most of a message's values, are skipped
    # where they are met instead of being pushed and popped one by one.
    while stack:
        for item in pop():
            # Tested in the order the kinds come in messages: strings, objects, integers.
            kind = type(item)
            if kind is str:
                continue
            if kind is dict:
                push(item.values())
            elif kind is int:
                if not _MIN_SAFE_INT <= item <= _SAFE_INT:
                    delta += js_number_length(item) - len(str(item))
            elif kind is float:
                if 1e-5 <= item < 1e16:  # _float_delta's common case (costs, positive) inline
                    if item.is_integer():
                        delta -= 2
                else:
                    delta += _float_delta(item)
            elif kind is list:
                push(item)
    return delta


def _scalar_delta(value: Any) -> int:
    """_number_delta of a value that is not a dict or a list."""
    kind = type(value)
    if kind is float:
        return _float_delta(value)
    if kind is int and not -_SAFE_INT <= value <= _SAFE_INT:
        return js_number_length(value) - len(str(value))
    return 0


def _float_delta(value: float) -> int:
    magnitude = abs(value)
    if 1e-5 <= magnitude < 1e16:
        # Here orjson and JavaScript both print plain decimals; only "1.0" vs "1" differs.
        return -2 if value.is_integer() else 0
    if value == 0:
        # Not cached: 0.0 and -0.0 are one cache key, but orjson prints them differently.
        return _float_length(value) - len(orjson.dumps(value))
    return _outside_delta(value)


# Floats outside the plain-decimal range are few in a session and repeat (per-token prices
# such as 5e-06 in every assistant's usage): their delta is worked out once each.
@lru_cache(maxsize=256)
def _outside_delta(value: float) -> int:
    return _float_length(value) - len(orjson.dumps(value))


def _shortest_digits(value: float) -> tuple[str, int]:
    """(digits, point): value = 0.digits x 10**point, digits the shortest round-trip ones."""
    text = repr(value)
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    point = len(whole) + (int(exponent) if exponent else 0)
    if whole == "0":
        # 0.000123 -> whole "0": the leading zeros of the fraction move the point left.
        point -= len(whole + fraction) - len((whole + fraction).lstrip("0"))
    digits = digits.rstrip("0") or "0"
    return digits, point


def _float_length(value: float) -> int:
    if value != value or value in (float("inf"), float("-inf")):
        return 4  # null
    if value == 0:
        return 1  # JSON.stringify(-0) is "0"
    sign = 1 if value < 0 else 0
    digits, point = _shortest_digits(abs(value))
    count = len(digits)
    if count <= point <= 21:
        return sign + point
    if 0 < point <= 21:
        return sign + count + 1
    if -6 < point <= 0:
        return sign + 2 - point + count
    exponent = abs(point - 1)
    return sign + count + (1 if count > 1 else 0) + 2 + len(str(exponent))


def _slow_length(value: Any) -> int:
    """The same length computed without orjson, for values it refuses."""
    if value is None:
        return 4
    if value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, str):
        return _string_length(value)
    if isinstance(value, int | float):
        return js_number_length(value)
    if isinstance(value, dict):
        if not value:
            return 2
        inner = sum(_string_length(str(k)) + 1 + _slow_length(v) for k, v in value.items())
        return 2 + inner + len(value) - 1
    if isinstance(value, list | tuple):
        if not value:
            return 2
        return 2 + sum(_slow_length(v) for v in value) + len(value) - 1
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _string_length(text: str) -> int:
    units = 2
    pending_high = False
    for char in text:
        code = ord(char)
        if pending_high:
            pending_high = False
            if 0xDC00 <= code <= 0xDFFF:
                units += 2 - 6  # the high half was counted as escaped; a pair is 2 plain units
                continue
        if code < 0x20:
            units += 2 if char in _SHORT_ESCAPES else 6
        elif char in _SHORT_ESCAPES:
            units += 2
        elif 0xD800 <= code <= 0xDFFF:
            units += 6  # a lone surrogate is escaped as \udxxx
            pending_high = code <= 0xDBFF
        elif code > 0xFFFF:
            units += 2
        else:
            units += 1
    return units
