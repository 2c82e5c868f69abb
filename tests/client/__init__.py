"""Tests of client/: RemoteReadBackend and PoolClient against a real pool, and the pieces that need none."""
