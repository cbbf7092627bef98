"""A tiny stand-in for the FSDP training, for the launcher's integration tests.

No torch.distributed: each rank counts steps, sends NVRx heartbeats, writes its share of a
checkpoint in the training layout (``resilient_slurm.training.layout``) and resumes from the
latest committed one. Faults (each fires once, marker under the checkpoint dir, except
``--crash-at`` which fires every time): ``--fault exception@STEP``, ``hang@STEP``,
``node@STEP@NODE`` (writes the node's simulated scenario, emits a training ``fault`` event and
dies). The final line is ``weights digest: <hex>`` (a function of the steps done only).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time

from resilient_slurm.events import EventLog
from resilient_slurm.training import layout


def heartbeat_client():  # type: ignore[no-untyped-def]
    if "FT_LAUNCHER_IPC_SOCKET" not in os.environ and "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
        return client
    except Exception as exc:  # noqa: BLE001
        print(f"no heartbeats: {exc}", flush=True)
        return None


def once(ckpt: str, name: str) -> bool:
    os.makedirs(os.path.join(ckpt, "faults"), exist_ok=True)
    try:
        os.close(os.open(os.path.join(ckpt, "faults", name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--step-sleep", type=float, default=0.2)
    ap.add_argument("--fault", action="append", default=[])
    ap.add_argument("--crash-at", type=int, default=None)
    a = ap.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    node = os.environ.get("SLURMD_NODENAME", "")
    session = os.environ.get("TORCHELASTIC_RUN_ID", "s").replace("-", "_") + "_w" + str(world)
    events = EventLog(os.environ["RESILIENT_EVENTS_FILE"], "training", node=node, rank=rank) \
        if os.environ.get("RESILIENT_EVENTS_FILE") else None
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    client = heartbeat_client()
    start = layout.latest_committed_step(a.checkpoint_dir) or 0
    if events and rank == 0:
        events.emit("resume", step=start, world_size=world)
    step = start
    while step < a.steps:
        for spec in a.fault:
            parts = spec.split("@")
            kind, at = parts[0], int(parts[1])
            if at != step + 1:
                continue
            target_node = parts[2] if len(parts) > 2 else None
            if (target_node and target_node != node) or (not target_node and rank != 0):
                continue
            if not once(a.checkpoint_dir, spec.replace("@", "_")):
                continue
            if events:
                events.emit("fault", step=at, type=kind, detail=f"injected {kind}")
            if kind == "exception":
                raise RuntimeError(f"injected exception at step {at}")
            if kind == "hang":
                while True:
                    time.sleep(3600)
            if kind == "node":
                d = os.path.join(os.environ["RESILIENT_SANDBOX_DIR"], "nodes", node)
                os.makedirs(d, exist_ok=True)
                try:
                    from resilient_slurm.healthcheck.simulate import install_scenario

                    install_scenario(d, "xid79")
                except ImportError:
                    with open(os.path.join(d, "scenario.toml"), "w") as fh:
                        fh.write('scenario = "xid79"\n')
                os.kill(os.getpid(), signal.SIGKILL)
        if a.crash_at is not None and step + 1 == a.crash_at and rank == 0:
            raise RuntimeError(f"deterministic crash at step {a.crash_at}")
        time.sleep(a.step_sleep)
        step += 1
        if client is not None:
            client.send_heartbeat()
        if events and rank == 0:
            events.emit("progress", step=step)
        if step % a.checkpoint_every == 0 or step == a.steps or stop["flag"]:
            d = layout.step_dir(a.checkpoint_dir, step)
            os.makedirs(d, exist_ok=True)
            with open(layout.rank_file(d, rank, session), "w") as fh:
                fh.write(str(step))
            layout.write_done(d, rank, session, step, world)
            deadline = time.time() + (2 if stop["flag"] else 20)  # a collective's timeout
            while not layout.try_commit(d, step, session, world) and not layout.read_commit(d):
                if time.time() > deadline and stop["flag"]:
                    return 143
                if time.time() > deadline:
                    raise RuntimeError(f"peers never finished step {step}")
                time.sleep(0.2)  # lockstep at every save, as collectives would be
                if client is not None:
                    client.send_heartbeat()
        if stop["flag"]:
            return 143
    if client is not None:
        client.shutdown_workload_monitoring()
    print(f"weights digest: {hashlib.sha256(str(step).encode()).hexdigest()[:16]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
