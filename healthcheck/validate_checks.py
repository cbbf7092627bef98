"""The return-to-service validation set's own checks: bandwidth against a per-profile floor.

Run only in the ``validate`` check set (``resilient-health validate``, the repair loop's proof
before one of our drains is lifted), beside ``dcgm_diag`` at the repair level:

* ``allreduce_bw``: a single-node all-reduce over every GPU. nccl-tests' ``all_reduce_perf``
  when installed, else the torch.distributed probe (``python -m
  resilient_slurm.training.allreduce_probe``, run as a separate process: a hook never imports
  torch); both print nccl-tests' ``# Avg bus bandwidth : X`` line (GB/s). Below the profile's
  ``allreduce_busbw_gbps`` floor: ``fail``.
* ``loopback_bw``: the node's RDMA fabric against itself, ``fi_pingpong -p efa`` (EFA
  profiles) or ``ib_write_bw`` (InfiniBand profiles), a server and a client on this host. The
  largest message's bandwidth against ``loopback_gbps`` (Gbit/s).

A missing tool, a timeout, output without the figure: ``unknown`` (never a pass). A profile
without a floor has nothing to prove the figure against: ``unknown`` too, with the key to set,
so an unconfigured validation keeps the node out rather than waving it through.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from resilient_slurm.proc import MISSING, TIMEOUT, Outcome
from resilient_slurm.proc import OK as RAN

from .config import ProfileSpec
from .model import FAIL, OK, UNKNOWN, Result
from .registry import declare

VALIDATE = "validate"
_AVG_BUSBW = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9]+(?:\.[0-9]+)?)\s*$", re.M)


def busbw_gbps(stdout: str) -> float | None:
    """nccl-tests' ``# Avg bus bandwidth : 123.45`` (GB/s), the last one printed."""
    found = _AVG_BUSBW.findall(stdout)
    return float(found[-1]) if found else None


_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _size(word: str) -> float | None:
    """``1048576``, ``1m``, ``4k`` -> bytes."""
    word = word.strip().lower()
    mult = _SUFFIX.get(word[-1:], 1)
    digits = word[:-1] if word[-1:] in _SUFFIX else word
    try:
        return float(digits) * mult
    except ValueError:
        return None


def _column(stdout: str, header_word: str) -> list[tuple[float, float]]:
    """(message bytes, value) for each row of the table whose header line holds
    ``header_word``: the first column is the size, the value is in the header's column."""
    rows: list[tuple[float, float]] = []
    index = None
    for line in stdout.splitlines():
        words = line.split()
        if header_word in words:
            index = words.index(header_word)
            continue
        if index is None or len(words) <= index:
            continue
        size = _size(words[0])
        try:
            value = float(words[index])
        except ValueError:
            continue
        if size is not None:
            rows.append((size, value))
    return rows


def fi_pingpong_gbps(stdout: str) -> float | None:
    """fabtests' table (``bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec``): the
    largest message's MB/sec, in Gbit/s."""
    rows = _column(stdout, "MB/sec")
    return max(rows)[1] * 8 / 1000.0 if rows else None


def ib_write_bw_gbps(stdout: str) -> float | None:
    """perftest's table (``#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec]
    MsgRate[Mpps]``, with ``--report_gbits``): the largest message's average."""
    text = stdout.replace("BW peak[Gb/sec]", "BW_peak").replace("BW average[Gb/sec]",
                                                                   "BW_average")
    rows = _column(text, "BW_average")
    if not rows:
        return None
    return max(rows)[1]


@dataclass(frozen=True)
class Probe:
    """What a bandwidth probe ran (the tool's outcome) and which tool it was."""

    tool: str
    outcome: Outcome


def _judge(check: str, code: str, probe: Probe, figure: float | None, floor: float,
           unit: str, floor_key: str) -> list[Result]:
    out = probe.outcome
    evidence = f"{' '.join(out.argv)}: {out.describe()}"
    if out.kind == MISSING:
        return [Result(check, UNKNOWN, f"{code}_MISSING", f"{probe.tool} not installed: "
                       "nothing proves the bandwidth", evidence)]
    if out.kind == TIMEOUT:
        return [Result(check, UNKNOWN, f"{code}_TIMEOUT", out.describe(), evidence)]
    if out.kind != RAN:
        return [Result(check, UNKNOWN, f"{code}_ERROR", out.describe(), evidence)]
    if figure is None:
        return [Result(check, UNKNOWN, f"{code}_UNPARSEABLE", f"{probe.tool} printed no "
                       "bandwidth figure", out.stdout[-300:])]
    if floor <= 0:
        return [Result(check, UNKNOWN, f"{code}_NO_FLOOR", f"{probe.tool}: {figure:g} {unit}, "
                       f"but the profile sets no floor ({floor_key})", evidence)]
    if figure < floor:
        return [Result(check, FAIL, f"{code}_LOW", f"{probe.tool}: {figure:g} {unit} below "
                       f"the floor {floor:g}", evidence)]
    return [Result(check, OK, "OK", f"{probe.tool}: {figure:g} {unit} (floor {floor:g})")]


@declare("allreduce_bw", "allreduce", (VALIDATE,), context="profile")
def check_allreduce(probe: Probe, profile: ProfileSpec) -> list[Result]:
    return _judge("allreduce_bw", "ALLREDUCE", probe, busbw_gbps(probe.outcome.stdout),
                  profile.allreduce_busbw_gbps, "GB/s", "allreduce_busbw_gbps")


@declare("loopback_bw", "loopback", (VALIDATE,), context="profile")
def check_loopback(probe: Probe | None, profile: ProfileSpec) -> list[Result]:
    if probe is None:
        return [Result("loopback_bw", OK, "SKIPPED", "the profile names no EFA or InfiniBand "
                       "adapter: no fabric to prove")]
    parse = fi_pingpong_gbps if probe.tool == "fi_pingpong" else ib_write_bw_gbps
    return _judge("loopback_bw", "LOOPBACK", probe, parse(probe.outcome.stdout),
                  profile.loopback_gbps, "Gbit/s", "loopback_gbps")


def allreduce_argv(gpus: int) -> list[str]:
    """nccl-tests on every GPU of the node, one 256 MiB message, 20 timed iterations."""
    return ["all_reduce_perf", "-b", "256M", "-e", "256M", "-g", str(max(1, gpus)), "-n", "20",
            "-w", "5"]


def loopback_argvs(profile: ProfileSpec) -> tuple[str, Sequence[str], Sequence[str]] | None:
    """(tool, server argv, client argv) for the profile's fabric, or None without one."""
    if profile.efa:
        base = ["fi_pingpong", "-p", "efa", "-e", "rdm", "-S", "1048576", "-I", "200"]
        return "fi_pingpong", base, [*base, "127.0.0.1"]
    if profile.ib_ports:
        base = ["ib_write_bw", "-s", "1048576", "-D", "2", "--report_gbits"]
        return "ib_write_bw", base, [*base, "127.0.0.1"]
    return None
