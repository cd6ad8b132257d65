"""Research tools of ai-trains-ai: model analyses and recipe labs, not part of the library (not installed).

Run them from the repository root as ``python -m research.<tool>``; research/README.md lists them.
"""
