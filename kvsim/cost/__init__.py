"""Time: the kernel step time of a batch (`roofline`, or a measured `calibration` file), the engine
profiles (what the serving engine adds: step policy and CPU time), the paged kernel families
(`kernels`: accepted block sizes, cost per block size) and the profiles' fit to measured steps
(`profile_fit`). Imports `kvsim.specs` and `kvsim.files`; never the allocators or the engine.
"""
