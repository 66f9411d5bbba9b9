"""Engine openai: rows sent to an OpenAI-compatible endpoint.

engine.py (the Engine: settings, request arguments, results), client.py (the HTTP client: the official
openai client, retries with backoff), aimd.py (the adaptive concurrency window).
"""
