"""Tests of clink/cli and clink/tools: both command lines, the demo, projections and diff."""
