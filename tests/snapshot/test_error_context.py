"""Errors given context on the way up keep their class and attributes (a checksum error its path, a restore its missing uids)."""

from __future__ import annotations

import pytest

from client.errors import MissingOperatorsError
from snapshot.errors import ChecksumMismatchError, NotFoundError, prefixed


@pytest.mark.parametrize(
    ("exc", "attrs"),
    [
        (ChecksumMismatchError("jobs/j/data/x.arrow", "sha256 aa", "sha256 bb"), {"path": "jobs/j/data/x.arrow", "expected": "sha256 aa"}),
        (MissingOperatorsError(7, {"orders-agg": 12}), {"checkpoint_id": 7, "missing": {"orders-agg": 12}}),
        (NotFoundError("job j not found"), {}),
    ],
)
def test_prefixed_keeps_class_and_attributes(exc, attrs) -> None:
    out = prefixed(exc, "checkpoint 7 of job 'j' in file:///s")
    assert type(out) is type(exc) and str(out) == f"checkpoint 7 of job 'j' in file:///s: {exc}"
    assert {k: getattr(out, k) for k in attrs} == attrs
    assert prefixed(out, "checkpoint 7 of job 'j' in file:///s") is out  # said once


def test_a_source_error_names_the_source_and_keeps_the_checksum_path(tmp_path) -> None:
    from clink.tools.sources import _with_prefix

    err = _with_prefix(ChecksumMismatchError("data/x.arrow", "crc32 1", "crc32 2"), "savepoint 'rel' in file:///s")
    assert isinstance(err, ChecksumMismatchError) and err.path == "data/x.arrow" and str(err).startswith("savepoint 'rel'")
