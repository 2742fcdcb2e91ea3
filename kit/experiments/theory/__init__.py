"""Theory: formulas and the predictor. Pure Python, NO torch import, ever (tests/test_layering.py checks it,
directly and transitively): the kernel predicts without starting a rank."""
