"""Level 0 never interrupts a module import (training/import_guard.py).

Two local ranks under ``inprocess.run`` with the store hosted here: rank 1 fails while rank 0
is inside a slow first import of a package (as a rank imports ``torch._dynamo`` on its first
FSDP build). The restart must wait for the import: the package's body runs once, to its end,
and the second iteration finds it whole. Interrupted instead, a package is left half imported
for the life of the process (with torch: every later iteration fails on ``torch._dynamo`` and
level 0 spends all its restarts, seen under load in
test_inprocess_spares.py::test_sigkill_taken_by_the_standby_with_the_world_unchanged).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.train

pytest.importorskip("torch")
pytest.importorskip("nvidia_resiliency_ext.inprocess")

from tests.training.inprocess_harness import SHORT_TIMEOUTS  # noqa: E402

IMPORT_S = 8.0  # the import's length: well past the monitor thread's 1 s poll, under load too

PACKAGE = f'''
import os, time
from pathlib import Path

work = Path(os.environ["IMPORT_TEST_DIR"])
with open(work / "slowpkg.log", "a") as fh:
    fh.write("start\\n")
(work / "import-started").touch()
from . import part  # a submodule, bound to this package object
deadline = time.monotonic() + {IMPORT_S}
while time.monotonic() < deadline:
    time.sleep(0.01)
DONE = part.VALUE
with open(work / "slowpkg.log", "a") as fh:
    fh.write("end\\n")
'''

WORKER = '''
import os, sys, time
from pathlib import Path

from resilient_slurm.training import inprocess

work = Path(os.environ["IMPORT_TEST_DIR"])
rank = int(os.environ["RANK"])


def train(ctx):
    with open(work / f"rank{rank}.log", "a") as fh:
        fh.write(f"iteration {ctx.iteration}\\n")
    if ctx.iteration == 0 and rank == 1:
        while not (work / "import-started").exists():
            time.sleep(0.05)
        time.sleep(0.5)
        raise RuntimeError("a fault on rank 1 while rank 0 imports")
    if rank == 0:
        import slowpkg
        assert slowpkg.DONE == 42
    if ctx.iteration == 0:
        while True:  # training on, until the restart reaches this rank
            time.sleep(0.1)
    return "done"


result = inprocess.run(train, inprocess.InprocessSettings.from_env())
print(f"result {result}", flush=True)
'''


def test_a_restart_waits_for_a_first_import(tmp_path: Path) -> None:
    from resilient_slurm.training.store_host import serve

    pkg = tmp_path / "site" / "slowpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(PACKAGE)
    (pkg / "part.py").write_text("VALUE = 42\n")
    (tmp_path / "worker.py").write_text(WORKER)
    store = serve("127.0.0.1", 0)
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
               "RESILIENT_INPROCESS_STORE": f"127.0.0.1:{store.port}",
               "RESILIENT_NODE": f"n{rank}", "IMPORT_TEST_DIR": str(tmp_path),
               "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"),
                                              os.environ.get("PYTHONPATH", "")]),
               "PYTHONUNBUFFERED": "1", "RESILIENT_INPROCESS_TRACE": "1", **SHORT_TIMEOUTS}
        env.pop("RESILIENT_INPROCESS_PREFIX", None)
        procs.append(subprocess.Popen([sys.executable, str(tmp_path / "worker.py")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0])
    del store
    report = "\n".join(f"--- rank{i} (exit {p.returncode})\n{o[-3000:]}"
                       for i, (p, o) in enumerate(zip(procs, outs, strict=True)))
    assert [p.returncode for p in procs] == [0, 0], report
    assert (tmp_path / "rank0.log").read_text() == "iteration 0\niteration 1\n", report
    # one import, run to its end before the restart reached the rank
    assert (tmp_path / "slowpkg.log").read_text() == "start\nend\n", report
    assert all("result done" in o for o in outs), report
