"""Test tools shipped with fleetllm: tiny random-weight models and test servers."""
