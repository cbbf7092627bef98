"""The root side never imports torch (nor NVRx, which imports it): the prolog, the epilog, the
HealthCheckProgram and the node watcher, each imported and then run for real (as slurmd or
the watcher's service starts it: root, a bare environment, ``python -I``) on a simulated node,
healthy and with a GPU fallen off the bus, in a process where torch cannot be imported.

A finder first on ``sys.meta_path`` records every attempt to import one of them and refuses it,
so an import that a ``try``/``except ImportError`` would hide is caught too; ``sys.modules`` is
checked after the import and after the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from resilient_slurm import verdict_file
from resilient_slurm_lab.hardware.simulate import install_scenario

from .conftest import hook_config

FORBIDDEN = ("torch", "nvidia_resiliency_ext")
# The product's entry points, as a production node's shims run them: they never load the lab.
PRODUCT = {
    "prolog": ("resilient_slurm.prolog.hook", "prolog_main", ()),
    "epilog": ("resilient_slurm.epilog.hook", "epilog_main", ()),
    "health": ("resilient_slurm.hooks.health", "health_main", ()),
    "watch": ("resilient_slurm.hooks.watch", "watch_main", ("--ticks", "1")),
}
# The same hooks on simulated nodes, through the lab's wrappers (the sandbox's shims).
LAB = "resilient_slurm_lab.hardware.hooks"
ENTRY = {name: (LAB, func, args) for name, (_, func, args) in PRODUCT.items()}

PROBE = """
import importlib.abc, json, sys
FORBIDDEN = {forbidden!r}
tried = []
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            tried.append(name)
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused by the test)")
        return None
sys.meta_path.insert(0, Refuse())
def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)
from {module} import {func}
after_import = (list(tried), loaded())
try:
    rc = {func}(["--config", {config!r}, *{args!r}])
except SystemExit as exc:
    rc = exc.code
print("PROBE " + json.dumps({{"rc": rc, "import": after_import, "tried": tried,
                              "loaded": loaded()}}))
"""


def probe(entry: str, config: str, entries: dict = ENTRY,
          forbidden: tuple[str, ...] = FORBIDDEN) -> dict:
    module, func, args = entries[entry]
    code = PROBE.format(forbidden=forbidden, module=module, func=func, config=config, args=args)
    env = {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "42", "SLURM_JOB_UID": "0",
           "SLURM_JOB_USER": "root", "SLURM_NODELIST": "n1"}
    done = subprocess.run([sys.executable, "-I", "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd="/")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    result: dict = json.loads(lines[-1][len("PROBE "):])
    result["stderr"] = done.stderr[-2000:]
    return result


@pytest.mark.parametrize("entry", sorted(ENTRY))
@pytest.mark.parametrize("scenario", ["clear", "xid79"])
def test_the_hooks_never_import_torch(tmp_path, entry: str, scenario: str) -> None:
    config = hook_config(tmp_path, verdicts=True)
    install_scenario(str(tmp_path / "root" / "nodes" / "n1"), scenario)
    got = probe(entry, config)
    assert got["import"] == [[], []], f"importing {entry}: {got}"
    assert got["tried"] == [] and got["loaded"] == [], f"running {entry}: {got}"
    # a real run: what each publishes (the watcher publishes failures only, and keeps running)
    published = verdict_file.read(str(tmp_path / "root" / "verdicts" / "n1.json"))
    status = published.status if published else None
    if scenario == "clear":
        assert got["rc"] == 0 and status == (None if entry == "watch" else "ok"), got
    else:
        assert status == "fail", got
        assert got["rc"] != 0 or entry == "watch", got


@pytest.mark.parametrize("entry", sorted(PRODUCT))
def test_the_products_hooks_never_load_the_lab(tmp_path, entry: str) -> None:
    """Root-safety: the installed hooks check this machine and never import the lab (its
    simulated hardware), nor torch, on a node where both are installed."""
    config = hook_config(tmp_path, verdicts=True)
    got = probe(entry, config, PRODUCT, (*FORBIDDEN, "resilient_slurm_lab"))
    assert got["import"] == [[], []], f"importing {entry}: {got}"
    assert got["tried"] == [] and got["loaded"] == [], f"running {entry}: {got}"
