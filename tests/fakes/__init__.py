"""Test doubles shared by the test suite and benchmarks (scripted OpenAI-compatible server, ...)."""
