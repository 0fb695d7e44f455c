"""Peer timings from docs/anchors-h200.md, printed beside ours as "anchor" columns.

Source: docs/anchors-h200.md ("What the project must beat: peers measured on our
H200"): one NVIDIA H200, driver 580, torch 2.11.0+cu130, triton 3.6, measured 2026-11-29,
median of 50 event-timed calls, FlashKDA's own benchmark inputs, fp32 states, K = V = 128.
These numbers were NOT measured by this run; they are constants kept for comparison.
"""

from __future__ import annotations

#: Where the anchor constants come from (printed in every report).
ANCHOR_SOURCE = "docs/anchors-h200.md (H200, measured 2026-11-29; not this run)"

#: Device-to-device copy bandwidth (read + write) the anchors' HBM floors used, bytes/s.
ANCHOR_COPY_BANDWIDTH = 4.27e12

#: case name -> (FlashKDA ms, fla chunk_kda Triton ms, HBM floor ms), all from anchors-h200.md.
ANCHORS_MS: dict[str, tuple[float, float, float]] = {
    "h96_fixed_8192": (1.464, 2.659, 0.239),
    "h96_mixed_varlen": (1.392, 2.660, 0.254),
    "h96_uniform_1024x8": (1.196, 2.630, 0.259),
    "h64_fixed_8192": (1.261, 1.769, 0.159),
    "h64_mixed_varlen": (1.026, 1.807, 0.169),
    "h64_uniform_1024x8": (0.812, 1.810, 0.173),
    "h32_fixed_8192": (1.060, 1.201, 0.080),
    "h16_fixed_8192": (0.942, 1.180, 0.040),
    "h8_fixed_32768": (3.449, 1.995, 0.079),
    "h4_fixed_65536": (6.638, 2.162, 0.079),
    "h4_fixed_1024": (0.128, 1.682, 0.0014),
    "h96_fixed_512": (0.129, 1.680, 0.018),
    "h32_batch16_2048": (1.545, 3.762, 0.330),
}


def anchor_for(name: str) -> dict | None:
    """Anchor figures for a standard case name, or None for a custom case.

    Returns a dict {"flash_kda_ms", "fla_ms", "floor_ms"} (milliseconds, from anchors-h200.md).
    """
    row = ANCHORS_MS.get(name)
    if row is None:
        return None
    return {"flash_kda_ms": row[0], "fla_ms": row[1], "floor_ms": row[2]}
