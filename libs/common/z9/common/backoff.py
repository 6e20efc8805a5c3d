"""Retry delay (architecture §5).

``delay = min(cap, base · 2^(attempt-1)) · jitter`` with ``jitter`` uniform in
``[1 - j, 1 + j]``; defaults base 2 s, cap 300 s, j = 0.25. ``attempt`` is the attempt that just
failed, counted from 1.
"""
from __future__ import annotations

import random


def backoff_delay_s(
    attempt: int,
    *,
    base_s: float = 2.0,
    cap_s: float = 300.0,
    jitter: float = 0.25,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before the next attempt after attempt ``attempt`` (≥ 1) failed.

    Raises ``ValueError`` when ``attempt`` < 1 or ``jitter`` is outside ``[0, 1)``.
    """
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    if not 0 <= jitter < 1:
        raise ValueError("jitter must be in [0, 1)")
    exp = min(attempt - 1, 64)  # 2**64 · base is far past any cap; avoids float overflow
    raw = min(cap_s, base_s * (2.0 ** exp))
    r = (rng or random).uniform(1.0 - jitter, 1.0 + jitter)
    return raw * r
