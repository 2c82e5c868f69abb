"""Tests of snapshot/: the format, its reader checks, vectors and errors."""
