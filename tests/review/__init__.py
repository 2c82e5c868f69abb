"""Repros of what the adversarial review of the commit protocol found; each prints ``ok`` (or ``held``) once fixed."""
