"""The selectors people type to pick part of a state (checkpoint, key groups, operators), parsed one way for the CLI and the HTTP export."""

from __future__ import annotations

import re

from snapshot.errors import InvalidArgumentError
from snapshot.keys import NUM_KEY_GROUPS, operator_id

KeyGroups = tuple[int, int]

LATEST_CHECKPOINT = 0  # the checkpoint selector of the newest complete checkpoint

_KEY_GROUPS = re.compile(r"\s*(\d{1,19})\s*(?:-\s*(\d{1,19})\s*)?")  # bounded: int() refuses 4300+ digits
_CHECKPOINT_ID = re.compile(r"[0-9]{1,19}")
_U64 = 1 << 64


def parse_key_groups(text: str, name: str = "key groups") -> KeyGroups:
    """'LO-HI' (inclusive) or a single 'N' to a key-group range within 0..127; ``name`` is what messages call the value."""
    m = _KEY_GROUPS.fullmatch(text or "")
    if not m:
        raise InvalidArgumentError(f"{name} {text[:40]!r} must be LO-HI (for example 0-63) or a single key group")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) is not None else lo
    if not 0 <= lo <= hi < NUM_KEY_GROUPS:
        raise InvalidArgumentError(f"{name} {text!r} must satisfy 0 <= LO <= HI <= {NUM_KEY_GROUPS - 1}")
    return lo, hi


def parse_op(text: str, name: str = "operator") -> int:
    """An operator given as a decimal or 0x-hex op_id, or as 'uid:NAME' (op_id derived from the uid)."""
    text = text.strip()
    if text.startswith("uid:"):
        return operator_id(text[4:])
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text, 10)
    except ValueError:
        raise InvalidArgumentError(f"{name} {text!r} must be an op_id (decimal or 0x-hex) or uid:NAME") from None
    if not 0 <= value < _U64:
        raise InvalidArgumentError(f"{name} {text!r} is outside uint64")
    return value


def parse_checkpoint(text: str | None, name: str = "checkpoint") -> int:
    """A checkpoint id; 0, 'latest', '' or None is LATEST_CHECKPOINT (the newest complete one)."""
    if text is None or text.strip() in ("", "latest"):
        return LATEST_CHECKPOINT
    text = text.strip()
    if not _CHECKPOINT_ID.fullmatch(text) or int(text) >= 1 << 63:
        raise InvalidArgumentError(f"{name} {text!r} must be a checkpoint id, or 0 or 'latest' for the newest complete one")
    return int(text)
