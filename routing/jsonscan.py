"""JSON decoding of a pushed config in steps, recognising rules re-sent byte for byte.

``json.loads`` of a 1 MiB config is one ~25 ms call that holds the GIL. This scanner
decodes one top-level member and one ``rules`` element at a time and pauses between
them; a rule whose text equals the previous push's rule at the same index is not
decoded at all. Its result and its errors are exactly ``json.loads``'s: anything it does
not expect is handed to ``json.loads`` whole, which says what is wrong.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from routing.model import Rule
from routing.pause import PAUSE_EVERY, Pause


class Unchanged:
    """Stands in the decoded ``rules`` list for rule ``index`` of the ``known`` rules
    passed to :func:`loads_in_steps`, re-sent byte for byte."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_JSON_SPACE = " \t\n\r"


def loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        # The decoder recurses once per array/object level; a wire config nests about
        # eight deep, so hitting the interpreter's limit is bad input, not our failure.
        raise ValueError("nested too deeply (arrays or objects inside each other)") \
            from None


def loads_in_steps(text: str, pause: Pause,
                    known: Sequence[tuple[str, Rule]] = ()) -> tuple[Any, list[str] | None]:
    """``json.loads`` of a config, one top-level member and one ``rules`` element at a
    time with ``pause()`` between every :data:`PAUSE_EVERY` rules (one ``json.loads`` of
    1 MiB is a single ~25 ms call). Same result and same errors: anything this scanner
    does not expect is handed to ``json.loads`` whole, which says what is wrong.

    Also returns the JSON text of each rule (None if there is no ``rules`` array or
    ``json.loads`` had to decide). Rule ``i`` whose text is ``known[i]``'s, byte for
    byte, is not decoded: it stands as ``Unchanged(i)`` in the result."""
    texts: list[str] = []
    try:
        return _object_in_steps(text, pause, known, texts)
    except (ValueError, IndexError, RecursionError):
        return loads(text), None


def _object_in_steps(text: str, pause: Pause, known: Sequence[tuple[str, Rule]],
                     texts: list[str]) -> tuple[Any, list[str] | None]:
    at = _skip_space(text, 0)
    if text[at] != "{":
        return loads(text), None  # not an object: validation rejects it, whatever it is
    result: dict[str, Any] = {}
    at = _skip_space(text, at + 1)
    if text[at] == "}":
        at += 1
    else:
        while True:
            if text[at] != '"':
                raise ValueError("member name expected")
            key, at = _DECODER.raw_decode(text, at)
            at = _skip_space(text, at)
            if text[at] != ":":
                raise ValueError("':' expected")
            at = _skip_space(text, at + 1)
            if key == "rules" and text[at] == "[":
                texts.clear()  # a repeated "rules" member: the last one wins
                result[key], at = _rules_in_steps(text, at, pause, known, texts)
            else:
                result[key], at = _DECODER.raw_decode(text, at)  # last duplicate wins
            at = _skip_space(text, at)
            if text[at] == "}":
                at += 1
                break
            if text[at] != ",":
                raise ValueError("',' or '}' expected")
            at = _skip_space(text, at + 1)
    if _skip_space(text, at) != len(text):
        raise ValueError("extra data")
    return result, (texts if isinstance(result.get("rules"), list) else None)


def _rules_in_steps(text: str, at: int, pause: Pause, known: Sequence[tuple[str, Rule]],
                    texts: list[str]) -> tuple[list[Any], int]:
    items: list[Any] = []
    at = _skip_space(text, at + 1)
    if text[at] == "]":
        return items, at + 1
    while True:
        index = len(items)
        start = at
        same = index < len(known) and text.startswith(known[index][0], at)
        if same:
            # A JSON value is self-delimiting: the known text is the whole element
            # exactly when a separator follows it.
            after = _skip_space(text, at + len(known[index][0]))
            same = after < len(text) and text[after] in ",]"
        if same:
            items.append(Unchanged(index))
            at += len(known[index][0])
        else:
            item, at = _DECODER.raw_decode(text, at)
            items.append(item)
        texts.append(text[start:at])
        if len(items) % PAUSE_EVERY == 0:
            pause()
        at = _skip_space(text, at)
        if text[at] == "]":
            return items, at + 1
        if text[at] != ",":
            raise ValueError("',' or ']' expected")
        at = _skip_space(text, at + 1)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in _JSON_SPACE:
        at += 1
    return at
