"""Finite Bayesian networks built from smnngp.stax specs (ARCHITECTURE.md); modules arrive with their issues."""
