"""Watched during a run: outages, saturation, and the fault plan's actions on the run's clock."""
