"""emulator (in progress)."""
