"""Pure evaluation of the RDMA inventory: EFA adapters and InfiniBand ports.

Every port counts: one DOWN port out of 32 fails the node (collectives crawl on fewer links).
"""

from __future__ import annotations

from resilient_slurm.healthcheck.config import ProfileSpec

from .model import FAIL, OK, UNKNOWN, Result
from .registry import PERIODIC, PROLOG, declare
from .sysfs import Port, RdmaInventory


def _port_findings(check: str, ports: list[Port], min_rate: float, prefix: str) -> list[Result]:
    out: list[Result] = []
    for p in ports:
        if p.error:
            out.append(Result(check, UNKNOWN, f"{prefix}_UNREADABLE", f"{p.name}: {p.error}",
                              f"{p.name} {p.error}", device=p.name))
        elif p.state != "ACTIVE":
            out.append(Result(check, FAIL, f"{prefix}_PORT_DOWN", f"{p.name} is {p.state or '?'} "
                              f"({p.phys_state or '?'})", f"{p.name} state={p.state} "
                              f"phys_state={p.phys_state}", action="drain", device=p.name))
        elif min_rate and (p.rate_gbps is None or p.rate_gbps < min_rate):
            out.append(Result(check, FAIL, f"{prefix}_PORT_RATE", f"{p.name} runs at "
                              f"{p.rate_gbps} Gb/s, expected >= {min_rate:g}",
                              f"{p.name} rate={p.rate_gbps}", action="drain", device=p.name))
    return out


@declare("efa", "rdma", (PROLOG, PERIODIC), context="profile")
def evaluate_efa(inv: RdmaInventory, profile: ProfileSpec) -> list[Result]:
    check = "efa"
    if inv.error:
        return [Result(check, UNKNOWN, "SYSFS_UNREADABLE", inv.error, inv.error)]
    want, have = profile.efa, inv.count("efa")
    if not want and not have:
        return [Result(check, OK, "SKIPPED", "no EFA expected by the profile")]
    out: list[Result] = []
    if want and have < want:
        out.append(Result(check, FAIL, "EFA_COUNT", f"{have} EFA adapters, profile expects "
                          f"{want}", f"efa={have} expected={want}", action="drain"))
    ports = [p for p in inv.ports if p.kind == "efa"]
    out += _port_findings(check, ports, profile.efa_min_rate_gbps, "EFA")
    if out:
        return out
    return [Result(check, OK, "OK", f"{have} EFA adapters, {len(ports)} ports ACTIVE",
                   f"efa={have}")]


@declare("infiniband", "rdma", (PROLOG, PERIODIC), context="profile")
def evaluate_infiniband(inv: RdmaInventory, profile: ProfileSpec) -> list[Result]:
    check = "infiniband"
    if inv.error:
        return [Result(check, UNKNOWN, "SYSFS_UNREADABLE", inv.error, inv.error)]
    ports = [p for p in inv.ports if p.kind == "ib"]
    want = profile.ib_ports
    if not want and not ports:
        return [Result(check, OK, "SKIPPED", "no InfiniBand expected by the profile")]
    out: list[Result] = []
    if want and len(ports) < want:
        out.append(Result(check, FAIL, "IB_COUNT", f"{len(ports)} InfiniBand ports, profile "
                          f"expects {want}", f"ib_ports={len(ports)} expected={want}",
                          action="drain"))
    out += _port_findings(check, ports, profile.ib_min_rate_gbps, "IB")
    return out or [Result(check, OK, "OK", f"{len(ports)} InfiniBand ports ACTIVE")]
