"""The ``error_rates`` check's memory (healthcheck/checks_rates.py): a rise within the window
against the oldest sample kept, nothing judged on a first sample or after the counter fell
(a reset), an unchanged count not rewritten every run, samples kept across runs on disk."""

from __future__ import annotations

import os

from resilient_slurm.healthcheck.checks_rates import RateHistory


def test_a_rise_is_measured_from_the_oldest_sample_within_the_window(tmp_path):
    d = str(tmp_path / "state")
    os.makedirs(d, mode=0o700)
    h = RateHistory(d, now=1000.0)
    assert h.rise("gpu0/ecc_corrected", 10, 3600) is None  # first sample
    h.save()
    h = RateHistory(d, now=1100.0)  # a later run reads the samples back
    assert h.rise("gpu0/ecc_corrected", 510, 3600) == (500, 100.0)
    h.save()
    h = RateHistory(d, now=1000.0 + 3600 + 50)  # the first sample left the window
    assert h.rise("gpu0/ecc_corrected", 600, 3600) == (90, 3550.0)
    h = RateHistory(d, now=1100.0 + 10)
    assert h.rise("gpu0/ecc_corrected", 3, 3600) is None  # fell: the counter started again


def test_an_unchanged_count_is_not_rewritten_every_run(tmp_path):
    d = str(tmp_path / "state")
    os.makedirs(d, mode=0o700)
    h = RateHistory(d, now=0.0)
    h.rise("gpu1/nvlink_crc", 7, 800)
    h.save()
    h = RateHistory(d, now=2.0)
    assert h.rise("gpu1/nvlink_crc", 7, 800) == (0, 2.0)
    assert not h.changed  # nothing to write
    h = RateHistory(d, now=101.0)  # older than window / 8: sampled again
    h.rise("gpu1/nvlink_crc", 7, 800)
    assert h.changed and len(h.samples["gpu1/nvlink_crc"]) == 2


def test_no_state_directory_no_memory():
    h = RateHistory(None)
    assert h.rise("gpu0/ecc_corrected", 5, 60) is None
    h.save()  # nothing, no error
