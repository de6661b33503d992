"""An inference-perf report folder read as a measured run (`folder`), with the block-style YAML reader its
`config.yaml` needs (`yaml_subset`). Imports `kvsim.files` and `kvsim.validation.run`; the run readers
(`kvsim.validation.measured`) import it.
"""
