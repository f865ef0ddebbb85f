"""The run's judgements: SLOs, the verdict and its trust in the client's own measurement, recipes, the protected class, repeated runs' intervals."""
