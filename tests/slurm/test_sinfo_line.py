"""``sinfo -N -O NodeList:|,StateComplete:|,User:|,NodeAddr:|,Port:|,Reason:0`` lines (the one-node
read and the partition read before a requeue): properties over generated lines."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.slurm.parse import node_from_sinfo

NAME = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
BASE = st.sampled_from(["idle", "allocated", "mixed", "down", "future"])
FLAGS = st.lists(st.sampled_from(["drain", "not_responding", "reboot_requested", "completing",
                                  "reserved", "fail"]), max_size=3, unique=True)
REASON = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@given(NAME, BASE, FLAGS, st.sampled_from(["", "*", "~"]), NAME, REASON)
def test_a_line_parses_to_its_node(name, base, flags, suffix, user, reason) -> None:
    reason = reason.strip() or "none"
    line = f"{name}|{'+'.join([base, *flags])}{suffix}|{user}|10.0.0.1|6818|{reason}\n"
    node = node_from_sinfo(line)
    assert node is not None and node.name == name and node.addr == "10.0.0.1"
    assert node.port == 6818
    assert node.state == base.upper()
    assert node.flags == frozenset(f.upper() for f in flags)
    assert node.reason == reason  # a reason may hold "|": it comes last and is kept whole
    assert node.available == (base in ("idle", "allocated", "mixed") and not (
        set(flags) & {"drain", "not_responding", "reboot_requested", "fail"}))


@given(st.text(max_size=30).filter(lambda t: t.count("|") < 5))
def test_a_short_line_is_no_node(text: str) -> None:
    assert node_from_sinfo(text) is None
