"""Tests of store/: the object stores, their contract and retries, the checkpoint layout."""
