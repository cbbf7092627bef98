"""The GPU proof's steps, run by scripts/gpu-proof.sh (see docs/gpu-proof.md).

Each step runs its command in a child process under its own time cap (the caps and the
install's add up to at most ``BUDGET_S``), records wall time and peak RSS, judges the output
and adds a line to the summary. ``--dry-run`` plans every step and checks what can be checked
without a GPU (the health steps run on a simulated node; training argv is parsed, ft_launcher's
flags looked up); GPU steps are skipped with the reason. Output folder: summary.txt,
summary.json, profile.toml, health-check.json, nvml-hang.json, logs.tar.gz (at most 8 files).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_proof_report import INSTALL_CAP_S, Line, finish, install_line
from gpu_proof_scale import scale_step
from gpu_proof_tiers import tiers_step

from resilient_slurm_lab.faults import TRAIN_SCRIPT as FAULTS_TRAIN

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "sbatch", "train_fsdp.py")
BUDGET_S = 600  # the whole device run, install included: 10 minutes
NVML_CHECKS = ("gpu_count", "ecc", "row_remap", "retired_pages", "clocks", "temperature",
               "pcie", "recovery_action", "nvlink", "fabric")
HEALTH_CFG = {"nvml_timeout_s": 5.0, "watchdog_s": 30.0, "tool_timeout_s": 5.0,
              "kernel_log_timeout_s": 3.0, "storage_timeout_s": 3.0}
SMALL = ["--steps", "40", "--checkpoint-every", "5", "--keep", "2", "--seed", "7",
         "--d-model", "256", "--layers", "2", "--heads", "8"]
FAULTS = ["--fault", "exception@12", "--fault", "sigkill@27"]
# 336 M parameters (6 layers of 12 d^2, d = 2048, + 8192-token embeddings and head): fp32
# weights + AdamW's two moments = 4.0 GB saved per rank and save; compute per step is tiny.
BIG = ["--steps", "4", "--checkpoint-every", "2", "--keep", "1", "--seed", "7", "--d-model",
       "2048", "--layers", "6", "--heads", "16", "--vocab", "8192", "--seq-len", "64",
       "--batch-size", "4"]
FT = ["--standalone", "--nproc-per-node", "1", "--max-restarts", "3", "--monitor-interval",
      "0.5", "--term-timeout", "10", "--ft-initial-rank-heartbeat-timeout", "120",
      "--ft-rank-heartbeat-timeout", "60", "--ft-enable-nic-monitor=false"]
FT_IF_KNOWN = ["--ft-enable-nic-healthcheck=false"]  # NVRx >= 0.6: no NIC state gate here


def py(*args: str) -> list[str]:
    return [sys.executable, *args]


@dataclass
class Run:
    rc: int
    out: str
    wall_s: float
    peak_rss_mib: float


class Proof:
    def __init__(self, out: str, scratch: str, dry: bool) -> None:
        self.out, self.scratch, self.dry = out, scratch, dry
        self.logs = os.path.join(scratch, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.lines: list[Line] = []
        self.gpu = False
        self.no_gpu = "the environment probe failed"
        # Rehearsal (developers, no GPU): the GPU steps on CPU with gloo and a small stall model,
        # to exercise this driver's parsing and ft_launcher's flags. Not a proof.
        self.rehearse = False
        self.device = "cuda:0"
        self.small = SMALL
        self.digest = ""
        self.stalls: dict[str, float] = {}
        self._train: Any = None
        self._help = ""
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("RESILIENT_", "SLURM"))}
        self.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        self.env["PYTHONUNBUFFERED"] = "1"

    def add(self, line: Line) -> Line:
        self.lines.append(line)
        print(f"{line.result:<5} {line.step:<22} {line.figure}", flush=True)
        return line

    def run(self, name: str, argv: list[str], cap: float, env: dict[str, str] | None = None) -> Run:
        """``argv`` in its own session, killed (whole group) at ``cap`` seconds."""
        log = os.path.join(self.logs, f"{name}.log")
        t0 = time.monotonic()
        with open(log, "w") as fh:
            fh.write("$ " + " ".join(argv) + "\n")
            fh.flush()
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                    env=env or self.env, start_new_session=True)
            while not (done := os.wait4(proc.pid, os.WNOHANG))[0] \
                    and time.monotonic() - t0 < cap:
                time.sleep(0.05)
            if not done[0]:
                os.killpg(proc.pid, signal.SIGKILL)
                done = os.wait4(proc.pid, 0)
                fh.write(f"\n[gpu-proof] killed at its time cap of {cap:g} s\n")
            proc.returncode = os.waitstatus_to_exitcode(done[1])
        with open(log, errors="replace") as fh:
            text = fh.read()
        return Run(proc.returncode, text, round(time.monotonic() - t0, 2),
                   round(done[2].ru_maxrss / 1024, 1))

    def health(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "resilient_slurm.hooks.health_cli", *args]

    # ------------------------------------------------------------------ steps
    def environment(self, cap: float) -> None:
        r = self.run("environment", py(os.path.join(REPO, "scripts", "gpu_proof_env.py")), cap)
        try:
            info = json.loads(next(x for x in r.out.splitlines() if x.startswith("{")))
        except (ValueError, StopIteration):
            self.add(Line("environment", "FAIL", "could not read torch", r.out[-300:], r.wall_s))
            return
        self.gpu = bool(info["cuda"]) or self.rehearse
        self.no_gpu = "no CUDA device"
        gpu = (f"{info['gpus']}x {info['gpu']} ({info['gpu_mem_gib']} GiB), NCCL {info['nccl']}"
               if info["cuda"] else "no CUDA device")
        fig = (f"python {info['python']}, torch {info['torch']} (CUDA {info['torch_cuda']}), "
               f"{gpu}, NVRx {info['nvrx']}, nvidia-ml-py {info['nvml']}")
        ok = self.gpu or self.dry
        detail = "" if self.gpu else "no CUDA device: GPU steps skipped"
        self.add(Line("environment", "PASS" if ok else "FAIL", fig, detail, r.wall_s, data=info))

    def config(self, with_profile: str = "") -> str:
        path = os.path.join(self.scratch, "proof-config.toml" if with_profile else "base.toml")
        body = "".join(f"{k} = {v}\n" for k, v in HEALTH_CFG.items())
        with open(path, "w") as fh:
            fh.write(f"[health]\nstate_dir = {json.dumps(os.path.join(self.scratch, 'state'))}\n"
                     f"{body}{with_profile}")
        return path

    def genconf(self, cap: float) -> str:
        dest = os.path.join(self.out, "profile.toml")
        sim = ["--simulate", "healthy-p5"] if self.dry else []
        argv = self.health("genconf", "--config", self.config(), "--name", "proof-gpu", "-o",
                           dest, *sim)
        r = self.run("genconf", argv, cap)
        forced = ""
        if r.rc == 1:  # not known-good: say why, and go on with what it saw
            forced = "; ".join(x.split("PROBLEM: ", 1)[1] for x in r.out.splitlines()
                               if "PROBLEM: " in x)
            r = self.run("genconf-force", argv + ["--force"], cap)
        if r.rc != 0 or not os.path.exists(dest):
            self.add(Line("genconf", "FAIL", f"exit {r.rc}", r.out[-400:], r.wall_s))
            return ""
        from resilient_slurm.config import tomllib

        with open(dest) as fh:
            text = fh.read()
        p = tomllib.loads(text)["health"]["profiles"]["proof-gpu"]
        fig = (f"{p['gpus']} GPU(s) {p['gpu_generation'] or 'generation?'}, NVLinks/GPU "
               f"{p['nvlinks_per_gpu']}, NVSwitch {p['nvswitch']}, PCIe gen{p['pcie_gen']} "
               f"x{p['pcie_width']}, EFA {p['efa']}, IB ports {p['ib_ports']}, dcgm "
               f"{'required' if p['require_dcgm'] else 'absent'}")
        self.add(Line("genconf", "PASS", fig, f"node not clean: {forced}" if forced else "",
                      r.wall_s, r.peak_rss_mib, p))
        return text

    def check(self, name: str, profile: str, cap: float, fault: str = "") -> None:
        cfg = self.config(profile or "\n")
        args = ["check", "--json", "--config", cfg,
                *(["--profile", "proof-gpu"] if profile else [])]
        if fault:  # the lab's NVML hang (a wedged driver) over the real one, or the dry run's node
            sim = ["--scenario", "healthy-p5"] if self.dry else []
            argv = [sys.executable, "-m", "resilient_slurm_lab.hardware.health", *sim,
                    "--nvml-hang", fault, *args]
        else:
            argv = self.health(*args, *(["--simulate", "healthy-p5"] if self.dry else []))
        r = self.run(name, argv, cap)
        try:  # the log holds the command line, then the JSON (and any stderr)
            report = json.loads(r.out[r.out.index("\n{") + 1:r.out.rindex("}") + 1])
        except ValueError:
            self.add(Line(name, "FAIL", f"exit {r.rc}, no JSON report", r.out[-400:], r.wall_s))
            return
        with open(os.path.join(self.out, f"{name}.json"), "w") as fh:
            json.dump(report, fh, indent=1)
        nvml = [x for x in report["results"] if x["check"] in NVML_CHECKS]
        if fault:
            bad = [x for x in nvml if (x["status"], x["code"]) != ("unknown", "NVML_TIMEOUT")]
            ok = r.rc == 3 and report["status"] == "unknown" and not bad and nvml \
                and r.wall_s < HEALTH_CFG["watchdog_s"]
            fig = (f"exit {r.rc}, status {report['status']} after {r.wall_s:.1f} s (NVML timeout "
                   f"{HEALTH_CFG['nvml_timeout_s']:g} s, watchdog {HEALTH_CFG['watchdog_s']:g} s)")
            detail = "; ".join(f"{x['check']} {x['status']} {x['code']}" for x in bad) or \
                next((x["reason"] for x in nvml), "")
            self.add(Line(name, "PASS" if ok else "FAIL", fig, detail, r.wall_s, r.peak_rss_mib))
            return
        skipped = [x for x in nvml if x["code"] == "SKIPPED"]  # e.g. fabric: no NVSwitch
        judged = [x for x in nvml if x not in skipped]
        blind = [x for x in judged if x["code"].startswith("NVML_") or x["status"] == "unknown"
                 or not x["evidence"]]
        ok = bool(judged) and not blind and r.rc in (0, 1, 3)
        fig = (f"exit {r.rc}, status {report['status']} in {r.wall_s:.1f} s, peak RSS "
               f"{r.peak_rss_mib:.0f} MiB, NVML checks with values: {len(judged) - len(blind)}/"
               f"{len(judged)} ({len(skipped)} not expected by the profile)")
        self.add(Line(name, "PASS" if ok else "FAIL", fig,
                      "; ".join(f"{x['check']}: {x['code']}" for x in blind), r.wall_s,
                      r.peak_rss_mib))
        for x in report["results"]:
            self.add(Line(f"  {x['check']}", "INFO", f"{x['status']} {x['code']}",
                          f"{x['reason']} | {x['evidence']}"))

    def train(self, name: str, argv: list[str], cap: float) -> Run | None:
        """Run a training command on the GPU; in a dry run, parse its arguments instead."""
        script = next(i for i, a in enumerate(argv) if a in (TRAIN, FAULTS_TRAIN))
        if self.dry or not self.gpu:
            why = "dry run" if self.dry else self.no_gpu
            self.add(Line(name, "SKIP", f"{why}: planned `{' '.join(argv[script:])[:300]}`",
                          self.plan_check(argv, script)))
            return None
        return self.run(name, argv, cap)

    def plan_check(self, argv: list[str], script: int) -> str:
        """Arguments parse as train_fsdp.py parses them (the fault flags as the lab's wrapper
        does); ft_launcher has the flags used."""
        rest = argv[script + 1:]
        if argv[script] == FAULTS_TRAIN:
            from resilient_slurm_lab.faults import train as wrapper
            from resilient_slurm_lab.faults.injector import parse_targeted

            faults, rest = wrapper.parser().parse_known_args(rest)
            parse_targeted(faults.fault)
        self._train_module().parse_args(rest)
        if script > 1:  # under ft_launcher
            flags = [a.split("=")[0] for a in argv[1:script] if a.startswith("--")]
            missing = [f for f in flags if f not in self.launcher_help(argv[0])]
            if missing:
                raise RuntimeError(f"ft_launcher lacks {missing}")
        return "arguments checked"

    def launcher_help(self, launcher: str) -> str:
        if not self._help:
            self._help = subprocess.run([launcher, "--help"], capture_output=True, text=True,
                                        timeout=120, env=self.env).stdout
        return self._help

    def _train_module(self) -> Any:
        if self._train is None:
            spec = importlib.util.spec_from_file_location("train_fsdp_plan", TRAIN)
            assert spec and spec.loader
            self._train = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(self._train)
        return self._train

    def ckpt(self, name: str) -> str:
        path = os.path.join(self.scratch, "ckpt", name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    def reference(self, cap: float) -> None:
        d = self.ckpt("reference")
        r = self.train("train-reference", py(TRAIN, "--checkpoint-dir", d, *self.small), cap)
        if r is None:
            return
        digests = re.findall(r"weights digest: ([0-9a-f]{64})", r.out)
        engine = re.search(r"world 1 on (\S+) \((\w+) checkpoints", r.out)
        where = engine.groups() if engine else ("?", "?")
        ok = r.rc == 0 and len(digests) == 1 and where == (self.device, "nvrx")
        self.digest = digests[0] if ok else ""
        self.add(Line("train-reference", "PASS" if ok else "FAIL",
                      f"digest {digests[0][:16] if digests else 'none'} in {r.wall_s:.1f} s on "
                      f"{where[0]} with {where[1]} async checkpoints",
                      "" if ok else f"exit {r.rc}: {r.out[-400:]}", r.wall_s, r.peak_rss_mib))
        shutil.rmtree(d, ignore_errors=True)

    def faults(self, cap: float) -> None:
        d = self.ckpt("faults")
        events = os.path.join(self.scratch, "faults-events.jsonl")
        launcher = os.path.join(os.path.dirname(sys.executable), "ft_launcher")
        newer = [f for f in FT_IF_KNOWN if f.split("=")[0] in self.launcher_help(launcher)]
        argv = [launcher, *FT, *newer, FAULTS_TRAIN, "--checkpoint-dir", d, *self.small,
                *FAULTS]
        self.env["RESILIENT_EVENTS_FILE"] = events
        try:
            r = self.train("train-faults", argv, cap)
        finally:
            del self.env["RESILIENT_EVENTS_FILE"]
        if r is None:
            return
        from resilient_slurm.events import EventKind, read_events

        evs = list(read_events(events))
        fired = [(e["type"], e["step"]) for e in evs if e["kind"] == EventKind.FAULT]
        resumes = [e["step"] for e in evs if e["kind"] == EventKind.RESUME]
        digests = re.findall(r"weights digest: ([0-9a-f]{64})", r.out)
        ok = (r.rc == 0 and bool(self.digest) and digests == [self.digest]
              and fired == [("exception", 12), ("sigkill", 27)] and len(resumes) == 3)
        self.add(Line("train-faults", "PASS" if ok else "FAIL",
                      f"digest {digests[0][:16] if digests else 'none'} "
                      f"{'==' if digests == [self.digest] else '!='} reference "
                      f"{self.digest[:16] or 'none'}; faults {fired}, resumed at {resumes}",
                      "" if ok else f"exit {r.rc}: {r.out[-400:]}", r.wall_s, r.peak_rss_mib))
        shutil.rmtree(d, ignore_errors=True)

    def stall(self, mode: str, cap: float) -> None:
        d = self.ckpt(f"stall-{mode}")
        extra = ["--sync-checkpoint"] if mode == "sync" else ["--checkpoint-backend", "nvrx"]
        big = BIG + (["--d-model", "256", "--heads", "4", "--vocab", "512"]
                     if self.rehearse else [])
        r = self.train(f"stall-{mode}", py(TRAIN, "--checkpoint-dir", d, *big, *extra),
                       cap)
        if r is None:
            return
        stalls = [float(x) for x in re.findall(r"save scheduled, stall ([\d.]+) ms", r.out)]
        sizes = [os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(d)
                 for f in files]
        gb = max(sizes, default=0) / 1e9
        ok = r.rc == 0 and len(stalls) == 2 and (gb > 2 or self.rehearse)
        if ok:
            self.stalls[mode] = stalls[0]
        first, second = (stalls + [float("nan")] * 2)[:2]
        self.add(Line(f"stall-{mode}", "PASS" if ok else "FAIL",
                      f"first save stalls training {first:.0f} ms for {gb:.2f} GB; second "
                      f"{second:.0f} ms (waits for the first write if still in flight)",
                      "" if ok else f"exit {r.rc}: {r.out[-400:]}", r.wall_s, r.peak_rss_mib,
                      {"stalls_ms": stalls, "state_gb": gb}))
        shutil.rmtree(d, ignore_errors=True)

    def compare_stalls(self) -> None:
        if self.dry or not self.gpu:
            return
        s, a = self.stalls.get("sync"), self.stalls.get("async")
        ok = bool(s and a and a < s)
        self.add(Line("stall-async-vs-sync", "PASS" if ok else "FAIL",
                      f"async {a or float('nan'):.0f} ms vs sync {s or float('nan'):.0f} ms: "
                      f"{(s / a) if (s and a) else float('nan'):.1f}x less training stall"))


def plan(p: Proof) -> list[tuple[str, float, Callable[[float], Any]]]:
    profile: dict[str, str] = {}
    return [
        ("environment", 20, p.environment),
        ("genconf", 20, lambda cap: profile.setdefault("text", p.genconf(cap))),
        ("health-check", 40, lambda cap: p.check("health-check", profile.get("text", ""), cap)),
        ("nvml-hang", 25, lambda cap: p.check("nvml-hang", profile.get("text", ""), cap,
                                              fault="temperature")),
        ("train-reference", 60, p.reference),
        ("train-faults", 120, p.faults),
        ("stall-sync", 70, lambda cap: p.stall("sync", cap)),
        ("stall-async", 70, lambda cap: p.stall("async", cap)),
        ("memory-tiers", 10, lambda cap: tiers_step(p, cap)),
        ("tiers-scale", 120, lambda cap: scale_step(p, cap)),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--wheels", default="")
    ap.add_argument("--install-seconds", type=float, default=None)
    ap.add_argument("--rehearse-on-cpu", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    p = Proof(os.path.abspath(a.out), os.path.abspath(a.scratch), a.dry_run)
    if a.rehearse_on_cpu:
        p.rehearse, p.device, p.small = True, "cpu", SMALL + ["--d-model", "64", "--heads", "4"]
    steps = plan(p)
    planned = INSTALL_CAP_S + sum(cap for _, cap, _ in steps)
    p.add(Line("budget", "PASS" if planned <= BUDGET_S else "FAIL",
               f"caps sum to {planned:g} s of {BUDGET_S} s (install {INSTALL_CAP_S} s + "
               + ", ".join(f"{n} {c:g}" for n, c, _ in steps) + ")"))
    p.add(install_line(a.install_seconds, a.wheels))
    t0 = time.monotonic()
    slow = 4 if a.dry_run or p.rehearse else 1  # a loaded CPU machine is slower than a GPU node
    for name, cap, fn in steps:
        try:
            fn(cap * slow)
        except Exception as exc:  # noqa: BLE001 - one broken step must not hide the others
            p.add(Line(name, "FAIL", f"{type(exc).__name__}: {exc}"[:300]))
    p.compare_stalls()
    return finish(p, time.monotonic() - t0 + (a.install_seconds or 0))


if __name__ == "__main__":
    sys.exit(main())
