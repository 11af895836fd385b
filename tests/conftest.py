"""Suite-wide fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_audit_cache(tmp_path_factory, monkeypatch):
    """Every test (and every nafix process it starts) uses a fresh audit cache folder: the suite
    never writes to the user's cache and no test sees another's results."""
    monkeypatch.setenv("NAFIX_CACHE_DIR", str(tmp_path_factory.mktemp("nafix-cache")))
