"""MCMC samplers over network pytrees (samplers layer of ARCHITECTURE.md); its modules arrive with their issues."""
