"""Input formats: files and folders (jsonl, csv, parquet, json), Hugging Face datasets, OpenAI Batch files; a
shard's rows read and typed.
"""
