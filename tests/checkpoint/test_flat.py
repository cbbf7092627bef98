"""The packed snapshot format: any nest of tensors (dtypes, shapes, empty, non-contiguous) and
plain values round-trips bitwise; the staging buffer is one per rank and reused; fill copies in
place like dcp.load."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from resilient_slurm.checkpoint import flat  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool,
          torch.float64, torch.uint8]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    t = (torch.rand(shape, generator=g) * 100).to(dtype)
    if draw(st.booleans()) and t.dim() == 2:
        t = t.t()  # non-contiguous
    return t


leaf = st.one_of(tensors(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
                 st.none())
nests = st.recursive(leaf, lambda kids: st.one_of(
    st.dictionaries(st.text("abcxyz", min_size=1, max_size=4), kids, max_size=4),
    st.lists(kids, max_size=3)), max_leaves=12)


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).contiguous().view(torch.uint8),
                                b.reshape(-1).contiguous().view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def packed(staged: flat.Staged) -> bytearray:
    return bytearray(b"".join(bytes(p) for p in staged.parts()))


@settings(max_examples=80, deadline=None)
@given(nests)
def test_any_state_round_trips_bitwise(state) -> None:
    staged = flat.Stager().stage(state)
    assert staged.event is None and staged.nbytes == len(packed(staged))
    assert same(flat.unpack(packed(staged)), state)


def test_staging_is_a_copy_and_the_buffer_is_reused() -> None:
    stager = flat.Stager()
    state = {"w": torch.ones(4, 4), "opt": [torch.zeros(3), {"step": 7}]}
    first = stager.stage(state)
    blob = packed(first)
    state["w"].add_(1)  # the training changes its tensors right after save returns
    assert torch.equal(flat.unpack(blob)["w"], torch.ones(4, 4))
    second = stager.stage(state)
    assert second.data.data_ptr() == first.data.data_ptr()  # one buffer per rank, reused
    assert torch.equal(flat.unpack(packed(second))["w"], torch.full((4, 4), 2.0))
    third = stager.stage({"w": torch.ones(8)})  # another layout: a new buffer
    assert third.data.numel() != first.data.numel()
    assert stager.pinned_bytes == 0  # CPU tensors: nothing pinned


def test_fill_copies_in_place_and_refuses_other_shapes() -> None:
    target = {"model": {"w": torch.zeros(2, 3)}, "optim": {"lr": 0.1, "state": [torch.zeros(2)]}}
    w = target["model"]["w"]
    saved = {"model": {"w": torch.arange(6.0).view(2, 3)},
             "optim": {"lr": 0.5, "state": [torch.ones(2)]}}
    flat.fill(target, flat.unpack(packed(flat.Stager().stage(saved))))
    assert target["model"]["w"] is w and torch.equal(w, torch.arange(6.0).view(2, 3))
    assert target["optim"]["lr"] == 0.5 and torch.equal(target["optim"]["state"][0],
                                                        torch.ones(2))
    with pytest.raises(flat.ShapeMismatch, match="/model/w"):
        flat.fill({"model": {"w": torch.zeros(3, 3)}}, saved)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_staged_through_pinned_memory() -> None:
    stager = flat.Stager()
    state = {"w": torch.randn(1024, 1024, device="cuda")}
    staged = stager.stage(state)
    assert staged.data.is_pinned() and staged.event is not None
    staged.event.synchronize()
    assert torch.equal(flat.unpack(packed(staged))["w"], state["w"].cpu())
    assert stager.pinned_bytes >= 4 * 1024 * 1024

