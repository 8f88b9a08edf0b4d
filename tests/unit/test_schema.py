"""kforge.config.schema: a TOML table read into a dataclass by its fields (keys, types, key paths, did-you-mean)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import pytest

from kforge.config.schema import ArchNumber, EnvValue, Reader
from kforge.errors import ConfigError


@dataclass(frozen=True)
class Inner:
    name: str
    count: int = 1


@dataclass(frozen=True)
class Outer:
    inner: Inner
    tags: tuple[str, ...] = ()
    only: tuple[ArchNumber, ...] | None = None
    env: Mapping[str, EnvValue] = field(default_factory=lambda: MappingProxyType({}))
    flag: bool = False
    items: tuple[Inner, ...] = ()


def read(data: dict) -> Outer:
    return Reader(Path("forge.toml")).table(Outer, data, "top")


def error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        read(data)
    return info.value.render()


def test_reads_nested_tables_lists_and_env() -> None:
    out = read({"inner": {"name": "x"}, "tags": "one", "only": [90, 120], "env": {"A": " 1  2 ", "B": True, "C": 3},
                "items": [{"name": "a", "count": 2}]})
    assert out.inner == Inner("x", 1) and out.tags == ("one",) and out.only == (90, 120)  # a string is a 1-list
    assert dict(out.env) == {"A": "1 2", "B": "1", "C": "3"} and out.items == (Inner("a", 2),)
    assert out.flag is False and isinstance(out.env, MappingProxyType)


@pytest.mark.parametrize(("data", "needle"), [
    ({"inner": {"name": "x"}, "tgas": []}, "top.tgas is not a known key (did you mean 'tags'?)"),
    ({}, "top.inner is missing"),
    ({"inner": {"name": "x", "count": True}}, "top.inner.count must be an integer, not boolean"),
    ({"inner": {"name": 3}}, "top.inner.name must be a string, not integer (3)"),
    ({"inner": {"name": "x"}, "only": ["120"]}, "top.only[0] must be an arch number such as 120, not string ('120')"),
    ({"inner": {"name": "x"}, "env": {"A": [1]}}, "top.env.A must be a string, not array"),
    ({"inner": {"name": "x"}, "items": [{"name": "a", "cuont": 1}]}, "top.items[0].cuont is not a known key (did you mean 'count'?)"),
    ({"inner": "x"}, "top.inner must be a table, not string"),
    ({"inner": {"name": "x"}, "flag": "yes"}, "top.flag must be a boolean, not string ('yes')"),
])
def test_errors_name_the_key_path(data: dict, needle: str) -> None:
    text = error(data)
    assert needle in text and "forge.toml" in text
