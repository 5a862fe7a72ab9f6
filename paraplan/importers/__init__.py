"""Trainer configs read back into plans: the configs ``paraplan export`` writes (and a user's
own), so ``paraplan simulate --plan run.sh`` prices the config a user runs today.

``read_trainer_config(path)`` recognises a Megatron-LM launch (a ``MEGATRON_ARGS=(...)`` array
or ``--flag value`` text), a torchtitan TOML, a DeepSpeed config JSON and a nanotron YAML, and
returns an :class:`ImportedConfig` (None for any other file). Inputs are data: ``shlex`` and
``specs.safe_io``'s bounded TOML, JSON and YAML parsers only.
"""

from __future__ import annotations

from pathlib import Path

from paraplan.importers.common import ImportedConfig, ImportError_
from paraplan.importers.deepspeed import looks_like_deepspeed, read_deepspeed
from paraplan.importers.megatron import looks_like_megatron, read_megatron
from paraplan.importers.nanotron import looks_like_nanotron, read_nanotron
from paraplan.importers.torchtitan import looks_like_torchtitan, parse_toml, read_torchtitan
from paraplan.specs.errors import SpecError
from paraplan.specs.safe_io import parse_json, parse_yaml


def read_trainer_config(path: Path, text: str) -> ImportedConfig | None:
    """The plan of a trainer config file (its ``text``), or None when it is not one."""
    suffix = path.suffix.lower()
    where = str(path)
    if suffix in (".sh", ".bash", ".args", ".txt") or looks_like_megatron(text):
        return read_megatron(text, where) if looks_like_megatron(text) else None
    if suffix == ".toml":
        data = parse_toml(text, where)
        return read_torchtitan(data, where) if looks_like_torchtitan(data) else None
    if suffix == ".json":
        data = parse_json(text, "trainer config", where)
        return read_deepspeed(data, where) if looks_like_deepspeed(data) else None
    if suffix in (".yaml", ".yml"):
        data = parse_yaml(text, "trainer config", where)
        return read_nanotron(data, where) if looks_like_nanotron(data) else None
    if not suffix:  # no suffix (``best --export torchtitan --out run``): the content says
        return _sniff(text, where)
    return None


def _sniff(text: str, where: str) -> ImportedConfig | None:
    """A config written without a suffix, recognised by its content: the first of TOML
    (torchtitan), JSON (DeepSpeed) and YAML (nanotron) that parses and looks like one."""
    readers = ((lambda: parse_toml(text, where), looks_like_torchtitan, read_torchtitan),
               (lambda: parse_json(text, "trainer config", where), looks_like_deepspeed,
                read_deepspeed),
               (lambda: parse_yaml(text, "trainer config", where), looks_like_nanotron,
                read_nanotron))
    for parse, looks, read in readers:
        try:
            data = parse()
        except SpecError:
            continue
        if isinstance(data, dict) and looks(data):
            return read(data, where)
    return None


__all__ = ["ImportError_", "ImportedConfig", "read_trainer_config"]
