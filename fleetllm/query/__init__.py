"""ai_query: datasets against OpenAI-compatible endpoints with AIMD concurrency."""
