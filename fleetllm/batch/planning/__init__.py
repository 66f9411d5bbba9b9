"""Planning: the pure plan (engine, replicas, shards, fingerprint, what is committed), the checks that refuse a
job before any model loads, and prepare (the folder's records).
"""
