"""The cycle loop: launch, wait (watching for node faults and signals), gather evidence, ask
``policy.decide`` what next, act (``launcher/recovery/actions.py``: one handler per action).

Exit codes: ``launcher/recovery/exits.py``; the watch over a running cycle: ``launcher/watch.py``;
starting and stopping its step (SIGTERM to the tasks, never to srun): ``launcher/step.py``;
the bounds on the signal paths (the stop's grace, the time-limit requeue's window):
``launcher/recovery/timelimit.py``. After SIGUSR1 the requeue is the first thing the launcher asks
of the controller or of shared storage once the step ended: the records, the cycle's end, the
review of exclusions and the fit check come after it, while the job pends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

from resilient_slurm import events
from resilient_slurm.events import EventKind
from resilient_slurm.fsutil import atomic_write
from resilient_slurm.launcher import step, watch
from resilient_slurm.launcher.cycle import budgeted, inprocess_plan, plan, progress
from resilient_slurm.launcher.endings import Endings
from resilient_slurm.launcher.recovery import (
    actions,
    blame,
    evacuate,
    evidence,
    exclusions,
    ledger,
    level0,
    nodewatch,
    policy,
    spares,
    standby_cycle,
    straggler,
    timelimit,
)
from resilient_slurm.launcher.recovery.policy import Action, Phase, Signal
from resilient_slurm.launcher.report import job_metrics, joblog
from resilient_slurm.launcher.settings import SupervisorSettings
from resilient_slurm.launcher.shim import standby
from resilient_slurm.slurm import SlurmBackend


class Supervisor(Endings):
    """One batch script's run of the cycle loop (a requeued script starts a new one)."""

    def __init__(self, slurm: SlurmBackend, alloc: plan.Allocation, opts: plan.LaunchOptions,
                 features: plan.Features, cfg: SupervisorSettings, env: Mapping[str, str]) -> None:
        self.slurm, self.alloc, self.opts, self.cfg = slurm, alloc, opts, cfg
        self.features = features
        self.events_path = os.path.join(cfg.state_dir, "events.jsonl")
        self.log = joblog.JobLog(self.events_path, "launcher", cfg.max_restarts,
                                 nvrx=features.version, job=alloc.job_id,  # + the job log
                                 instrumented="RESILIENT_INSTRUMENT" in opts.extra_env)
        self.env = step.quiet_env({**env, **opts.extra_env,
                                   "RESILIENT_EVENTS_FILE": self.events_path,
                                   "RESILIENT_STATE_DIR": cfg.state_dir,
                                   "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
        self.node_ledger = ledger.load(cfg.state_dir, alloc.job_id)
        self.requested_nodes = len(alloc.nodes)  # before any release
        self.proc: subprocess.Popen[bytes] | None = None
        self.signal = Signal.NONE
        self.kill_wait = 30.0
        self.end_time: float | None = None  # the job's end (time limit), epoch s; None: unknown
        self._cycle_end: Callable[[], None] | None = None  # a cycle's records, not written yet
        self.message_timeout = 10.0  # Slurm's: how long a stopped step's lost node may hold us
        self.slow: dict[str, straggler.Verdict] = {}  # this cycle's stragglers (stopped it)
        self.progress = progress.Tracker(cfg.checkpoint_dir, self.events_path,
                                         cfg.checkpoint_marker, self.log)
        # A stopped step whose srun had to be killed (a lost node's task never ended) stays in
        # Slurm until that node is DOWN, holding its CPUs: later cycles run with --overlap.
        self.lingering = False
        # --inprocess (ft_launcher's --nnodes MIN:N set by inprocess_plan): level 0 may leave
        # a bad node out itself; level 2 waits for it as long as level 0's own bound.
        self.level0 = level0.Level0Grace(inprocess_plan.level0_grace(opts, env)) \
            if opts.min_nnodes else None
        self.standby: list[str] = []  # --spares: idle nodes a blamed node may be swapped for
        # --spares on NVRx >= 0.6: the standbys run NVRx's gated standby agents in the step
        self.native = standby.native(features.flags, opts.min_nnodes is not None)
        self.promo: standby.Promotions | None = None  # the running cycle's promotions
        self.config_error = ""  # the training's configuration error (fatal.py): ends the job
        self.evacuating: dict[str, tuple[str, ...]] = {}  # nodes this cycle stopped to leave

    # -- signals: recorded at any moment, acted on at the next decision or watch tick -------
    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM or self.signal is Signal.NONE:
            self.signal = Signal.TERM if signum == signal.SIGTERM else Signal.USR1

    def _save(self) -> None:
        ledger.save(self.cfg.state_dir, self.node_ledger)

    def _state(self, phase: Phase, usable: int, blamed: int = 0) -> policy.State:
        return policy.State(phase, self.signal, usable, self.cfg.min_nodes, blamed,
                            self.node_ledger.no_progress, self.cfg.no_progress_limit,
                            self.node_ledger.requeues, self.cfg.max_requeues,
                            config_error=self.config_error)

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self.kill_wait = self.slurm.kill_wait()
        self.message_timeout = self.slurm.message_timeout()
        self.end_time = timelimit.job_end(self.env, self.slurm, self.alloc.job_id)
        if self.node_ledger.user_excluded is None:
            self.node_ledger.user_excluded = exclusions.user_excluded(self.slurm, self.alloc)
        nodes = self.node_ledger.usable(list(self.alloc.nodes))
        if self.cfg.spares:  # hot spares: train on N, the other K stand by
            nodes, self.standby = spares.split(nodes, self.requested_nodes - self.cfg.spares,
                                               self.alloc.batch_node)
        self.log.emit(EventKind.LAUNCH_START, **events.LaunchStart(
            restart_count=self.alloc.restart_count, spares=self.standby or None,
            requeues=self.node_ledger.requeues, pid=os.getpid(),
            allocation=list(self.alloc.nodes), nodes=nodes,
            excluded=sorted(self.node_ledger.excluded), nvrx=self.features.version,
            min_nodes=self.cfg.min_nodes, max_requeues=self.cfg.max_requeues,
            kill_wait=self.kill_wait, end_time=self.end_time,
            committed_step=self.progress.step()))
        self._save()
        instrumented = "RESILIENT_INSTRUMENT" in self.opts.extra_env
        if not instrumented:
            self.log.say("no hang detection unless the script sends NVRx heartbeats itself "
                         "(ranks not instrumented: --no-instrument or --inprocess)")
        self.progress.at_start(instrumented)
        if self.cfg.job_index:
            try:
                job_metrics.append_index(self.cfg.job_index, self.alloc.job_id,
                                         self.cfg.state_dir, self.alloc.restart_count)
            except OSError as exc:
                print(f"resilient-launch: --job-index {self.cfg.job_index}: {exc}", flush=True)
        if self.cfg.metrics_dir:  # also while a cycle runs (weeks, perhaps): off the watch
            threading.Thread(target=self._metrics_every, daemon=True).start()
        addrs = evidence.node_addresses(self.slurm, list(self.alloc.nodes))
        while True:
            d = policy.decide(self._state(Phase.BEFORE_CYCLE, len(nodes)))
            if d.action is not Action.RUN_CYCLE:
                return self._act(d)
            self.node_ledger.cycles += 1
            self._save()
            rc, stopped, cycle_dir, started = self._run_cycle(nodes, addrs)
            replaced = sorted(self.promo.replaced) if self.promo is not None else []
            if self.promo is not None:  # NVRx promoted standbys: the training nodes now
                nodes, self.promo = self.promo.active(), None
            if self.signal is Signal.USR1 and (rc != 0 or stopped):
                d = policy.decide(self._state(Phase.FAILED, len(nodes)))
                if d.action is Action.REQUEUE:  # the requeue before anything else
                    return self._requeue_first(d.why, after_cycle=True)
            if replaced:  # the lost nodes back to Slurm now that the step is over
                self.release(replaced)
            self._cycle_ended()
            p = budgeted.Budgeted(self.progress.finished_cycle, name="progress")(
                progress.Progress(None, None))  # a stalled filesystem: unknown, not waited for
            if p.known:
                self.node_ledger.record_progress(p.step)
            step = p.step
            if rc == 0 and not stopped:
                return self._act(policy.decide(self._state(Phase.COMPLETED, len(nodes))))
            self._save()
            if self.signal is not Signal.NONE:
                self.log.emit(EventKind.FAULT, **events.Fault(
                    type="signal", signal=self.signal.value, committed_step=step,
                    detail="stopped: " + ("terminated (scancel or preemption)"
                                          if self.signal is Signal.TERM else "time limit warning")))
                return self._act(policy.decide(self._state(Phase.FAILED, len(nodes))))
            if self.config_error:  # no blame, relaunch or requeue can fix it
                return self._act(policy.decide(self._state(Phase.FAILED, len(nodes))))
            if not stopped:
                self.log.emit(EventKind.FAULT, **events.Fault(
                    type="cycle-failed", rc=rc, step=step,
                    detail="ft_launcher gave up (in-job restarts exhausted or a node's "
                           "launcher failed)"))
            d, after = self._after_fault(nodes, cycle_dir, started)
            nxt = actions.act(self, d, after)  # what to do now: launcher/recovery/actions.py
            if isinstance(nxt, int):
                return nxt
            nodes = nxt

    def _after_fault(self, nodes: list[str], cycle_dir: str, started: float
                     ) -> tuple[policy.Decision, actions.AfterFault]:
        """After a failed cycle: wait for Slurm's view of vanished nodes, blame, exclude the
        blamed in the ledger, choose spares for them, and decide."""
        gone: dict[str, str] = {}  # vanished nodes whose slurmd does not answer
        if lost := evidence.vanished(os.path.join(cycle_dir, "nodes"), nodes):
            gone = evidence.unreachable(self.slurm, lost, self.message_timeout)
            if rest := [n for n in lost if n not in gone]:
                print(f"resilient-launch: {', '.join(rest)}: its launcher vanished; waiting "
                      f"up to {self.cfg.lost_node_wait:.0f} s for Slurm's view", flush=True)
                evidence.await_lost(partial(evidence.states_now, self.slurm), rest,
                                    self.cfg.lost_node_wait)
        decision = self._blame(nodes, cycle_dir, started, gone)
        for node, why in evacuate.blamed(self.evacuating).items():
            decision.blamed.setdefault(node, why)  # the spare swap's cause: precursor
        self.evacuating = {}
        for node, why in decision.blamed.items():
            self.node_ledger.exclude(node, "; ".join(why))
        self._save()
        survivors = [n for n in nodes if n not in decision.blamed]
        swap = spares.for_blamed(self.slurm, self.standby, decision.blamed, self.cfg,
                                 self.alloc.job_id, self.env, cycle_dir)
        evidence.report_unread(self.log, self.cfg.verdict_path, swap.unread if swap else {},
                               "spares", self.node_ledger.cycles)
        if swap is not None:  # hot spares in place of blamed nodes: the same world size
            survivors = swap.nodes(survivors, nodes)
        prefer = straggler.prefers_requeue(self.cfg.straggler, self.slow, decision.blamed)
        self.slow = {}
        d = policy.decide(replace(self._state(Phase.FAILED, len(survivors),
                                              len(decision.blamed)), prefer_requeue=prefer))
        return d, actions.AfterFault(decision.blamed, survivors, swap, self.node_ledger.cycles)

    def _run_cycle(self, nodes: list[str], addrs: Mapping[str, str]
                   ) -> tuple[int, str, str, float]:
        n = self.node_ledger.cycles
        cycle_dir = os.path.join(self.cfg.state_dir, "cycles",
                                 f"r{self.alloc.restart_count}-c{n}")
        if self.native and self.standby:  # NVRx's own standbys, gated (launcher/shim/standby.py)
            cycle, self.promo = standby_cycle.plan_cycle(
                self.alloc, self.opts, self.features, nodes, self.standby, addrs, n, cycle_dir,
                plan.ephemeral_range(), self.cfg.verdict_path, self.cfg.verdict_max_age)
        else:
            cycle = plan.plan_cycle(self.alloc, self.opts, self.features, nodes, addrs, n,
                                    cycle_dir, plan.ephemeral_range())
        for path, text in cycle.files:
            atomic_write(path, text)
        started = time.time()
        if self.promo is not None:
            self.promo.since = started
        mon = straggler.Monitor(self.cfg.straggler, nodes) if self.cfg.straggler else None
        argv = step.argv(cycle, self.lingering)
        self.log.emit(EventKind.CYCLE_START, **events.CycleStart(
            cycle=n, nodes=list(cycle.nodes), endpoint=cycle.endpoint, rdzv_id=cycle.rdzv_id,
            committed_step=self.progress.step(), argv=argv,
            nproc_per_node=self.opts.nproc_per_node))
        self.proc = step.start(argv, self.env, cycle)
        if self.level0 is not None:
            self.level0.new_cycle()
        w = watch.CycleWatch(
            self.slurm, self.log, list(cycle.nodes), started, self.events_path,
            self.cfg.verdict_path,
            nodewatch.NodeWatchSettings(self.cfg.node_query_interval,
                                        max(60.0, self.opts.heartbeat_timeout or 0.0),
                                        self.cfg.max_blame_share),
            self.cfg.state_check_interval, self.cfg.max_restarts, cycle.cycle_info_dir, mon,
            self.level0, self.progress.note_checkpoint,
            self._evacuation(nodes, started - self.cfg.verdict_max_age, cycle_dir),
            self.promo, self._promoted)
        stopped = self._watch(w, cycle.record_dir)
        rc = self.proc.wait()
        self.proc = None
        if self.promo is not None:  # lost before Slurm flagged it: its launcher vanished
            lost = evidence.vanished(cycle.record_dir, list(cycle.nodes))
            if newly := self.promo.split(lost, w.tail.events)[1]:
                self._promoted(newly, dict.fromkeys(newly, "its launcher vanished"))
            rc = standby_cycle.step_rc(rc, self.promo, evidence.exit_records(cycle.record_dir))
        duration = round(time.time() - started, 2)

        def cycle_end() -> None:  # shared storage: after a time-limit requeue, not before
            recs = evidence.exit_records(cycle.record_dir)
            self.log.emit(EventKind.CYCLE_END, **events.CycleEnd(
                cycle=n, rc=rc, stopped=stopped or None, duration_s=duration,
                straggler_ratio_max=round(mon.highest, 3) if mon else None,
                node_rc={k: v.get("rc") for k, v in recs.items()}))
            self._metrics()

        self._cycle_end = cycle_end
        if self.signal is not Signal.USR1:
            self._cycle_ended()
        return rc, stopped, cycle_dir, started

    def _promoted(self, newly: dict[str, str], why: dict[str, str]) -> None:
        """NVRx promoted standbys in place of lost training nodes (the watch saw it)."""
        assert self.promo is not None
        standby_cycle.record(self.log, self.node_ledger, self.standby, self.promo, newly, why,
                             self.node_ledger.cycles)
        self._save()

    def _cycle_ended(self) -> None:
        """Write the last cycle's end records, if not written yet."""
        end, self._cycle_end = self._cycle_end, None
        if end is not None:
            end()

    def _metrics_every(self) -> None:
        while True:
            time.sleep(job_metrics.REFRESH_S)
            self._metrics()

    def _evacuation(self, nodes: list[str], since: float,
                    cycle_dir: str) -> evacuate.Evacuation | None:
        """The cycle's watch for precursors (``launcher/recovery/evacuate.py``; None: no verdicts);
        ``since``: the oldest verdict that counts (a precursor is published once: one from
        before this cycle, within ``verdict_max_age`` (300 s), still stands)."""
        if not self.cfg.verdict_path:
            return None
        return evacuate.Evacuation(
            self.log, nodes, since, self.cfg.verdict_path, self.alloc.batch_node, self.standby,
            lambda standby: spares.health(
                self.slurm, standby, self.cfg.verdict_path, time.time(),
                self.cfg.verdict_max_age, self.alloc.job_id, self.env,
                os.path.join(cycle_dir, "evacuate"), self.cfg.health_timeout))

    def _metrics(self) -> None:
        """Rewrite the job's metrics file (``--metrics-dir``); a failure is only said."""
        if self.cfg.metrics_dir:
            try:
                job_metrics.publish(self.cfg.metrics_dir, self.alloc.job_id, self.events_path)
            except (OSError, ValueError) as exc:
                print(f"resilient-launch: --metrics-dir {self.cfg.metrics_dir}: {exc}",
                      flush=True)

    def _watch(self, w: watch.CycleWatch, record_dir: str) -> str:
        """Wait for the step; stop it early when a tick of ``w`` says why (a signal, a
        straggler verdict, the in-job restart budget, a node fault: ``policy.stop_reason``)."""
        assert self.proc is not None
        while self.proc.poll() is None:
            time.sleep(self.cfg.watch_interval)
            t = w.tick(self.signal)
            if t.step_signal and self.signal is Signal.NONE:
                self.signal = Signal.USR1  # --signal=USR1@T without B: reached the tasks
            self.slow.update(t.slow or {})
            self.evacuating.update(t.evacuate or {})
            if t.why and self.proc.poll() is None:
                self.log.emit(EventKind.STOP_CYCLE, **events.StopCycle(reason=t.why))
                self._stop_step(record_dir, t.why)
                self.config_error = w.finish()
                return t.why
        self.config_error = w.finish()
        return ""

    def _stop_step(self, record_dir: str, why: str) -> None:
        """Stop the step (``step.stop_step``, no controller involved): its tasks get
        ``--term-timeout`` (+ a margin) to save, capped as ``timelimit.stop_bounds`` says:
        after SIGTERM within 70 % of KillWait (Slurm kills the batch script then); after
        SIGUSR1 early enough that the requeue lands before the job's end time; after a node
        fault at most ``timelimit.FAULT_STOP_GRACE`` (the survivors cannot finish a
        collective with a lost peer, and the committed checkpoint or memory tier is what the
        next cycle loads)."""
        assert self.proc is not None
        grace, kill_bound = timelimit.stop_bounds(
            self.signal, why.startswith(policy.NODE_FAULT), self.opts.stop_grace,
            self.kill_wait, self.message_timeout, self.end_time, time.time())
        if step.stop_step(self.proc, record_dir, grace, self.log, kill_bound):
            self.lingering = True

    def release(self, blamed: list[str]) -> None:
        """Give excluded nodes back to Slurm (``exclusions.release``)."""
        self.alloc, self.env = exclusions.release(self.slurm, self.alloc, blamed,
                                                  self.node_ledger.excluded, self.env, self.log)

    def _blame(self, nodes: list[str], cycle_dir: str, since: float,
               gone: dict[str, str]) -> blame.Decision:
        unread: dict[str, str] = {}
        read = evidence.reader(self.cfg, nodes, since, self.alloc.job_id, self.env,
                               os.path.join(cycle_dir, "verdicts"), unread)
        # A cycle stopped to evacuate blames no fault: no wait for the hooks' next verdicts.
        cfg = replace(self.cfg, verdict_wait=0.0) if self.evacuating else self.cfg
        decision, evs = evidence.assess(self.slurm, nodes, cycle_dir, read, cfg,
                                        self.node_ledger.strikes,
                                        {n: v.evidence for n, v in self.slow.items()}, gone)
        evidence.report_unread(self.log, self.cfg.verdict_path, unread, "blame",
                               self.node_ledger.cycles)
        straggler.report_causes(self.log, evs)  # drained only by the hooks, for a cause
        for node in decision.strikes:
            self.node_ledger.strike(node)
        self._save()
        self.log.emit(EventKind.BLAME, **events.Blame(
            cycle=self.node_ledger.cycles, blamed=decision.blamed or None,
            strikes=decision.strike_totals or None, shared_fault=decision.shared_fault or None,
            evidence=[e.as_dict() for e in evs]))
        return decision
