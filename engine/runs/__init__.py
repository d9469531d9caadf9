"""Running the optimizer for real: run settings, executing and resuming a run, forks, and
progress reporting."""
