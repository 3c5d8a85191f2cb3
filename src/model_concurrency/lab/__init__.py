"""lab (in progress)."""
