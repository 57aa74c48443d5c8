"""commgym.agents: agents that choose communication configurations (not built yet)."""
