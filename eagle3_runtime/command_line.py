"""Command lines as data, both ways.

Out: `flags({"--flag": value})` is argv in the dict's order; a value of None leaves the flag
out, True writes it bare (`--no-enable-prefix-caching`), anything else is written with `str()`.
In: `config_from_args(Config, args)` is a stage's config dataclass from its parsed flags, one
field per flag of the same name (`overrides` replace a flag's value as parsed, e.g. by a pinned
target's local path).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import fields
from typing import TypeVar

Config = TypeVar("Config")


def flags(options: Mapping[str, object]) -> list[str]:
    argv: list[str] = []
    for flag, value in options.items():
        if value is None or value is False:
            continue
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def config_from_args(config_type: type[Config], args: argparse.Namespace, **overrides: object) -> Config:
    return config_type(**{f.name: overrides.get(f.name, getattr(args, f.name)) for f in fields(config_type)})
