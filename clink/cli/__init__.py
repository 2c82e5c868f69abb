"""The two command lines: `clink` (state.py: inspect and move state) and `clink-pool` (pool.py: serve and run a pool)."""
