"""Command lines built as data: `{"--flag": value}` in, argv out, in the dict's order.

A value of None leaves the flag out, True writes it bare (`--no-enable-prefix-caching`),
anything else is written with `str()`.
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
