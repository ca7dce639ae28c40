"""What every package shares: the process group and device of a rank, and one-writer folder
locks. Imports nothing else from the project."""
