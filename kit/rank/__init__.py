"""Rank side: the code that runs inside one worker process (`python -m kit.rank.worker`).

Never imports IPython, ipywidgets or matplotlib, nor anything under `kit.engine` / `kit.notebook`.
"""
