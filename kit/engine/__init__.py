"""Kernel side: the engine that starts ranks, talks to them and waits on them.

Runs in the Jupyter kernel (or a plain script). Never imports torch, IPython or anything under
`kit.rank` / `kit.notebook`; data flows config -> cluster -> launcher/io/watch -> CellResult.
"""
