"""Execution: the job's stages, defined once (pipeline), run on Ray Data (stream) or in this process (local_run);
the engine pool and its stages.
"""
