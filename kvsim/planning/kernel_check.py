"""Block sizes a grid asks for that the engine's paged-attention kernel cannot run (`kvsim sweep`,
`kvsim report`; `kvsim tune-block-size` warns the same way): the run simulates them anyway, and the
reader is told."""

from __future__ import annotations

from kvsim.cost.kernels import get_kernel
from kvsim.cost.profiles import DEFAULT_PROFILE, get_profile


def kernel_warnings(block_sizes, engine_profiles=(None,)) -> list[str]:
    """One warning per (block size, engine profile) of a grid whose kernel cannot run that size (as
    `kvsim tune-block-size` warns): `block_sizes` and `engine_profiles` as a sweep lists them (None: the
    default). Sizes the kernel runs, and unknown names (the run reports those), give none."""
    out = []
    for name in dict.fromkeys(engine_profiles):
        try:
            profile = get_profile(name if name is not None else DEFAULT_PROFILE)
            kernel = get_kernel(profile.kernel)
        except (ValueError, KeyError, TypeError):
            continue
        for b in dict.fromkeys(block_sizes):
            if isinstance(b, int) and b >= 1 and not kernel.accepts(b):
                out.append(f"block size {b}: the {kernel.name} kernel ({profile.name}) does not run it (it runs "
                           f"{kernel.accepted_text()}); simulated anyway")
    return out
