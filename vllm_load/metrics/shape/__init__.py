"""The run's shape beyond its totals: curves over time, the plateau and the knee, the load delivered against the load asked, prefix reuse, the latency breakdown."""
