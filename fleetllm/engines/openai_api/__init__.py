"""The OpenAI wire format, in one place: what serving answers, what an OpenAI Batch file holds, and the
shapes both share.

    protocol.py     chat / completions requests (typed, validated), responses and stream chunks, model cards,
                    errors (APIError: status, type, param) and pydantic errors worded as OpenAI words them
    embeddings.py   /v1/embeddings requests and responses (float or base64 vectors)
    logprobs.py     logprobs objects of chat and completions choices
    batch_lines.py  Batch API lines: the urls, a line's body -> sampling, embeddings inputs, output lines

Used by serving (fleetllm.serve), Batch files (fleetllm.batch.inputs.openai_batch) and the Batch API routes; it
sits in engines/ so the engines' request-field table (fleetllm.engines.fields) checks every body field in
one place. Imports nothing of batch, serve, query or cluster.
"""
