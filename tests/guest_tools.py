"""The real tools that judge what z9 ships into load balancer guests (Debian's haproxy and
keepalived; ``unshare`` and ``ip`` put keepalived in a namespace holding the appliance's interfaces).
A test that needs them is skipped without them, and fails instead under ``Z9_REQUIRE_GUEST_TOOLS=1``
(``.ci/run`` installs them and sets it)."""
from __future__ import annotations

import os

import pytest

from z9.sim.appliance import run_tool, tools_missing


def require_guest_tools() -> None:
    missing = tools_missing()
    if not missing:
        code, _, err = run_tool("keepalived", ["-v"], "", b"", [])  # the namespace works here too
        if code != 0:
            missing = [f"an unprivileged network namespace (unshare -rn: {err.strip()[:200]})"]
    if missing:
        msg = f"the real guest tools are missing on this host: {', '.join(missing)}"
        if os.environ.get("Z9_REQUIRE_GUEST_TOOLS") == "1":
            pytest.fail(msg + "; Z9_REQUIRE_GUEST_TOOLS=1 requires them")
        pytest.skip(msg)
