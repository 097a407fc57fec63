"""One typed reader for decoded JSON and YAML objects, with field paths for errors.

A :class:`Node` is one object being read (a JSON object of the wire config, a YAML
mapping of an HTTPRoute): it refuses keys it was not told of and hands each field out
as the type asked for, or raises a :class:`~routing.model.ConfigError` naming the field
by its path (``rules[3].matches[0].path.type``). The wire (:mod:`routing.validate`)
and the YAML conversion (:mod:`routing.gateway_api`) both read through it; each names
types in its own document's words (its :class:`Dialect`: :data:`JSON` says object,
array, number; :data:`YAML` says mapping, list, integer). A key it quotes is clipped
(:func:`routing.values.clip`), so a megabyte pushed is never echoed whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Final, TypeVar

from routing.model import ConfigError
from routing.values import clip

T = TypeVar("T")


def json_type(value: Any) -> str:
    """The JSON name of ``value``'s type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


_YAML_TYPES: Final = MappingProxyType({bool: "boolean", int: "integer", float: "number",
                                       str: "string", list: "list", dict: "mapping"})


def yaml_type(value: Any) -> str:
    """The YAML name of ``value``'s type (a date or a time by its Python name)."""
    if value is None:
        return "null"
    return _YAML_TYPES.get(type(value), type(value).__name__)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How the errors about one kind of document name what they expected and got."""

    mapping: str  # what an object is called, with its article
    sequence: str  # what a list is called
    type_name: Callable[[Any], str]


JSON: Final = Dialect("an object", "an array", json_type)
YAML: Final = Dialect("a mapping", "a list", yaml_type)


def join(path: str, key: str) -> str:
    """The path of field ``key`` of the object at ``path`` (``""``: the root)."""
    return f"{path}.{key}" if path else key


def string(value: Any, path: str) -> str:
    """``value`` (a JSON list element at ``path``) if it is a string."""
    if not isinstance(value, str):
        raise ConfigError(path, f"expected a string, got {json_type(value)}")
    return value


class Node:
    """An object being read, with its path for error messages."""

    __slots__ = ("data", "path", "dialect")

    def __init__(self, value: Any, path: str, keys: frozenset[str],
                 dialect: Dialect = JSON) -> None:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected {dialect.mapping}, got "
                                    f"{dialect.type_name(value)}")
        for key in value:
            if key not in keys:
                raise ConfigError(join(path, clip(str(key))), "unknown field")
        self.data = value
        self.path = path
        self.dialect = dialect

    def at(self, key: str) -> str:
        return join(self.path, key)

    def get(self, key: str) -> Any:
        """The raw value at ``key`` (``None`` if absent)."""
        return self.data.get(key)

    def _wrong(self, key: str, expected: str) -> ConfigError:
        got = self.dialect.type_name(self.data[key])
        return ConfigError(self.at(key), f"expected {expected}, got {got}")

    def required(self, key: str) -> Any:
        value = self.data.get(key)
        if value is None:
            raise ConfigError(self.at(key), "required field is missing")
        return value

    def _typed(self, key: str, kind: type, expected: str) -> Any:
        """The value at ``key`` if it is a ``kind`` (an integer is never a boolean),
        ``None`` if absent."""
        value = self.data.get(key)
        if value is not None and (not isinstance(value, kind)
                                  or (kind is int and isinstance(value, bool))):
            raise self._wrong(key, expected)
        return value

    def string(self, key: str, *, default: str = "") -> str:
        value = self._typed(key, str, "a string")
        return default if value is None else value

    def integer(self, key: str, low: int, high: int, default: int = 0) -> int:
        value = self._typed(key, int, "an integer")
        if value is None:
            return default
        if not low <= value <= high:
            raise ConfigError(self.at(key), f"{value} is out of range {low}..{high}")
        return value

    def boolean(self, key: str) -> bool:
        return self._typed(key, bool, "a boolean") is True

    def _list(self, key: str) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._wrong(key, self.dialect.sequence)
        return value

    def items(self, key: str, read: Callable[[Any, str], T]) -> tuple[T, ...]:
        """Read a list (``null``/absent = empty) element by element."""
        where = self.at(key)
        return tuple(read(item, f"{where}[{i}]") for i, item in enumerate(self._list(key)))

    def entries(self, key: str, max_items: int) -> list[tuple[Any, str]]:
        """The list under ``key`` (absent = empty), at most ``max_items`` long, as
        (value, path) pairs."""
        value = self._list(key)
        if len(value) > max_items:
            raise ConfigError(self.at(key), f"{len(value)} entries, at most {max_items}")
        where = self.at(key)
        return [(item, f"{where}[{i}]") for i, item in enumerate(value)]

    def strings(self, key: str) -> tuple[str, ...]:
        return self.items(key, string)

    def child(self, key: str, read: Callable[[Any, str], T]) -> T | None:
        value = self.data.get(key)
        return None if value is None else read(value, self.at(key))

    def node(self, key: str, keys: frozenset[str]) -> Node:
        """The object at ``key`` (which must be there: :meth:`required`), read in
        this node's dialect."""
        return Node(self.required(key), self.at(key), keys, self.dialect)
