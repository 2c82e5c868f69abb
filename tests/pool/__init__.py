"""Tests of pool/: the core, lifecycle, gRPC server, HTTP export, budget, auth and access checks."""
