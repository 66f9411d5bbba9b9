"""Output folders and commits: paths through fsspec, shards assembled and committed exactly once, data file
writers, the folder's lock, --retry-errors.
"""
