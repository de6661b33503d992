"""The calibration fit recovers parameters from synthetic timings made with known values."""

import pytest

from gpu_harness.calibrate import fit

KV_TOKEN_BYTES = 256      # K+V bytes of one token on one layer


def point(kernel, batch, context, seconds, block_size=None, table=None):
    return {"kernel": kernel, "block_size": block_size, "table": table, "batch": batch, "context": context,
            "median_s": seconds}


def test_fit_recovers_known_rates_and_overheads():
    """Contiguous decode takes 10 us + KV bytes / 1e9 B/s; paged permuted tables take 1.5x (block 8),
    1.2x (16) and 1.1x (32) of that, sequential tables anything (ignored); store_kv 3 us + bytes / 5e8.
    The fit returns exactly those numbers (least squares on exact lines, geometric means of equal ratios)."""
    ms = []
    for batch, context in ((1, 16), (2, 48), (4, 512)):
        base = 1e-5 + batch * context * KV_TOKEN_BYTES / 1e9
        ms.append(point("contiguous_decode", batch, context, base))
        for bs, factor in ((8, 1.5), (16, 1.2), (32, 1.1)):
            ms.append(point("paged_decode", batch, context, factor * base, bs, "permuted"))
            ms.append(point("paged_decode", batch, context, 7 * base, bs, "sequential"))
    for tokens in (2, 16, 256):
        ms.append(point("store_kv", tokens, None, 3e-6 + tokens * KV_TOKEN_BYTES / 5e8, 16))
    got = fit(ms, KV_TOKEN_BYTES)
    assert got["decode_attn_fixed_s"] == pytest.approx(1e-5, rel=1e-6)
    assert got["decode_attn_bytes_per_s"] == pytest.approx(1e9, rel=1e-6)
    assert got["paged_overhead"] == {"8": pytest.approx(1.5), "16": pytest.approx(1.2), "32": pytest.approx(1.1)}
    assert got["store_kv_fixed_s"] == pytest.approx(3e-6, rel=1e-6)
    assert got["store_kv_bytes_per_s"] == pytest.approx(5e8, rel=1e-6)


def test_fit_through_the_origin_when_the_intercept_would_be_negative():
    """Times 0.5 ms and 1.5 ms for 1000 and 2000 tokens x 256 B give a line with a negative intercept;
    the fit then goes through the origin: rate = sum(x^2) / sum(xy) with x = 256e3, 512e3 bytes:
    (256e3^2 + 512e3^2) / (256e3 x 5e-4 + 512e3 x 1.5e-3) = 3.2768e11 / 896 = 365,714,285.7 B/s."""
    ms = [point("store_kv", 1000, None, 5e-4, 16), point("store_kv", 2000, None, 1.5e-3, 16)]
    for bs in (8, 16, 32):
        ms.append(point("paged_decode", 1, 16, 1.0, bs, "permuted"))
    ms.append(point("contiguous_decode", 1, 16, 1.0))
    got = fit(ms, 256)
    assert got["store_kv_fixed_s"] == 0.0
    assert got["store_kv_bytes_per_s"] == pytest.approx(365_714_285.7, rel=1e-9)
