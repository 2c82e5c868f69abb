"""The clink command lines (`clink`, `clink-pool`) and the offline state tooling; the worker side is `client`, the server `pool`."""
