"""The fakes a scenario is made of: an NVML stand-in, a sysfs tree, tool executables.

Each fake sits at one seam and behaves like the real thing there: :class:`FakeNvml` raises
``GpuError`` (``resilient_slurm.healthcheck.gpu``) with NVML's error names (or blocks forever,
like a wedged driver);
:func:`write_sysfs` writes files the real reader parses; :func:`write_tools` writes small
``/bin/sh`` executables run by the real runner (so timeouts and group kills are real).
"""

from __future__ import annotations

import json
import os
import shlex
import threading
from typing import Any

from resilient_slurm.healthcheck.gpu import GpuError

# p5.48xlarge GPU bus ids, by NVML index.
P5_PCI = ["00000000:53:00.0", "00000000:64:00.0", "00000000:75:00.0", "00000000:86:00.0",
          "00000000:97:00.0", "00000000:A8:00.0", "00000000:B9:00.0", "00000000:CA:00.0"]
_HANG = threading.Event()  # never set: a "hung" call waits on it forever (daemon thread)


def _hang() -> None:
    _HANG.wait()


class FakeNvml:
    """A ``GpuBackend`` answering from scenario data.

    ``nvml``: ``behavior`` = ok | hang | init_error | library_missing, ``error`` (NVML error
    name for init_error), ``driver``, ``count``. ``gpu``: field defaults; ``gpus.<i>``:
    per-GPU overrides. A field whose value is an upper-case string (``"NOT_SUPPORTED"``,
    ``"GPU_IS_LOST"``) raises that error, ``"HANG"`` blocks; ``lost = true`` loses the GPU.
    """

    def __init__(self, nvml: dict[str, Any], defaults: dict[str, Any],
                 gpus: dict[str, dict[str, Any]]) -> None:
        self.nvml, self.defaults, self.gpus = nvml, defaults, gpus

    def init(self) -> None:
        behavior = self.nvml.get("behavior", "ok")
        if behavior == "hang":
            _hang()
        if behavior == "library_missing":
            raise GpuError("LIBRARY_NOT_FOUND", "libnvidia-ml.so.1: cannot open shared object")
        if behavior == "init_error":
            raise GpuError(str(self.nvml.get("error", "DRIVER_NOT_LOADED")))

    def shutdown(self) -> None:
        pass

    def driver_version(self) -> str:
        return str(self.nvml.get("driver", "550.90.07"))

    def count(self) -> int:
        return int(self.nvml.get("count", 8))

    def _get(self, i: int, key: str) -> Any:
        if not 0 <= i < self.count():
            raise GpuError("INVALID_ARGUMENT", f"no GPU {i}")
        over = self.gpus.get(str(i), {})
        if over.get("lost"):
            raise GpuError("GPU_IS_LOST", f"gpu{i} fell off the bus")
        value = over.get(key, self.defaults.get(key))
        if value == "HANG":
            _hang()
        if isinstance(value, str) and value.isupper() and key not in ("name", "pci"):
            raise GpuError(value)
        if value is None:
            raise GpuError("NOT_SUPPORTED", f"scenario gives no {key}")
        return value

    def pci(self, i: int) -> str:
        over = self.gpus.get(str(i), {})
        return str(over.get("pci") or (P5_PCI[i] if i < len(P5_PCI)
                                       else f"00000000:{0x10 + i:02X}:00.0"))

    def identity(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.count():
            raise GpuError("INVALID_ARGUMENT", f"no GPU {i}")
        over = self.gpus.get(str(i), {})
        pci = self.pci(i)
        # A lost GPU still has a handle and a bus id (from the PCI probe); its queries fail.
        name = over.get("name", self.defaults.get("name", ""))
        arch = over.get("architecture", self.defaults.get("architecture"))
        return {"name": str(name), "uuid": f"GPU-sim-{i:04d}", "pci": pci, "architecture": arch}

    def ecc_uncorrected(self, i: int) -> tuple[int, int]:
        vol, agg = self._get(i, "ecc")
        return int(vol), int(agg)

    def ecc_mode(self, i: int) -> tuple[bool, bool]:
        current, pending = self._get(i, "ecc_mode")
        return bool(current), bool(pending)

    def utilization(self, i: int) -> int:
        return int(self._get(i, "utilization"))

    def remapped_rows(self, i: int) -> tuple[int, int, bool, bool]:
        c, u, p, f = self._get(i, "remapped_rows")
        return int(c), int(u), bool(p), bool(f)

    def retired_pages(self, i: int) -> tuple[int, bool]:
        n, p = self._get(i, "retired_pages")
        return int(n), bool(p)

    def clock_reasons(self, i: int) -> int:
        return int(self._get(i, "clock_reasons"))

    def temperature(self, i: int) -> int:
        return int(self._get(i, "temperature"))

    def nvlink(self, i: int) -> list[bool]:
        v = self._get(i, "nvlink")
        return [True] * int(v) if isinstance(v, int) else [bool(x) for x in v]

    def pcie(self, i: int) -> tuple[int, int, int, int]:
        a, b, c, d = self._get(i, "pcie")
        return int(a), int(b), int(c), int(d)

    def fabric(self, i: int) -> str:
        return str(self._get(i, "fabric"))

    def recovery_action(self, i: int) -> int:
        return int(self._get(i, "recovery_action"))

    def processes(self, i: int) -> list[int]:
        return [int(p) for p in self._get(i, "processes")]

    def memory_used_mib(self, i: int) -> int:
        return int(self._get(i, "memory"))

    def ecc_corrected(self, i: int) -> int:
        return int(self._get(i, "ecc_corrected"))

    def nvlink_crc(self, i: int) -> int:
        return int(self._get(i, "nvlink_crc"))


class HangingNvml:
    """Any ``GpuBackend`` (the real pynvml one too) with one call that never
    returns, as on a wedged driver: ``call`` is a backend method name (``init``, ``count``,
    ``temperature`` ...). Every other call goes to the wrapped backend unchanged."""

    def __init__(self, inner: Any, call: str) -> None:
        if not callable(getattr(inner, call, None)) or call.startswith("_"):
            raise ValueError(f"no NVML seam call {call!r}")
        self._inner, self._call = inner, call

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name != self._call:
            return value

        def hung(*args: Any) -> Any:
            _hang()

        return hung


def _w(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")


def write_gpu_pci(root: str, pcis: list[str]) -> None:
    """``<root>/bus/pci/drivers/nvidia/<bdf>`` entries for the simulated GPUs."""
    drv = os.path.join(root, "bus", "pci", "drivers", "nvidia")
    os.makedirs(drv, exist_ok=True)
    for pci in pcis:
        os.makedirs(os.path.join(drv, pci.lower()[-12:]), exist_ok=True)


def write_sysfs(root: str, rdma: dict[str, Any]) -> None:
    """``<root>/class/infiniband/...`` for ``efa`` adapters and ``ib`` ports.

    Keys: ``efa``, ``efa_rate``, ``efa_down`` (adapter indices), ``ib``, ``ib_rate``,
    ``ib_down``, ``unreadable`` (the class dir is not a directory), ``port_unreadable``
    (EFA adapter indices whose port state cannot be read).
    """
    base = os.path.join(root, "class", "infiniband")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    if rdma.get("unreadable"):
        _w(base, "garbage")
        return
    os.makedirs(base, exist_ok=True)
    drivers = os.path.join(root, "bus", "pci", "drivers")
    os.makedirs(os.path.join(drivers, "efa"), exist_ok=True)
    os.makedirs(os.path.join(drivers, "mlx5_core"), exist_ok=True)
    devices = [(f"rdmap{16 + i}s0", "efa", i) for i in range(int(rdma.get("efa", 0)))]
    devices += [(f"mlx5_{i}", "mlx5_core", i) for i in range(int(rdma.get("ib", 0)))]
    for name, driver, i in devices:
        efa = driver == "efa"
        down = i in rdma.get("efa_down" if efa else "ib_down", [])
        rate = rdma.get("efa_rate" if efa else "ib_rate",
                        "100 Gb/sec" if efa else "400 Gb/sec (4X NDR)")
        dev = os.path.join(base, name)
        os.makedirs(os.path.join(dev, "device"), exist_ok=True)
        os.symlink(os.path.join("..", "..", "..", "..", "bus", "pci", "drivers", driver),
                   os.path.join(dev, "device", "driver"))
        port = os.path.join(dev, "ports", "1")
        if efa and i in rdma.get("port_unreadable", []):
            os.makedirs(os.path.join(port, "state"), exist_ok=True)  # read() -> EISDIR
        else:
            _w(os.path.join(port, "state"), "1: DOWN" if down else "4: ACTIVE")
        _w(os.path.join(port, "phys_state"), "3: Disabled" if down else "5: LinkUp")
        _w(os.path.join(port, "rate"), str(rate))
        _w(os.path.join(port, "link_layer"), "Unspecified" if efa else "InfiniBand")


def _diag_json(result: str) -> str:
    names = ["software", "pcie", "memory", "diagnostic"]
    status = {"pass": "Pass", "fail": "Fail", "skip": "Skip"}[result]
    tests = [{"name": n, "results": [{"gpu_id": "0", "status": "Pass" if k else status}]}
             for k, n in enumerate(names)]
    return json.dumps({"DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": tests}]}})


def _script(bindir: str, name: str, spec: dict[str, Any],
            cases: dict[str, tuple[str, int]]) -> None:
    behavior = spec.get("behavior", "ok")
    path = os.path.join(bindir, name)
    if behavior == "missing":
        return
    body = ["#!/bin/sh"]
    if spec.get("argv_log"):  # tests: what the engine asked of the tool, one line per call
        body.append(f'echo "$*" >> {shlex.quote(str(spec["argv_log"]))}')
    if spec.get("delay_s"):  # a slow but healthy tool
        body.append(f"sleep {float(spec['delay_s']):g}")
    if behavior == "hang":
        body += ["sleep 3600", "exit 0"]
    elif behavior == "garbage":
        body += ["echo '\\x00\\x13 ### garbage ### {not json'", "exit 0"]
    elif behavior == "exit":
        body += [f"echo '{name}: error from scenario' >&2", f"exit {int(spec.get('exit_code', 1))}"]
    else:
        body.append('case "$1" in')
        for arg, (text, rc) in cases.items():
            out = f".{name}.{arg}.out"
            _w(os.path.join(bindir, out), text)
            body.append(f'  {arg}) cat "$(dirname "$0")"/{shlex.quote(out)}; exit {rc};;')
        body += ["esac", "exit 0"]
    _w(path, "\n".join(body))
    os.chmod(path, 0o644 if behavior == "denied" else 0o755)


_UNIT_STATES = {"active": ("loaded", "active", "running"),
                "inactive": ("loaded", "inactive", "dead"),
                "failed": ("loaded", "failed", "failed"),
                "activating": ("loaded", "activating", "start"),
                "not-found": ("not-found", "inactive", "dead")}


def _systemctl_show(state: str) -> str:
    load, active, sub = _UNIT_STATES.get(state, ("loaded", state, "dead"))
    return f"LoadState={load}\nActiveState={active}\nSubState={sub}"


def write_systemctl(bindir: str, spec: dict[str, Any]) -> None:
    """``systemctl show ... <unit>`` answering for the fabric manager and IMEX units as
    ``tools.systemctl`` says (``fabricmanager`` / ``imex`` = active | inactive | failed |
    activating | not-found; default active / not-found); other units are not-found."""
    behavior = spec.get("behavior", "ok")
    if behavior != "ok":
        _script(bindir, "systemctl", spec, {})
        return
    units = {"nvidia-fabricmanager.service": str(spec.get("fabricmanager", "active")),
             "nvidia-imex.service": str(spec.get("imex", "not-found"))}
    body = ["#!/bin/sh"]
    if spec.get("delay_s"):
        body.append(f"sleep {float(spec['delay_s']):g}")
    body += ['[ "$1" = show ] || exit 1', 'for unit in "$@"; do :; done', 'case "$unit" in']
    for unit, state in units.items():
        out = f".systemctl.{unit}.out"
        _w(os.path.join(bindir, out), _systemctl_show(state))
        body.append(f'  {unit}) cat "$(dirname "$0")"/{shlex.quote(out)};;')
    body += [f"  *) printf '%s\\n' '{_systemctl_show('not-found')}';;", "esac", "exit 0"]
    path = os.path.join(bindir, "systemctl")
    _w(path, "\n".join(body))
    os.chmod(path, 0o755)


def write_tools(bindir: str, tools: dict[str, Any]) -> None:
    """Executables ``dcgmi``, ``fi_info`` and ``systemctl`` behaving as ``tools.<name>`` says.

    ``behavior``: ok | missing | hang | garbage | exit (with ``exit_code``) | denied (not
    executable). ``dcgmi``: ``diag`` = pass | fail | skip, ``health`` = Healthy | Warning |
    Failure. ``fi_info``: ``provider`` = true | false. ``systemctl``: see
    :func:`write_systemctl`. ``argv_log``: a file each call appends its arguments to (one line
    per call), for tests of what the engine runs.
    """
    os.makedirs(bindir, exist_ok=True)
    dcgmi = tools.get("dcgmi", {})
    diag = str(dcgmi.get("diag", "pass"))
    health = json.dumps({"body": {"Overall Health": {"value": dcgmi.get("health", "Healthy")}}})
    _script(bindir, "dcgmi", dcgmi, {
        "diag": (_diag_json(diag), 226 if diag == "fail" else 0),
        "health": (health, 0),
    })
    fi = tools.get("fi_info", {})
    provider = fi.get("provider", True)
    text = ("provider: efa\n    fabric: efa\n    domain: rdmap16s0-rdm\n    version: 122.0\n"
            "    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA" if provider
            else "fi_getinfo: -61 (No data available)")
    _script(bindir, "fi_info", fi, {"-p": (text, 0 if provider else 1)})
    write_systemctl(bindir, tools.get("systemctl", {}))
    write_validation_tools(bindir, tools)


# nccl-tests' and fabtests'/perftest's output shapes, trimmed to what the validation reads.
_NCCL_OUT = """# nThread 1 nGpus {gpus} minBytes 268435456 maxBytes 268435456 step: 1048576(bytes)
#       size         count      type   redop    root     time   algbw   busbw #wrong
   268435456      67108864     float     sum      -1   1234.5  {alg:.2f}  {bus:.2f}      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : {bus:.2f}
"""
_FI_OUT = """bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
1m      200     =200     400m        0.04s    {mbs:.2f}     {usec:.2f}       0.00
"""
_IB_OUT = """ #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 1048576    5000             {gbps:.2f}             {gbps:.2f}               0.011
"""


def write_validation_tools(bindir: str, tools: dict[str, Any]) -> None:
    """``all_reduce_perf`` (``busbw_gbps``), ``fi_pingpong`` / ``ib_write_bw`` (``gbps``: a
    client, the call whose last argument is an address, prints its table; the server waits)
    and ``nvidia-smi`` (``--gpu-reset`` answers as ``reset`` = ok | fail says), each also
    ``behavior`` = ok | missing | hang | garbage | exit as for the other tools."""
    nccl = tools.get("all_reduce_perf", {})
    bus = float(nccl.get("busbw_gbps", 450.0))
    _script(bindir, "all_reduce_perf", nccl,
            {"-b": (_NCCL_OUT.format(gpus=8, alg=bus * 8 / 14, bus=bus), 0)})
    for name, template in (("fi_pingpong", _FI_OUT), ("ib_write_bw", _IB_OUT)):
        spec = tools.get(name, {})
        gbps = float(spec.get("gbps", 90.0))
        if spec.get("behavior", "ok") != "ok":
            _script(bindir, name, spec, {})
            continue
        out = f".{name}.out"
        _w(os.path.join(bindir, out), template.format(mbs=gbps * 125.0, usec=8.0, gbps=gbps))
        body = ["#!/bin/sh", 'for last in "$@"; do :; done',
                'case "$last" in *.*.*.*) ;; *) exec sleep 30;; esac']
        if spec.get("delay_s"):
            body.append(f"sleep {float(spec['delay_s']):g}")
        body += [f'cat "$(dirname "$0")"/{shlex.quote(out)}', "exit 0"]
        _w(os.path.join(bindir, name), "\n".join(body))
        os.chmod(os.path.join(bindir, name), 0o755)
    smi = tools.get("nvidia_smi", {})
    reset_ok = str(smi.get("reset", "ok")) == "ok"
    _script(bindir, "nvidia-smi", smi, {
        "--gpu-reset": ("GPU 00000000:53:00.0 was successfully reset." if reset_ok else
                        "Unable to reset GPU 00000000:53:00.0: In use by another client",
                        0 if reset_ok else 255)})
