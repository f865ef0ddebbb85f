"""The numbers: exact histograms, the run's mergeable stats, SLOs, outages and the client's health."""
