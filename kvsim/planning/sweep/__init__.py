"""Grids of runs over any run flag, on local worker processes or Ray, into one table: the
grid, a point, the store, the backends, and the latency ceiling that stops a hopeless point.

May import the engine, the fleet and `kvsim.planning.runs`; never the rate search, reports or paper.
"""
