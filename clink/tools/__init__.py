"""Offline state tooling, usable without click: read any source (file, store, pool, HTTP), project, diff, verify and export state."""
