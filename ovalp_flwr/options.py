"""What every concern's `options.py` is built from: a key's field, `ConfigError`, the checks.

A concern's options are one frozen dataclass of its knobs (an `Options` group), beside the code
that reads them: each field says its default and its one-line docs (`key`), `check` holds the
group's own rules and `requires` its rules against other groups. `config.py` composes
the groups; docs/config.md is generated from them, one section a group. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

# what validation allows: the tuple it checks against, or a function that renders the names a
# registry knows as Markdown
Choices = tuple[str, ...] | Callable[[], str]
# the whole run config a group's `requires` reads (config.py composes the groups: it is not
# imported here, so no group depends on the module that composes them)
Whole = Any


class ConfigError(ValueError):
    """A run-config value that is not allowed; the message is one self-contained line."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"run config: {key}={value!r} is not allowed; {allowed}")
        self.key, self.value, self.allowed = key, value, allowed


def key(default: Any, doc: str, allowed: Choices | None = None) -> Any:
    """A run-config key's field: its default (pyproject's must equal it), its description in
    docs/config.md, and the values validation allows where it lists them (the very tuple it
    checks against, or a function naming them). Its key is the field's name in dash-case."""
    return dataclasses.field(default=default, metadata={"doc": doc, "allowed": allowed})


class Options:
    """One concern's knobs (subclasses are frozen dataclasses). `TITLE` and `INTRO` head its
    section of docs/config.md."""

    TITLE: ClassVar[str] = ""
    INTRO: ClassVar[str] = ""

    def check(self) -> None:
        """The group's own rules: each key's range or choices, and how its keys combine."""

    def requires(self, config: Whole) -> None:
        """The group's rules against other groups' keys (`config`: the whole run config)."""

    @classmethod
    def key_fields(cls) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(cls)  # type: ignore[arg-type]


def dash(name: str) -> str:
    """A field's run-config key: `dp_clip` -> `dp-clip`."""
    return name.replace("_", "-")


def one_of(key_name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(key_name, value, f"choose one of: {', '.join(allowed)}")


def at_least(key_name: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(key_name, value, f"use an integer >= {minimum}")


def positive(key_name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(key_name, value, "use a value > 0")


def must_be(config: Whole, needs: dict[str, tuple[Any, str]], why: str) -> None:
    """Each `key: (allowed value, what to say)` of `needs` holds in `config`, else the first
    that does not is the error, ending in `why`."""
    for name, (allowed, say) in needs.items():
        value = getattr(config, name.replace("-", "_"))
        if value != allowed:
            raise ConfigError(name, value, f"{why} use {say}")


def plain_name(key_name: str, name: str) -> None:
    """A name that becomes a path component: no `/`, no leading `.`."""
    if "/" in name or name.startswith("."):
        raise ConfigError(key_name, name, "use a plain name without '/' or a leading '.'")


def share(key_name: str, value: float, low: float, high: float, *, low_open: bool = False,
          high_open: bool = False, what: str = "a share") -> None:
    """`value` in the interval [low, high], each end open where asked."""
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ConfigError(key_name, value, f"use {what} in {interval}")


def coerce(key_name: str, value: Any, type_name: Any) -> Any:
    """Flower's TOML values arrive typed, but `--run-config` ints may stand for floats."""
    kind = type_name if isinstance(type_name, str) else type_name.__name__
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "float | str" and isinstance(value, str):  # a number, or a word such as "auto"
        return value
    if kind == "float | str":
        return coerce(key_name, value, "float")
    raise ConfigError(key_name, value, f"expected a value of type {kind}")
