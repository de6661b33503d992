"""Reports a reader can put in a design doc: the document (Markdown + HTML), the builder,
figures, metric labels, provenance and the memory ledger.

May import the engine, the fleet, `kvsim.planning.runs`, sweep and rate; never the CLI.
"""
