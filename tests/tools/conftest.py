"""The sandbox backends each sandbox test runs on."""

from __future__ import annotations

import os

import pytest

from agentrft.tools import sandbox

# CI sets AGENTRFT_REQUIRE_SANDBOX=1 (scripts/test.sh installs bubblewrap there): a backend that is
# installed but does not start is then a failure, not a skip (a venv under /tmp once hid bwrap's python)
REQUIRE = bool(os.environ.get("AGENTRFT_REQUIRE_SANDBOX"))


@pytest.fixture(params=["bwrap", "unshare"])
def backend(request: pytest.FixtureRequest) -> str:
    why = sandbox.backend_problem(request.param)
    if why:
        if REQUIRE:
            pytest.fail(f"{request.param} is required here but not usable: {why}")
        pytest.skip(f"{request.param} is not usable here: {why}")
    return str(request.param)
