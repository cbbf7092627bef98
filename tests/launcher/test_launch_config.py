"""resilient-launch's command line as one frozen value (launcher/config.py): a field per click
parameter, built from the parsed parameters by its fields, and what it derives for the
supervisor and the straggler watch."""

from __future__ import annotations

import dataclasses

import pytest

from resilient_slurm.launcher import cli
from resilient_slurm.launcher.config import LaunchConfig
from resilient_slurm.launcher.recovery import straggler


def _parsed(*argv: str) -> LaunchConfig:
    ctx = cli.main.make_context("resilient-launch", list(argv))
    return LaunchConfig.from_params(**ctx.params)


def test_each_parameter_of_the_command_is_a_field_and_each_field_a_parameter() -> None:
    params = {p.name for p in cli.main.params if p.expose_value}
    assert params == {f.name for f in dataclasses.fields(LaunchConfig)}


def test_the_parsed_command_line_lands_in_its_fields() -> None:
    cfg = _parsed("--spares", "1", "--max-requeues", "7", "--ft-arg=--ft-x=1", "-m",
                  "--straggler-window", "9", "pkg.train", "--lr", "3e-4")
    assert (cfg.script, cfg.args, cfg.module) == ("pkg.train", ("--lr", "3e-4"), True)
    assert (cfg.spares, cfg.max_requeues, cfg.ft_args) == (1, 7, ("--ft-x=1",))
    assert cfg.straggler_window == 9 and cfg.max_restarts == 3  # a default from its option


def test_the_config_is_frozen() -> None:
    cfg = _parsed("train.py")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_requeues = 9  # type: ignore[misc]


def test_a_parameter_without_a_field_or_a_field_without_one_is_refused() -> None:
    params = cli.main.make_context("resilient-launch", ["train.py"]).params
    with pytest.raises(TypeError, match=r"without a field \['new_option'\]"):
        LaunchConfig.from_params(**params, new_option=1)
    del params["dry_run"]
    with pytest.raises(TypeError, match=r"fields without a parameter \['dry_run'\]"):
        LaunchConfig.from_params(**params)


def test_the_supervisor_settings_take_the_shared_fields_and_what_was_resolved() -> None:
    cfg = _parsed("--max-requeues", "7", "--max-strikes", "4", "--verdict-wait", "0",
                  "--metrics-dir", "/m", "--checkpoint-dir", "rel", "--max-blame-share", "0.3",
                  "train.py")
    s = cfg.supervisor_settings(checkpoint_dir="/abs/rel", state_dir="/s", min_nodes=2,
                                verdict_path="/v/{node}.json", spares=0)
    assert (s.max_requeues, s.max_strikes, s.verdict_wait, s.metrics_dir, s.max_blame_share) \
        == (7, 4, 0.0, "/m", 0.3)
    assert (s.checkpoint_dir, s.state_dir, s.min_nodes, s.verdict_path) == \
        ("/abs/rel", "/s", 2, "/v/{node}.json")
    assert s.straggler == straggler.StragglerSettings(
        straggler.DEFAULT_FACTOR, straggler.DEFAULT_WINDOW, 0.3, "exclude")


def test_a_blame_share_of_one_leaves_the_stragglers_their_own() -> None:
    # StragglerSettings refuses a share of 1: the fallback is what makes this pass
    cfg = _parsed("--max-blame-share", "1", "--on-straggler", "warn", "train.py")
    st = cfg.straggler_settings()
    assert (st.max_share, st.policy) == (straggler.DEFAULT_MAX_SHARE, "warn")
