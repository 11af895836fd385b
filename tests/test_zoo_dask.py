"""``--executor dask://HOST:PORT`` on a local Dask cluster started by the test (``distributed`` is in the
test extra; skipped only when it is missing), with the per-model timeout of the process pool."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_zoo import run, zoo  # noqa: F401  (fixture)

distributed = pytest.importorskip("distributed")
SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes on this machine (one cluster for the module: starting one takes seconds
    under load); generous timeouts, as CI machines may be busy."""
    import dask

    with dask.config.set({"distributed.comm.timeouts.connect": "120s", "distributed.comm.timeouts.tcp": "120s"}):
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                      host="127.0.0.1", silence_logs=50) as c:
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


def test_dask_executor_bounds_each_model_like_the_pool(tmp_path, cluster):
    """--timeout applies per model on the cluster: a model over it becomes an error row with the pool's
    sentence and the others are unaffected (a limit no analysis can meet makes the case certain)."""
    from fixer.options import AnalysisOptions
    from fixer.zoo import ZooOptions, audit_rows

    models = tmp_path / "m"
    models.mkdir()
    for name in ("classifier_softmax.onnx", "movenet_like.onnx"):
        shutil.copy(SAMPLES / name, models / name)
    address = cluster.scheduler_address.replace("tcp://", "dask://")
    rows, _ = audit_rows([models], AnalysisOptions(), ZooOptions(use_cache=False, executor=address, timeout=0.001))
    assert len(rows) == 2
    for row in rows:
        assert row["error"] == (f"{row['path']}: the analysis took longer than the per-model timeout of 0.001 s "
                                "(--timeout).")
    rows, _ = audit_rows([models], AnalysisOptions(), ZooOptions(use_cache=False, executor=address, timeout=300))
    local, _ = audit_rows([models], AnalysisOptions(), ZooOptions(use_cache=False, jobs=1, timeout=300))
    assert rows == local and not any(r["error"] for r in rows)
