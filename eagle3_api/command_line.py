"""Command lines out of data: `flags({"--flag": value})` is argv in the dict's order.

A value of None or False leaves the flag out, True writes it bare (`--no-enable-prefix-caching`),
anything else is written with `str()`. Here, in the bottom package, so that the stage plan (which
the operator and `eagle3 pipeline` share) and the runtime build argv the same way.
"""

from __future__ import annotations

from collections.abc import Mapping


def flags(options: Mapping[str, object]) -> list[str]:
    argv: list[str] = []
    for flag, value in options.items():
        if value is None or value is False:
            continue
        argv += [flag] if value is True else [flag, str(value)]
    return argv
