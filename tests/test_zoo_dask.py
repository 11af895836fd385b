"""``--executor dask://HOST:PORT`` on a local Dask cluster (skipped without ``nafix[dask]``)."""

from __future__ import annotations

import json

import pytest

from tests.test_zoo import run, zoo  # noqa: F401  (fixture)

distributed = pytest.importorskip("distributed")


@pytest.fixture
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as c:
        yield c


def test_dask_executor_gives_the_local_report(zoo, cluster, capsys):  # noqa: F811
    address = cluster.scheduler_address.replace("tcp://", "dask://")
    code, local, _ = run(["audit", zoo, "-f", "json", "--no-cache"], capsys)
    code_d, remote, err = run(["audit", zoo, "-f", "json", "--no-cache", "--executor", address], capsys)
    assert code == code_d == 2  # the broken model, in both
    assert json.loads(remote) == json.loads(local)


def test_unreachable_or_malformed_executor_is_one_error_line(zoo, capsys):  # noqa: F811
    code, out, err = run(["audit", zoo, "--executor", "tcp://x"], capsys)
    assert code == 2 and err.startswith("error: --executor 'tcp://x' is not dask://HOST:PORT") and len(err.splitlines()) == 1
