"""The Prometheus textfile: node_exporter conventions, a file per writer (the prolog never
overwrites the HealthCheckProgram's series), label text escaped by prometheus_client."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from resilient_slurm.healthcheck.metrics import render, write_metrics, writer_path
from resilient_slurm.healthcheck.model import Report, Result


def _report(node: str = "n1", check_set: str = "periodic") -> Report:
    return Report(node, [Result("xid", "fail", "XID79", "fell off the bus", "xid=79",
                                device="gpu3"),
                         Result("xid", "warn", "XID13", "app error", "xid=13", device="gpu3"),
                         Result("gpu_count", "ok", "OK", "8 GPUs", "")],
                  check_set=check_set, duration_s=0.5)


def _series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, key
            out[key] = s.value
    return out


def test_one_series_per_state_help_type_and_info() -> None:
    text = render(_report(), "health")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(f"# HELP {name}" in text and f"# TYPE {name}" in text for name in fams)
    status = {s.labels["state"]: s.value for s in fams["resilient_health_status"].samples}
    assert status == {"ok": 0, "warn": 0, "unknown": 0, "fail": 1}
    xid = {s.labels["state"]: s.value for s in fams["resilient_health_check_state"].samples
           if s.labels["check"] == "xid"}
    assert xid == {"ok": 0, "warn": 0, "unknown": 0, "fail": 1}  # the worst of gpu3's two
    codes = {s.labels["code"] for s in fams["resilient_health_check_code"].samples}
    assert codes == {"XID79", "XID13"}
    (info,) = fams["resilient_slurm_build_info"].samples
    assert info.name == "resilient_slurm_build_info" and info.labels["version"]


def test_prolog_and_health_program_keep_each_others_series(tmp_path: Path) -> None:
    path = str(tmp_path / "textfile" / "rhc.prom")
    health = write_metrics(path, _report(), source="health")
    before = Path(health).read_text()
    prolog = write_metrics(path, _report(check_set="prolog"), source="prolog")
    epilog = write_metrics(path, _report(check_set="epilog"), source="epilog")
    assert len({health, prolog, epilog}) == 3 and health == path
    assert prolog == str(tmp_path / "textfile" / "rhc.prolog.prom")
    assert Path(health).read_text() == before  # all of the health program's series stay
    assert len(_series(before)) >= 19
    # node_exporter merges every *.prom of the directory: no series appears twice
    merged = "".join(Path(p).read_text() for p in (health, prolog, epilog))
    series = [line for line in merged.splitlines() if not line.startswith("#")]
    assert len(series) == len(set(line.rsplit(" ", 1)[0] for line in series))
    assert writer_path("/x/m", "epilog") == "/x/m.epilog.prom"
    # the node watcher's failing verdicts never replace the health program's series
    assert writer_path("/x/m", "watch") == "/x/m.watch.prom"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=20), st.text(max_size=20), st.text(max_size=10))
def test_any_label_text_round_trips(node: str, code: str, device: str) -> None:
    rep = Report(node, [Result("xid", "fail", code, "r", "e", device=device)])
    fams = {f.name: f for f in text_string_to_metric_families(render(rep, "check"))}
    (sample,) = fams["resilient_health_check_code"].samples
    assert sample.labels["node"] == node and sample.labels["code"] == code
    assert sample.labels["device"] == device
