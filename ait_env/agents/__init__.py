"""Agents that act in ``JobWritingEnv`` through its public text API."""
