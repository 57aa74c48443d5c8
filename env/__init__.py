"""commgym.env: the gymnasium environment over real all-reduce training runs (not built yet)."""
