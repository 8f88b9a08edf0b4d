"""Read TOML tables into frozen dataclasses by their fields: the dataclasses are the schema.

:func:`read` checks a table against a dataclass: unknown keys fail with "did you mean", a key without a
default is required, and each value must have its field's type (``str``, ``int``, ``bool``,
``tuple[T, ...]``, ``Mapping[str, T]``, ``T | None``, a nested dataclass, or :class:`EnvValue`). Every
error is a :class:`~kforge.errors.ConfigError` naming the key path (``projects.demo.arch_knobs[0].only[0]``).
Domain checks (a commit hash, an arch name, a cross-reference) are the caller's, on the typed result.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Union

from kforge.errors import ConfigError, did_you_mean


class EnvValue(str):
    """An environment value: a string, a number or a boolean (written "1"/"0"), with whitespace normalised."""


class ArchNumber(int):
    """An arch as a number, major * 10 + minor (``120`` for sm_120)."""

    schema_name = "arch number such as 120"


_TYPE_NAMES = {dict: "table", list: "array", str: "string", int: "integer", float: "float", bool: "boolean"}


def type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def article(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def normalise_env_value(value: str) -> str:
    """No stray whitespace: strip the ends and collapse runs (``"4 "`` broke NVCC_THREADS once)."""
    return " ".join(value.split())


class Reader:
    """Reads one file's tables; errors name the file and the key path."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def error(self, key: str, problem: str, *, fix: str | None = None) -> ConfigError:
        return ConfigError(f"{self.file.name}: {key} {problem}",
                           fix=fix or f"edit {self.file} (see docs/forge-toml.md for every key)")

    def read(self, typ: Any, value: Any, key: str) -> Any:
        """``value`` as ``typ`` (see the module docstring); ``key`` is its path, for errors."""
        origin, args = typing.get_origin(typ), typing.get_args(typ)
        if typ is Any:
            return value
        if dataclasses.is_dataclass(typ):
            return self.table(typ, value, key)
        if origin in (Union, types.UnionType):
            return self.read(next(a for a in args if a is not type(None)), value, key)
        if origin is tuple:
            items = [value] if isinstance(value, str) and args[0] is str else value
            self._want(items, list, key, "array")
            return tuple(self.read(args[0], item, f"{key}[{i}]") for i, item in enumerate(items))
        if origin in (Mapping, dict) or typ is Mapping:
            self._want(value, dict, key, "table")
            return MappingProxyType({k.strip(): self.read(args[1], v, f"{key}.{k}") for k, v in value.items()})
        if typ is EnvValue:
            if isinstance(value, bool):
                value = "1" if value else "0"
            self._want(value, (str, int), key, "string")
            return EnvValue(normalise_env_value(str(value)))
        if typ is ArchNumber:
            self._want(value, int, key, ArchNumber.schema_name)
            return value
        self._want(value, typ, key, _TYPE_NAMES.get(typ, getattr(typ, "__name__", str(typ))))
        return value

    def _want(self, value: Any, typ: type | tuple[type, ...], key: str, name: str) -> None:
        bad_bool = isinstance(value, bool) and (typ is int or (isinstance(typ, tuple) and bool not in typ and int in typ))
        if bad_bool or not isinstance(value, typ):
            shown = f" ({value!r})" if not isinstance(value, (dict, list)) else ""
            raise self.error(key, f"must be {article(name)}, not {type_name(value)}{shown}")

    def table(self, cls: type, data: Any, path: str) -> Any:
        """A TOML table as an instance of ``cls``."""
        return cls(**self.values(cls, data, path))

    def values(self, cls: type, data: Any, path: str, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """A TOML table's values for the fields of ``cls`` (``skip``: fields the TOML doesn't hold)."""
        if not isinstance(data, dict):
            raise self.error(path, f"must be a table, not {type_name(data)}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
        for key in data:
            if key not in fields:
                raise self.error(f"{path}.{key}" if path else key, f"is not a known key{did_you_mean(key, fields)}",
                                 fix=f"the keys allowed here are: {', '.join(fields)}")
        values = {}
        for name, f in fields.items():
            key = f"{path}.{name}" if path else name
            if name in data:
                values[name] = self.read(hints[name], data[name], key)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise self.error(key, "is missing", fix=f"add `{name} = ...` under [{path}]" if path else None)
        return values
