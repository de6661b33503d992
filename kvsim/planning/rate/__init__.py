"""The highest request rate under a latency SLO and the GPUs that serve a rate, for one
engine or a fleet: bounds, the bracket, the runs and the searches.

May import the engine, the fleet, `kvsim.planning.runs` and `kvsim.planning.sweep.runner`; nothing imports
it from below planning.
"""
