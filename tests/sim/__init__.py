"""The deterministic simulation of the commit protocol: one seeded scheduler, in-memory store with faults, a model."""
