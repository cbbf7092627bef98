"""The cycle loop: launch, wait (watching for node faults), gather evidence, decide, act.

Exit codes (the contract, also in ``resilient-launch --help``):

* ``0`` the training completed;
* ``2`` usage or configuration error (also: not inside a Slurm allocation);
* ``3`` no-progress verdict: no new committed checkpoint across ``--no-progress-limit`` cycles
  or requeues (a deterministic crash); the job is not requeued;
* ``4`` budget exhausted: a requeue was needed but ``--max-requeues`` is spent (or requeue
  refused / failed), or too few usable nodes and no requeue left;
* ``5`` requeued: Slurm restarts this batch script (with blamed nodes excluded);
* ``143`` terminated by SIGTERM (``scancel``, preemption): the training was asked to save and
  the job is left to Slurm (never requeued by us); ``SIGUSR1`` (``--signal=B:USR1@T`` before a
  time limit) instead means save, then requeue;
* ``1`` internal error.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from resilient_slurm.events import EventLog
from resilient_slurm.launcher import blame, evidence, ledger, plan
from resilient_slurm.slurm import SlurmError

EXIT_DONE, EXIT_ERROR, EXIT_USAGE, EXIT_NO_PROGRESS, EXIT_BUDGET, EXIT_REQUEUED = 0, 1, 2, 3, 4, 5
EXIT_TERMINATED = 143


@dataclass
class Settings:
    checkpoint_dir: str
    state_dir: str
    min_nodes: int
    max_requeues: int = 3
    no_progress_limit: int = 3
    max_strikes: int = 2
    health_config: str | None = None
    health_timeout: float = 30.0
    watch_interval: float = 1.0


def committed_step(checkpoint_dir: str) -> int | None:
    """The latest complete checkpoint's step (training's layout when installed)."""
    try:
        from resilient_slurm.training.layout import latest_committed_step  # type: ignore
    except ImportError:
        latest_committed_step = None
    if latest_committed_step is not None:
        try:
            return latest_committed_step(checkpoint_dir)  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None
    best = None
    for marker in glob.glob(os.path.join(checkpoint_dir, "*", "COMMITTED")):
        m = re.search(r"(\d+)$", os.path.basename(os.path.dirname(marker)))
        if m and (best is None or int(m.group(1)) > best):
            best = int(m.group(1))
    return best


class Supervisor:
    """One batch script's run of the cycle loop (a requeued script starts a new one)."""

    def __init__(self, slurm: Any, alloc: plan.Allocation, opts: plan.LaunchOptions,
                 feats: plan.Features, cfg: Settings, env: Mapping[str, str]) -> None:
        self.slurm, self.alloc, self.opts, self.feats, self.cfg = slurm, alloc, opts, feats, cfg
        self.events_path = os.path.join(cfg.state_dir, "events.jsonl")
        self.log = EventLog(self.events_path, "launcher", job=alloc.job_id)
        self.env = {**env, **opts.extra_env, "RESILIENT_EVENTS_FILE": self.events_path,
                    "RESILIENT_STATE_DIR": cfg.state_dir,
                    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        self.led = ledger.load(cfg.state_dir)
        self.requested_nodes = len(alloc.nodes)  # before any release
        self.proc: subprocess.Popen[bytes] | None = None
        self.got_signal: int | None = None

    # -- signals ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: object) -> None:
        self.got_signal = signum
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # ft_launcher forwards it: training saves

    def _save(self) -> None:
        ledger.save(self.cfg.state_dir, self.led)

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.led.job_id = self.alloc.job_id
        nodes = self.led.usable(list(self.alloc.nodes))
        self.log.emit("launch_start", restart_count=self.alloc.restart_count, pid=os.getpid(),
                      allocation=list(self.alloc.nodes), nodes=nodes,
                      excluded=sorted(self.led.excluded), nvrx=self.feats.version,
                      min_nodes=self.cfg.min_nodes, max_requeues=self.cfg.max_requeues,
                      committed_step=committed_step(self.cfg.checkpoint_dir))
        if self.alloc.restart_count > self.cfg.max_requeues:
            return self._verdict("budget-exhausted", EXIT_BUDGET,
                                 f"restart count {self.alloc.restart_count} exceeds "
                                 f"--max-requeues {self.cfg.max_requeues}")
        addrs = evidence.node_addresses(self.slurm, list(self.alloc.nodes))
        while True:
            if len(nodes) < self.cfg.min_nodes:
                return self._requeue(f"{len(nodes)} usable node(s) < --min-nodes "
                                     f"{self.cfg.min_nodes}")
            self.led.cycles += 1
            self._save()
            rc, stopped, cycle_dir, started = self._run_cycle(nodes, addrs)
            step = committed_step(self.cfg.checkpoint_dir)
            if rc == 0 and not stopped and self.got_signal is None:
                self.led.record_progress(step)
                self._save()
                return self._verdict("completed", EXIT_DONE, f"training completed at {step}")
            if self.got_signal is not None:  # time limit / preemption: not a failure
                name = signal.Signals(self.got_signal).name
                if self.got_signal == signal.SIGTERM:
                    self.log.emit("fault", type="signal", signal=name, committed_step=step,
                                  detail="terminated (scancel or preemption); training saved")
                    return self._verdict("terminated", EXIT_TERMINATED,
                                         f"{name} received; left to Slurm")
                self.log.emit("fault", type="signal", signal=name, committed_step=step,
                              detail="time limit warning: checkpoint, then requeue")
                return self._requeue(f"{name} received (time limit warning)")
            progressed = self.led.record_progress(step)
            self._save()
            if not stopped:
                self.log.emit("fault", type="cycle-failed", rc=rc, step=step,
                              detail="ft_launcher gave up (in-job restarts exhausted or a "
                                     "node's launcher failed)")
            decision = self._blame(nodes, cycle_dir, started)
            if not decision.blamed and not progressed \
                    and self.led.no_progress >= self.cfg.no_progress_limit:
                return self._verdict("no-progress", EXIT_NO_PROGRESS,
                                     f"no new committed checkpoint (best {self.led.best_step}) "
                                     f"in {self.led.no_progress} cycle(s)/requeue(s): "
                                     "a deterministic failure, not requeueing")
            if not decision.blamed:
                return self._requeue(f"cycle failed (exit {rc}) with no node to blame and "
                                     "in-job restarts exhausted")
            for node, why in decision.blamed.items():
                self.led.exclude(node, "; ".join(why))
            self._save()
            survivors = [n for n in nodes if n not in decision.blamed]
            if len(survivors) >= self.cfg.min_nodes:
                for node in decision.nodes:
                    self.log.emit("exclude", node=node, mode="elastic", survivors=survivors,
                                  reason=decision.blamed[node])
                self.log.emit("recovery", by="elastic relaunch", nodes=survivors,
                              excluded=decision.nodes, cycle=self.led.cycles)
                self._release(decision.nodes)
                nodes = survivors
                continue
            return self._requeue(f"blamed {','.join(decision.nodes)}: {len(survivors)} "
                                 f"survivor(s) < --min-nodes {self.cfg.min_nodes}")

    def _run_cycle(self, nodes: list[str], addrs: Mapping[str, str]
                   ) -> tuple[int, str, str, float]:
        n = self.led.cycles
        cycle_dir = os.path.join(self.cfg.state_dir, "cycles",
                                 f"r{self.alloc.restart_count}-c{n}")
        cyc = plan.plan_cycle(self.alloc, self.opts, self.feats, nodes, addrs, n, cycle_dir)
        started = time.time()
        self.log.emit("cycle_start", cycle=n, nodes=nodes, endpoint=cyc.endpoint,
                      rdzv_id=cyc.rdzv_id, committed_step=committed_step(self.cfg.checkpoint_dir),
                      argv=list(cyc.argv))
        self.proc = subprocess.Popen(list(cyc.argv), env=self.env)  # noqa: S603 - argv list
        stopped = self._watch(nodes, started)
        rc = self.proc.wait()
        self.proc = None
        recs = evidence.exit_records(cyc.record_dir)
        self.log.emit("cycle_end", cycle=n, rc=rc, stopped=stopped or None,
                      duration_s=round(time.time() - started, 2),
                      node_rc={k: v.get("rc") for k, v in recs.items()})
        return rc, stopped, cycle_dir, started

    def _watch(self, nodes: list[str], since: float) -> str:
        """Wait for the step; stop it early on a node fault (reported or drained by our hooks)."""
        assert self.proc is not None
        last_state_check = 0.0
        while self.proc.poll() is None:
            time.sleep(self.cfg.watch_interval)
            why = ""
            faults = evidence.node_faults(self.events_path, since)
            if faults:
                why = "node fault reported on " + ",".join(sorted(faults))
            elif time.monotonic() - last_state_check > 5:
                last_state_check = time.monotonic()
                states = evidence.node_states(self.slurm, nodes)
                hooked = sorted(k for k, (s, r) in states.items()
                                if r.startswith(blame.HOOK_PREFIX) and "DRAIN" in s)
                if hooked:
                    why = "drained by health hook: " + ",".join(hooked)
            if why and self.proc.poll() is None:
                self.log.emit("stop_cycle", reason=why)
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=self.opts.term_timeout + 15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                return why
        return ""

    def _release(self, blamed: list[str]) -> None:
        """Give excluded nodes back to Slurm (shrink the running allocation), so they can be
        repaired instead of idling in this job. The batch host cannot leave; a refusal is
        recorded and the job goes on without the node either way."""
        batch = self.alloc.batch_node
        if batch in blamed:
            self.log.emit("release", nodes=[batch], done=False,
                          reason="the batch host cannot leave the allocation")
        keep = [n for n in self.alloc.nodes if n not in self.led.excluded or n == batch]
        drop = [n for n in self.alloc.nodes if n not in keep]
        if not drop:
            return
        try:
            self.slurm.shrink(self.alloc.job_id, keep)
        except SlurmError as exc:
            self.log.emit("release", nodes=drop, done=False, reason=str(exc))
            return
        self.env = plan.resized_env(self.env, self.alloc.nodes, keep)
        self.alloc = replace(self.alloc, nodes=tuple(keep))
        self.log.emit("release", nodes=drop, done=True, allocation=keep)

    def _blame(self, nodes: list[str], cycle_dir: str, since: float) -> blame.Decision:
        health = evidence.health_sweep(
            list(self.alloc.nodes), os.path.join(cycle_dir, "health"), self.alloc.job_id,
            self.env, self.cfg.health_config, self.cfg.health_timeout)
        evs = evidence.gather(self.slurm, list(self.alloc.nodes), cycle_dir, self.events_path,
                              since, health)
        evs = [e for e in evs if e.node in nodes]
        decision = blame.decide(evs, self.led.strikes, self.cfg.max_strikes)
        for node in decision.strikes:
            self.led.strike(node)
        self._save()
        self.log.emit("blame", cycle=self.led.cycles, blamed=decision.blamed or None,
                      strikes=decision.strike_totals or None,
                      evidence=[e.as_dict() for e in evs])
        return decision

    # -- endings ---------------------------------------------------------------------------
    def _verdict(self, verdict: str, code: int, message: str) -> int:
        self._save()
        self.log.emit("verdict", verdict=verdict, exit_code=code, message=message,
                      cycles=self.led.cycles, requeues=self.alloc.restart_count,
                      committed_step=self.led.best_step)
        print(f"resilient-launch: {verdict}: {message} (exit {code})", flush=True)
        return code

    def _requeue(self, why: str) -> int:
        if self.alloc.restart_count >= self.cfg.max_requeues:
            return self._verdict("budget-exhausted", EXIT_BUDGET,
                                 f"{why}; requeue budget spent ({self.alloc.restart_count}/"
                                 f"{self.cfg.max_requeues})")
        excluded = sorted(self.led.excluded)
        self.led.requeues += 1
        self._save()
        self.log.emit("requeue", reason=why, excluded=excluded,
                      restart_count=self.alloc.restart_count + 1)
        print(f"resilient-launch: requeueing: {why}", flush=True)
        # Requeue SIGTERMs this script within milliseconds (SIGKILL after KillWait): ignore it.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        from resilient_slurm.launcher.requeue import requeue_excluding

        shrunk = len(self.alloc.nodes) != self.requested_nodes
        err = requeue_excluding(self.slurm, self.alloc.job_id, excluded,
                                num_nodes=self.requested_nodes if shrunk else None)
        if err:
            return self._verdict("budget-exhausted", EXIT_BUDGET, f"requeue failed: {err}")
        return EXIT_REQUEUED
