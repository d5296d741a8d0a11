"""Parse the Kubernetes downward-API ``metadata.annotations`` file.

The kubelet writes one ``key="value"`` line per annotation, sorted by key, where the
value is a Go string literal (``strconv.Quote``): ``\\"``, ``\\\\``, ``\\n``, ``\\t``,
``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH``, octal ``\\ooo`` and the C escapes may appear.
"""

from __future__ import annotations

import re

__all__ = ["parse_annotations", "unquote_go"]

_SIMPLE = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
}
_LINE = re.compile(r'^(?P<key>[^=\s]+)=(?P<value>".*")\s*$')


def unquote_go(literal: str) -> str:
    """Decode a double-quoted Go string literal; ValueError when it is malformed."""
    if len(literal) < 2 or literal[0] != '"' or literal[-1] != '"':
        raise ValueError(f"not a quoted string: {literal!r}")
    body = literal[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == '"':
            raise ValueError(f"unescaped quote in {literal!r}")
        if ch != "\\":
            out += ch.encode()
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError(f"dangling backslash in {literal!r}")
        esc = body[i + 1]
        if esc in _SIMPLE:
            out += _SIMPLE[esc].encode()
            i += 2
        elif esc == "x":
            out.append(int(_digits(body, i + 2, 2, 16, literal), 16))
            i += 4
        elif esc in "uU":
            width = 4 if esc == "u" else 8
            out += chr(int(_digits(body, i + 2, width, 16, literal), 16)).encode()
            i += 2 + width
        elif esc in "01234567":
            value = int(_digits(body, i + 1, 3, 8, literal), 8)
            if value > 255:
                raise ValueError(f"octal escape out of range in {literal!r}")
            out.append(value)
            i += 4
        else:
            raise ValueError(f"unknown escape \\{esc} in {literal!r}")
    return out.decode("utf-8", errors="replace")


def _digits(body: str, start: int, count: int, base: int, literal: str) -> str:
    digits = body[start : start + count]
    allowed = "01234567" if base == 8 else "0123456789abcdefABCDEF"
    if len(digits) != count or any(c not in allowed for c in digits):
        raise ValueError(f"bad escape in {literal!r}")
    return digits


def parse_annotations(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """``(annotations, problems)``: every well-formed line, and each bad line's complaint."""
    found: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _LINE.match(line)
        if not match:
            problems.append((f"line {number}", f'not a key="value" line: {line[:80]!r}'))
            continue
        try:
            found[match["key"]] = unquote_go(match["value"])
        except ValueError as exc:
            problems.append((match["key"], str(exc)))
    return found, problems
