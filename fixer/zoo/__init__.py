"""Many-model work for ``nafix audit``: parallel workers, a content-addressed cache, baselines,
shards and their merge, and the zoo summary.

Everything here works on *report rows*: the JSON-able dict of one model that ``nafix audit
--format json`` prints (``fixer.report_data.analysis_dict`` plus ``path``, ``error`` and ``sha256``).
A row is what a worker process returns, what the cache stores, what a shard report holds and what
every renderer reads, so all formats carry the same facts and nothing heavy crosses a process
boundary.
"""

from __future__ import annotations

from .runner import ZooOptions, audit_rows, build_report  # noqa: F401
