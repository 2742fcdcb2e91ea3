"""Parallelism strategies, one small file each (picotron's style: the hand-written version beside
torch's API, both checked against one process)."""
