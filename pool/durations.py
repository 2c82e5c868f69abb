"""The one duration syntax of every flag and policy file: '90', '90s', '15m', '2h', '7d'."""

from __future__ import annotations

import re

from snapshot.errors import InvalidArgumentError

_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '2h', '7d' as seconds; InvalidArgumentError naming the text otherwise."""
    m = _DURATION.match(str(text).strip())
    if not m:
        raise InvalidArgumentError(f"duration {text!r} must be a number with an optional unit s, m, h or d (e.g. 90s, 15m, 2h)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]
