"""The commit protocol across packages: defect regressions, properties, mutants, the simulation, random histories, review findings."""
