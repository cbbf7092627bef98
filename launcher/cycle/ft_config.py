"""The user's own NVRx configuration: which settings their ``--ft-*`` flags and their
``--ft-cfg-path`` YAML file choose, so the launcher fills only the others (the user wins)."""

from __future__ import annotations

from collections.abc import Sequence


class FtConfigError(ValueError):
    """The user's ``--ft-cfg-path`` cannot be read, or has no ``fault_tolerance`` section."""


def ft_key(flag: str) -> str:
    """The NVRx setting a flag sets, whatever its spelling: ``--ft-rank_heartbeat_timeout``,
    ``--ft-param-rank_heartbeat_timeout`` -> ``rank_heartbeat_timeout`` (the
    ``fault_tolerance`` YAML key); ``--term-timeout`` -> ``term_timeout``."""
    name = flag.split("=", 1)[0].lstrip("-").lower().replace("_", "-")
    for prefix in ("ft-param-", "ft-"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return {"fault-tol-cfg-path": "cfg_path"}.get(name, name.replace("-", "_"))


def _ft_section(data: object) -> dict[str, object] | None:
    """NVRx's own search for the ``fault_tolerance`` mapping anywhere in a YAML document."""
    if isinstance(data, dict):
        if isinstance(data.get("fault_tolerance"), dict):
            return data["fault_tolerance"]
        items: list[object] = list(data.values())
    elif isinstance(data, list):
        items = list(data)
    else:
        return None
    for item in items:
        found = _ft_section(item)
        if found is not None:
            return found
    return None


def user_ft_settings(ft_args: Sequence[str]) -> frozenset[str]:
    """The NVRx settings the user chose (``ft_key`` names): their ``--ft-*`` (and other
    ft_launcher) flags, and the keys of the ``fault_tolerance`` section of the YAML file
    their ``--ft-cfg-path`` names. The launcher fills only the others."""
    keys = {ft_key(a) for a in ft_args if a.startswith("--")}
    paths = [a.split("=", 1)[1] for a in ft_args
             if "=" in a and ft_key(a) == "cfg_path"]
    for path in paths:
        try:
            import yaml  # type: ignore[import-untyped]  # NVRx's own dependency

            with open(path, encoding="utf-8") as fh:
                section = _ft_section(yaml.safe_load(fh))
        except (OSError, ImportError, ValueError) as exc:  # yaml.YAMLError is a ValueError
            raise FtConfigError(f"cannot read --ft-cfg-path {path}: {exc}") from None
        if section is None:
            raise FtConfigError(f"--ft-cfg-path {path}: no fault_tolerance section (NVRx "
                            "would ignore the file)")
        keys |= {str(k) for k in section}
    return frozenset(keys)
