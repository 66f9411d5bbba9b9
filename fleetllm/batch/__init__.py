"""Batch inference on Ray Data: shards, engine stages, commits, progress, reports."""
