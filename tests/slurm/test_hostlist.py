import pytest
from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.slurm.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
        ("node1", ["node1"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("login,node[1-2]", ["login", "node1", "node2"]),
        ("rack1-n[001-002]", ["rack1-n001", "rack1-n002"]),
        ("", []),
    ],
)
def test_expand(expr: str, hosts: list[str]) -> None:
    assert expand(expr) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node]1", "node[3-1]", "node[a-b]", "n[[1]]",
                                 "node[1-3"])
def test_expand_rejects_malformed(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand(bad)


def test_compress_examples() -> None:
    assert compress(["node3", "node1", "node2", "node7"]) == "node[1-3,7]"
    assert compress(["gpu09", "gpu10"]) == "gpu[09-10]"
    assert compress(["login"]) == "login"
    assert compress(["node2", "node2"]) == "node2"
    assert compress([]) == ""


def test_compress_rejects_bad_names() -> None:
    with pytest.raises(HostlistError):
        compress(["node1", "bad name"])


names = st.builds(
    lambda prefix, num, pad: f"{prefix}{str(num).zfill(pad)}",
    st.sampled_from(["node", "gpu-", "a1b", "x"]),
    st.integers(min_value=0, max_value=1200),
    st.sampled_from([0, 0, 2, 3, 4]),
) | st.sampled_from(["login", "head", "gpu-a"])


@given(st.lists(names, max_size=40))
def test_roundtrip_keeps_exactly_the_names(hosts: list[str]) -> None:
    expr = compress(hosts)
    back = expand(expr)
    assert sorted(back) == sorted(set(hosts))
    assert len(back) == len(set(back))
    assert compress(back) == expr


@given(st.lists(names, max_size=40))
def test_expanding_twice_is_stable(hosts: list[str]) -> None:
    expr = compress(hosts)
    assert expand(compress(expand(expr))) == expand(expr)
