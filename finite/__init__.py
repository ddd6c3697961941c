"""Finite Bayesian networks built from smnngp.stax specs (finite layer of ARCHITECTURE.md); its modules arrive with their issues."""
