"""Guard: the function NVRx's Wrapper re-enters keeps annotations it can check.

The Wrapper finds its ``CallWrapper`` parameter with ``issubclass(CallWrapper, annotation)`` on
every parameter. ``from __future__ import annotations`` turns annotations into strings and
every rank then dies before training (``issubclass() arg 2 must be a class``); a generic such
as ``Callable[...]`` fails the same way, and ``object`` would be replaced by the CallWrapper.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

pytestmark = pytest.mark.train

pytest.importorskip("torch")
nvrx = pytest.importorskip("nvidia_resiliency_ext.inprocess")

from nvidia_resiliency_ext.inprocess import param_utils  # noqa: E402

from resilient_slurm.training import inprocess  # noqa: E402


def test_wrapped_module_has_no_postponed_annotations() -> None:
    tree = ast.parse(Path(inprocess.__file__).read_text())
    futures = [a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "__future__" for a in node.names]
    assert "annotations" not in futures, (
        f"{inprocess.__file__} must not use `from __future__ import annotations`: the NVRx "
        "Wrapper checks the wrapped function's annotations with issubclass()")


def test_wrapper_can_bind_the_call_wrapper() -> None:
    params = inspect.signature(inprocess._iteration).parameters
    assert params["call"].annotation is nvrx.CallWrapper
    others = [p for name, p in params.items() if name != "call"]
    assert all(p.annotation is inspect.Parameter.empty for p in others)
    marker = object()
    args, kwargs = param_utils.substitute_param_value(  # what the Wrapper does per iteration
        inprocess._iteration, (None, "fn", "kept"), {}, {nvrx.CallWrapper: marker})
    assert list(args) == [marker, "fn", "kept"] and kwargs == {}
