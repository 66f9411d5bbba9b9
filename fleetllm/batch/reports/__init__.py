"""Reports: progress and ETA, the run record (_SUCCESS), the run's series, estimates of time and cost.
"""
