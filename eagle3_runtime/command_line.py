"""Command lines as data, both ways.

Out: `flags({"--flag": value})` is argv in the dict's order (eagle3_api.command_line's, re-exported
here for the runtime; None or False leaves a flag out, True writes it bare).
In: `config_from_args(Config, args)` is a stage's config dataclass from its parsed flags, one
field per flag of the same name (`overrides` replace a flag's value as parsed, e.g. by a pinned
target's local path).
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import TypeVar

from eagle3_api.command_line import flags

__all__ = ["config_from_args", "flags"]

Config = TypeVar("Config")


def config_from_args(config_type: type[Config], args: argparse.Namespace, **overrides: object) -> Config:
    return config_type(**{f.name: overrides.get(f.name, getattr(args, f.name)) for f in fields(config_type)})
