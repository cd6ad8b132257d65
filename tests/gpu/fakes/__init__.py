"""Fakes of prime-rl v0.7.0 and vLLM 0.24.0 that follow the contracts read in their source."""
