"""engine (in progress)."""
