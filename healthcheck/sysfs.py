"""The sysfs seam: EFA and InfiniBand ports under a configurable root.

Reads ``<root>/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}``. A device
is EFA when its driver link (``device/driver``) ends in ``efa`` (or, without the link, its name
starts with ``rdmap``/``efa``). Unreadable entries are recorded as errors, never as healthy.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

_RATE = re.compile(r"([\d.]+)\s*Gb/sec")


@dataclass
class Port:
    device: str
    port: str
    kind: str  # efa | ib | eth
    state: str = ""  # e.g. ACTIVE, DOWN
    phys_state: str = ""  # e.g. LinkUp
    rate_gbps: float | None = None
    error: str = ""

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass
class RdmaInventory:
    ports: list[Port] = field(default_factory=list)
    devices: dict[str, str] = field(default_factory=dict)  # device -> kind
    error: str = ""

    def count(self, kind: str) -> int:
        return sum(1 for k in self.devices.values() if k == kind)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read().strip()


def _word(value: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``; ``5: LinkUp`` -> ``LinkUp``."""
    return value.split(":", 1)[-1].strip()


def _kind(devdir: str, name: str) -> str:
    driver = os.path.join(devdir, "device", "driver")
    if os.path.islink(driver):
        drv = os.path.basename(os.readlink(driver))
        if drv == "efa":
            return "efa"
    elif name.startswith(("rdmap", "efa")):
        return "efa"
    return "ib"


def read_rdma(sysfs_root: str) -> RdmaInventory:
    inv = RdmaInventory()
    base = os.path.join(sysfs_root, "class", "infiniband")
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return inv  # no RDMA devices at all: the checks compare counts with the profile
    except OSError as exc:
        inv.error = f"{base}: {exc.strerror}"
        return inv
    for name in names:
        devdir = os.path.join(base, name)
        kind = _kind(devdir, name)
        try:
            ports = sorted(os.listdir(os.path.join(devdir, "ports")), key=lambda p: int(p))
        except (OSError, ValueError) as exc:
            inv.devices[name] = kind
            inv.ports.append(Port(name, "?", kind, error=f"ports unreadable: {exc}"))
            continue
        for pn in ports:
            pdir = os.path.join(devdir, "ports", pn)
            port = Port(name, pn, kind)
            try:
                port.state = _word(_read(os.path.join(pdir, "state")))
                port.phys_state = _word(_read(os.path.join(pdir, "phys_state")))
                m = _RATE.search(_read(os.path.join(pdir, "rate")))
                port.rate_gbps = float(m.group(1)) if m else None
                ll_path = os.path.join(pdir, "link_layer")
                if kind == "ib" and os.path.exists(ll_path) and _read(ll_path) == "Ethernet":
                    port.kind = kind = "eth"
            except OSError as exc:
                port.error = f"{exc.filename}: {exc.strerror}"
            inv.ports.append(port)
        inv.devices[name] = kind
    return inv


_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def nvidia_pci_devices(sysfs_root: str) -> list[str]:
    """PCI addresses bound to the nvidia driver, in bus order (NVML's default index order).

    Used to name a GPU in an Xid line when NVML cannot answer; [] when unreadable.
    """
    try:
        names = os.listdir(os.path.join(sysfs_root, "bus", "pci", "drivers", "nvidia"))
    except OSError:
        return []
    return sorted(n.lower() for n in names if _BDF.match(n))
