"""What each process does in a run, and the run's life: start, shapes and steps, the collector of the numbers, the end and its reports, interruptions."""
