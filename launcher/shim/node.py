"""The per-node shim ``srun`` starts:
``python -m resilient_slurm.launcher.shim.node [opts] -- CMD...``.

It fills ``{local_addr}`` (this node's address from ``--addrs-file``, a JSON map node ->
address, so no argv carries the whole node list; the option carrying it is dropped when
unknown) and ``{node}`` into CMD, runs it, and forwards SIGTERM/SIGINT to it (each signal
once: Slurm signals every process of the step as well, and a second SIGTERM would cut
ft_launcher's own orderly stop short).

SIGUSR1 (``sbatch --signal=USR1@T`` without ``B:``, ``scancel -s USR1 JOB``) means "save,
then requeue", as the batch shell's ``B:USR1`` does. SIGUSR2 is the supervisor's own stop
(``launcher/step.py``): it sends it to the step's ``srun``, which forwards it to every task
straight through the nodes' slurmd, never through slurmctld, so a stalled controller cannot
delay a stop. ft_launcher handles only TERM/INT/HUP/QUIT and would die of USR1's default
action, so CMD starts with USR1/USR2 ignored (its workers inherit that; a script that handles
USR1 installs its own handler) and the shim turns either signal into ft_launcher's orderly
stop: SIGTERM to CMD (the ranks save); SIGUSR1 also writes a ``step_signal`` event for the
supervisor (which then stops the step and requeues the job).

Records, each written atomically under ``--record-dir``:

* ``<node>.started.json`` as soon as CMD runs (``node``, ``step``: ``$SLURM_STEP_ID``, ``pid``,
  ``start``), rewritten with ``signalled`` (time, signal) when the step is asked to stop;
* ``<node>.json`` when CMD ended (``node``, ``rc``, ``start``, ``end``).

So the supervisor tells a node that never answered (no ``started``) from one killed by the
step's teardown (``started`` and ``signalled`` but no exit record) and signals the step by id.

CMD runs with ``TMPDIR`` set to a fresh private directory (0700, ``mkdtemp`` under the
step's own ``TMPDIR`` or ``/tmp``), removed when CMD ends. ft_launcher names its IPC sockets
``$TMPDIR/_ft_launcher<pid>...socket`` and unlinks any stale one first: in a shared sticky
``/tmp`` the socket a SIGKILLed launcher of another user left under a pid now reused is not
ours to unlink (EPERM), and ft_launcher dies at start ("Agent run ended with exception,
e=PermissionError"; seen with pids wrapping at 32768 under parallel test jobs).

When ``$RESILIENT_EVENTS_FILE`` is set, CMD's stderr passes through this shim line by line
(``launcher/shim/relay.py``: bounded, never blocking the ranks, drops counted), and the moment
NVRx's rank monitor reports missing heartbeats ("Did not get subsequent heartbeat") becomes a
``hang_detected`` event (node, rank, the timeout it waited), so the report can tell when a
hang was found, not only when training resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from resilient_slurm.events import EventKind, EventLog, StepSignal
from resilient_slurm.fsutil import atomic_write_json
from resilient_slurm.launcher.shim import standby
from resilient_slurm.launcher.shim.relay import relay_stderr

# Placeholders the plan writes into the command and this shim fills in on each node.
LOCAL_ADDR = "{local_addr}"
NODE = "{node}"


def substitute(cmd: list[str], node: str, addr: str) -> list[str]:
    out = []
    for arg in cmd:
        if LOCAL_ADDR in arg:
            if not addr:
                continue
            arg = arg.replace(LOCAL_ADDR, addr)
        out.append(arg.replace(NODE, node))
    return out


def read_addrs(path: str) -> dict[str, str]:
    """node -> address from the supervisor's JSON map ({} when absent or unreadable)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def started_path(record_dir: str, node: str) -> str:
    return os.path.join(record_dir, f"{node}.started.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="resilient_slurm.launcher.shim.node")
    ap.add_argument("--record-dir", required=True)
    ap.add_argument("--addrs-file", default="")
    ap.add_argument("--capture", action="store_true", help="keep CMD's stdout in the record")
    standby.add_gate_options(ap)  # NVRx standbys gated by the node's verdict (standby.py)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    ns = ap.parse_args(argv)
    cmd = ns.cmd[1:] if ns.cmd[:1] == ["--"] else ns.cmd
    if not cmd:
        ap.error("no command")
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    cmd = [a.replace(standby.IS_HOST, standby.is_host(os.environ.get("SLURM_PROCID")))
           for a in substitute(cmd, node, read_addrs(ns.addrs_file).get(node, ""))]
    start = time.time()
    os.makedirs(ns.record_dir, exist_ok=True)
    events_file = os.environ.get("RESILIENT_EVENTS_FILE")
    watch = bool(events_file) and not ns.capture
    # Our handlers before CMD exists: a signal in between is kept and acted on once it runs.
    pending: list[int] = []
    holder: list[subprocess.Popen[bytes]] = []
    for sig in (signal.SIGTERM, signal.SIGINT, *IGNORED_IN_CMD):
        signal.signal(sig, lambda signum, _f: pending.append(signum) if not holder else None)
    gate = standby.Gate(node, ns.standby_verdict, ns.standby_max_age, events_file) \
        if standby.is_standby(os.environ.get("SLURM_PROCID"), ns.standby_from) else None
    if gate is not None and not gate.before_start(ns.standby_from, start, pending):
        atomic_write_json(os.path.join(ns.record_dir, f"{node}.json"),
                          {"node": node, "rc": 0, "gated": gate.why, "start": round(start, 3),
                           "end": round(time.time(), 3)})
        return 0  # a standby that never joined: the step goes on (--kill-on-bad-exit)
    private = _private_tmp(node)
    env = {**os.environ, "TMPDIR": private} if private else None
    try:
        return _run(ns, cmd, node, start, events_file, watch, pending, holder, env, gate)
    finally:
        if private:
            shutil.rmtree(private, ignore_errors=True)


def _private_tmp(node: str) -> str | None:
    """A fresh 0700 directory for CMD's TMPDIR (None, and the inherited one, if none can be
    made)."""
    try:
        return tempfile.mkdtemp(prefix=f"rs-step-{os.environ.get('SLURM_JOB_ID', 'x')}-{node}-")
    except OSError as exc:
        print(f"resilient-launch node: no private TMPDIR ({exc}); keeping the step's",
              file=sys.stderr)
        return None


def _run(ns: argparse.Namespace, cmd: list[str], node: str, start: float,
         events_file: str | None, watch: bool, pending: list[int],
         holder: list[subprocess.Popen[bytes]], env: dict[str, str] | None,
         gate: standby.Gate | None = None) -> int:
    try:
        child = subprocess.Popen(  # noqa: S603 - argv list from the supervisor, no shell
            cmd, stdout=subprocess.PIPE if ns.capture else None,
            stderr=subprocess.PIPE if watch else None, preexec_fn=_ignore_user_signals,
            env=env)
    except OSError as exc:
        os.makedirs(ns.record_dir, exist_ok=True)
        atomic_write_json(os.path.join(ns.record_dir, f"{node}.json"),
                          {"node": node, "rc": 127, "error": str(exc), "start": start,
                           "end": time.time()})
        return 127

    started: dict[str, object] = {"node": node, "step": os.environ.get("SLURM_STEP_ID"),
                                  "job": os.environ.get("SLURM_JOB_ID"), "pid": child.pid,
                                  "start": round(start, 3)}
    _write_started(ns.record_dir, node, started)
    seen: set[int] = set()
    step_events = EventLog(events_file, "node", node=node) if events_file else None

    def forward(signum: int, _frame: object) -> None:
        if signum in seen:
            return
        seen.add(signum)
        if signum in USER_SIGNALS and step_events is not None:
            try:
                step_events.emit(EventKind.STEP_SIGNAL, **StepSignal(
                    signal=signal.Signals(signum).name,
                    detail="save, then requeue (as --signal=B:USR1)"))
            except OSError as exc:
                print(f"resilient-launch node: cannot record the signal: {exc}",
                      file=sys.stderr)
        to_child = signal.SIGTERM if signum in IGNORED_IN_CMD else signum
        if to_child not in sent:
            sent.add(to_child)
            try:
                child.send_signal(to_child)
            except ProcessLookupError:
                pass
        if "signalled" not in started:
            started["signalled"] = round(time.time(), 3)
            started["signal"] = signal.Signals(signum).name
            _write_started(ns.record_dir, node, started)

    sent: set[int] = set()
    for sig in (signal.SIGTERM, signal.SIGINT, *IGNORED_IN_CMD):
        signal.signal(sig, forward)
    holder.append(child)
    for signum in pending:
        forward(signum, None)
    if gate is not None:
        gate.watch(lambda: forward(signal.SIGTERM, None))
    relay = None
    if watch and events_file and child.stderr is not None:
        relay = threading.Thread(target=relay_stderr, daemon=True,
                                 args=(child.stderr, EventLog(events_file, "node", node=node)))
        relay.start()
    stdout = child.communicate()[0] if ns.capture else None
    rc = child.wait()
    if gate is not None:
        gate.done.set()
        rc = 0 if gate.why else rc  # stopped by its gate: not a failure of the step
    if relay is not None:
        relay.join(timeout=5)
    record: dict[str, object] = {"node": node, "rc": rc, "start": round(start, 3),
                                 "end": round(time.time(), 3), "argv0": os.path.basename(cmd[0])}
    if gate is not None and gate.why:
        record["gated"] = gate.why
    if stdout is not None:
        record["stdout"] = stdout.decode("utf-8", "replace")[-60000:]
    os.makedirs(ns.record_dir, exist_ok=True)
    atomic_write_json(os.path.join(ns.record_dir, f"{node}.json"), record)
    return rc if rc >= 0 else 128 - rc


USER_SIGNALS = (signal.SIGUSR1,)  # the user's "save, then requeue" (a step_signal event)
STOP_SIGNAL = signal.SIGUSR2  # the supervisor's stop, forwarded by srun (launcher/step.py)
IGNORED_IN_CMD = (*USER_SIGNALS, STOP_SIGNAL)


def _ignore_user_signals() -> None:
    """In CMD before it runs: USR1/USR2 ignored (ft_launcher would die of them)."""
    for sig in IGNORED_IN_CMD:
        signal.signal(sig, signal.SIG_IGN)


def _write_started(record_dir: str, node: str, record: dict[str, object]) -> None:
    try:
        atomic_write_json(started_path(record_dir, node), record)
    except OSError as exc:  # the record is evidence; the training must run regardless
        print(f"resilient-launch node: cannot write the started record: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
