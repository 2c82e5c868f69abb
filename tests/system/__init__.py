"""Whole processes under hostile conditions: crashes, abusive clients, fuzzed input, several pool processes on one bucket."""
