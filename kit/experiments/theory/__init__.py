"""Theory: the formulas (memory, time, collectives) as pure Python. Never imports torch."""
