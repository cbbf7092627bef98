"""A real Prometheus beside the sandbox (``sandbox up --metrics``), and for the tests.

Debian's ``prometheus-node-exporter``, one per textfile directory (each simulated node's
directory, where its hooks write ``metrics.prom``; the jobs' directory on the batch host),
with only the textfile collector on; Debian's ``prometheus`` scraping them all every
``scrape_s`` and evaluating ``prometheus/rules.yml`` as often. Ports are asked of the kernel;
everything lives under ``root`` (config, data, logs). :func:`query` and :func:`alerts` read the
HTTP API. Nothing here is product code: it is the lab's stand-in for a site's monitoring.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The checkout this lab runs from (lab/resilient_slurm_lab/sandbox/prom.py: four folders up).
REPO = str(Path(os.path.realpath(__file__)).parents[3])
RULES = os.path.join(REPO, "prometheus", "rules.yml")
PROGRAMS = {"prometheus": "prometheus", "node_exporter": "prometheus-node-exporter"}
INSTALL = "apt-get install -y --no-install-recommends prometheus prometheus-node-exporter"


class PromError(RuntimeError):
    """Prometheus or node_exporter is missing, did not start, or did not answer."""


@dataclass
class Stack:
    root: str
    port: int  # Prometheus's
    exporters: dict[str, int] = field(default_factory=dict)  # target name -> port
    pids: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def to_json(self) -> dict[str, Any]:
        return {"root": self.root, "port": self.port, "exporters": self.exporters,
                "pids": self.pids}


def programs() -> dict[str, str]:
    """The two programs' paths (PromError naming what to install when one is missing)."""
    found = {k: shutil.which(v) or (f"/usr/bin/{v}" if os.access(f"/usr/bin/{v}", os.X_OK)
                                     else None) for k, v in PROGRAMS.items()}
    missing = [PROGRAMS[k] for k, v in found.items() if v is None]
    if missing:
        raise PromError(f"{', '.join(missing)} not found: {INSTALL}")
    return {k: v for k, v in found.items() if v is not None}


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _spawn(argv: list[str], log: str) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,  # noqa: S603
                                stderr=subprocess.STDOUT, start_new_session=True, cwd="/")
    return proc.pid


def config(targets: Mapping[str, int], scrape_s: float, rules: str) -> str:
    """prometheus.yml: one static target per textfile directory, labelled ``target``."""
    lines = ["global:", f"  scrape_interval: {scrape_s:g}s",
             f"  evaluation_interval: {scrape_s:g}s", "rule_files:", f"  - {json.dumps(rules)}",
             "scrape_configs:"]
    for name, port in targets.items():
        lines += [f"  - job_name: {json.dumps(name)}", "    static_configs:",
                  f"      - targets: ['127.0.0.1:{port}']"]
    return "\n".join(lines) + "\n"


def start(root: str, textfile_dirs: Mapping[str, str], scrape_s: float = 2.0,
          rules: str = RULES, timeout: float = 60.0) -> Stack:
    """node_exporter per directory (target name -> textfile directory) and Prometheus over
    them; returns once Prometheus is ready (PromError otherwise: what started is stopped)."""
    progs = programs()
    if not os.path.isfile(rules):
        raise PromError(f"no rules file {rules} (the sandbox's Prometheus runs from a checkout)")
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    ports = _ports(len(textfile_dirs) + 1)
    stack = Stack(root, ports[0])
    try:
        for (name, folder), port in zip(textfile_dirs.items(), ports[1:], strict=True):
            stack.pids.append(_spawn(
                [progs["node_exporter"], f"--web.listen-address=127.0.0.1:{port}",
                 "--collector.disable-defaults", "--collector.textfile",
                 f"--collector.textfile.directory={folder}"],
                os.path.join(root, f"node_exporter-{name}.log")))
            stack.exporters[name] = port
        conf = os.path.join(root, "prometheus.yml")
        with open(conf, "w", encoding="utf-8") as fh:
            fh.write(config(stack.exporters, scrape_s, rules))
        stack.pids.append(_spawn(
            [progs["prometheus"], f"--config.file={conf}",
             f"--storage.tsdb.path={os.path.join(root, 'data')}",
             f"--web.listen-address=127.0.0.1:{stack.port}", "--web.enable-lifecycle"],
            os.path.join(root, "prometheus.log")))
        _wait(lambda: _get(stack, "/-/ready") is not None, timeout, "Prometheus to be ready",
              os.path.join(root, "prometheus.log"))
    except BaseException:
        stop(stack)
        raise
    with open(os.path.join(root, "stack.json"), "w", encoding="utf-8") as fh:
        json.dump(stack.to_json(), fh)
    return stack


def stop(stack: Stack) -> None:
    """SIGTERM the stack's processes, then SIGKILL what is left after 10 s."""
    for pid in stack.pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    for pid in stack.pids:
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                if not os.path.exists(f"/proc/{pid}"):
                    break
            time.sleep(0.1)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def load(root: str) -> Stack | None:
    try:
        with open(os.path.join(root, "stack.json"), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return Stack(data["root"], data["port"], data["exporters"], data["pids"])


def _get(stack: Stack, path: str) -> bytes | None:
    try:
        with urllib.request.urlopen(stack.url + path, timeout=5) as resp:  # noqa: S310
            body: bytes = resp.read()
            return body
    except OSError:
        return None


def query(stack: Stack, expr: str) -> list[dict[str, Any]]:
    """The instant vector (or scalar, as one sample) ``expr`` returns now."""
    body = _get(stack, "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    if body is None:
        raise PromError(f"no answer from {stack.url} for {expr}")
    data = json.loads(body)
    if data.get("status") != "success":
        raise PromError(f"{expr}: {data.get('error')}")
    result = data["data"]["result"]
    if data["data"]["resultType"] == "scalar":
        return [{"metric": {}, "value": result}]
    return list(result)


def alerts(stack: Stack) -> list[dict[str, Any]]:
    """The alerts Prometheus holds now (pending and firing)."""
    body = _get(stack, "/api/v1/alerts")
    return list(json.loads(body)["data"]["alerts"]) if body else []


def _wait(pred: Any, timeout: float, what: str, log: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.3)
    raise PromError(f"timed out after {timeout:.0f} s waiting for {what} (see {log})")
