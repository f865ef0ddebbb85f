"""What a run is, read and checked before it starts: the options, the targets and their checks, the plan every process runs, the servers the run starts beside it."""
