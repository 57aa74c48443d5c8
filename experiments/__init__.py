"""commgym.experiments: command line, benchmarks, tracking and reports."""
