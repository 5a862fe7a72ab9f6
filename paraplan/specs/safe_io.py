"""Reading user files as data, within bounds: every file a user names goes through here.

Inputs are data, never code, and never unbounded work. ``read_user_text`` refuses what is not
a regular file (``/dev/zero``, a FIFO, a directory) and files over a size limit before
reading them; ``parse_yaml`` / ``parse_json`` / ``parse_toml`` refuse duplicate keys, nesting
deeper than ``MAX_DEPTH``, YAML aliases that expand past ``MAX_NODES`` values (a "billion
laughs" bomb is a few hundred bytes), tags that would build Python objects, and integers too
long for Python to convert. Each failure is one ``SpecError`` naming the file (or field) and
the limit; nothing here formats the offending value whole.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

import yaml

from paraplan.specs.errors import SpecError, short_repr

MAX_SPEC_BYTES = 16 * 2**20
"""Largest spec, plan or trainer-config file read (16 MiB; the biggest bundled one is 80 KiB)."""
MAX_TABLE_BYTES = 256 * 2**20
"""Largest CSV table read (published runs, GEMM tables, region links)."""
MAX_DEPTH = 64
"""Deepest nesting of lists/mappings in a YAML or JSON input (real specs nest 4 deep)."""
MAX_NODES = 1_000_000
"""Most values a YAML document may expand to once its aliases are followed."""
MAX_INT_CHARS = 4_300
"""Longest integer literal read (Python's own limit for decimal text; hexadecimal, octal and
sexagesimal YAML integers are held to it too, as their conversion is unbounded work)."""


def read_user_text(path: str | Path, what: str, limit: int = MAX_SPEC_BYTES) -> str:
    """The UTF-8 text of the regular file ``path`` (``what`` names it in errors), refusing
    devices, FIFOs, directories and anything over ``limit`` bytes before reading it."""
    name = str(path)
    try:
        info = os.stat(name)
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read {what} file {_quote(name)}: "
                        f"{getattr(exc, 'strerror', None) or exc}", field=what,
                        value=name) from None
    if not stat.S_ISREG(info.st_mode):
        raise SpecError(f"{what} file {_quote(name)} is not a regular file (a device, FIFO or "
                        "directory); give the path of a file", field=what, value=name)
    if info.st_size > limit:
        raise SpecError(f"{what} file {_quote(name)} is {info.st_size:,} bytes, over the "
                        f"{limit:,}-byte limit for {what} files", field=what, value=name,
                        allowed=f"<= {limit} bytes")
    try:
        with open(name, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise SpecError(f"cannot read {what} file {_quote(name)}: {exc.strerror or exc}",
                        field=what, value=name) from None
    if len(data) > limit:  # grew while we looked
        raise SpecError(f"{what} file {_quote(name)} is over the {limit:,}-byte limit",
                        field=what, value=name, allowed=f"<= {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{what} file {_quote(name)} is not UTF-8 text (byte {exc.start})",
                        field=what, value=name) from None


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and says so when a tag asks for an object."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *base" merges; SafeConstructor.flatten_mapping handles it
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: the base class reports it
                continue
            if duplicate:
                raise _Duplicate(key, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


class _Duplicate(Exception):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(key)
        self.key, self.line = key, line


def _expanded_size(root: yaml.Node) -> tuple[int, int]:
    """(values, depth) of a composed YAML graph once aliases are followed, without expanding
    it: sizes and depths are memoised per node, so a bomb costs one pass over its nodes.

    Raises:
        _Cycle: an anchor is used inside its own value (``a: &a [*a]``), which has no size.
    """
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int"
              and len(node.value) > MAX_INT_CHARS):
            raise _LongInt(node.start_mark.line + 1)
        if not done:
            if key in open_nodes:
                raise _Cycle(node.start_mark.line + 1)
            open_nodes.add(key)
            stack.append((node, True))
            for child in children:
                if id(child) in open_nodes:
                    raise _Cycle(child.start_mark.line + 1)
                if id(child) not in sizes:
                    stack.append((child, False))
            continue
        open_nodes.discard(key)
        sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
        depths[key] = 1 + max((depths.get(id(c), 1) for c in children), default=0)
    return sizes[id(root)], depths[id(root)]


class _AtLine(Exception):
    """A refused YAML node and the line it starts on."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class _LongInt(_AtLine):
    """An integer literal over ``MAX_INT_CHARS``."""


class _Cycle(_AtLine):
    """An anchor used inside its own value."""


def parse_yaml(text: str, what: str, source: str) -> Any:
    """The data of one YAML document (``source`` names the file in errors)."""
    loader = None
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise _too_deep(what, source) from None
        if node is None:
            return None
        values, depth = _expanded_size(node)
        if depth > MAX_DEPTH:
            raise _too_deep(what, source)
        if values > MAX_NODES:
            raise SpecError(f"{what} file {_quote(source)} expands to more than {MAX_NODES:,} "
                            "values once its YAML aliases are followed; write the values out",
                            field=what, value=source, allowed=f"<= {MAX_NODES} values")
        return loader.construct_document(node)
    except _LongInt as big:
        raise SpecError(f"{what} file {_quote(source)} holds an integer of more than "
                        f"{MAX_INT_CHARS:,} characters (line {big.line})", field=what,
                        value=source) from None
    except _Cycle as cyc:
        raise SpecError(f"{what} file {_quote(source)} uses a YAML anchor inside its own value "
                        f"(line {cyc.line}), which never ends; write the values out",
                        field=what, value=source) from None
    except _Duplicate as dup:
        raise SpecError(f"{what} file {_quote(source)} sets {short_repr(dup.key)} twice "
                        f"(line {dup.line}); give each key once", field=what,
                        value=short_repr(dup.key)) from None
    except yaml.constructor.ConstructorError as exc:
        tag = getattr(getattr(exc, "problem", ""), "strip", lambda: "")()
        raise SpecError(f"{what} file {_quote(source)} uses a YAML tag that would build a "
                        f"Python object ({tag[:120]}); tags are refused, inputs are data",
                        field=what, value=source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{what} file {_quote(source)} is not valid YAML{where}", field=what,
                        value=source) from None
    except SpecError:
        raise
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise SpecError(f"{what} file {_quote(source)} holds a value Python cannot read: "
                        f"{str(exc)[:120]}", field=what, value=source) from None
    finally:
        if loader is not None:
            loader.dispose()


def parse_json(text: str, what: str, source: str) -> Any:
    """The data of one JSON document, refusing duplicate keys, deep nesting and NaN."""
    if _json_depth(text) > MAX_DEPTH:
        raise _too_deep(what, source)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise SpecError(f"{what} {_quote(source)} sets {_quote(k)} twice; give each key "
                                "once", field=what, value=k[:100])
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise SpecError(f"{what} {_quote(source)} holds {name}, which is not a number JSON "
                        "allows", field=what, value=name)

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except RecursionError:
        raise _too_deep(what, source) from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{what} {_quote(source)} is not valid JSON (line {exc.lineno}, column "
                        f"{exc.colno}: {exc.msg})", field=what, value=source) from None
    except ValueError as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(f"{what} {_quote(source)} holds a value Python cannot read: "
                        f"{str(exc)[:120]}", field=what, value=source) from None


def parse_toml(text: str, what: str, source: str) -> dict[str, Any]:
    """The data of one TOML document (duplicate keys are already an error in TOML)."""
    if _json_depth(text) > MAX_DEPTH or _toml_key_depth(text) > MAX_DEPTH:
        raise _too_deep(what, source)
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise _too_deep(what, source) from None
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise SpecError(f"{what} {_quote(source)} is not valid TOML: {str(exc)[:160]}",
                        field=what, value=source) from None
    if _has_huge_int(data):
        raise SpecError(f"{what} {_quote(source)} holds an integer of more than "
                        f"{MAX_INT_CHARS:,} digits", field=what, value=source)
    return data


def _toml_key_depth(text: str) -> int:
    """Most dot-separated parts in one TOML key or table header: dotted keys nest tables
    without brackets (``a.b.c = 1``), and tomllib's work grows with the square of the parts."""
    best = 0
    for line in text.splitlines():
        head = line.strip()
        if not head or head.startswith("#"):
            continue
        key = head.strip("[]") if head.startswith("[") else head.split("=", 1)[0]
        best = max(best, key.count(".") + 1)
    return best


def _has_huge_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value.bit_length() > MAX_INT_CHARS * 3.33
    if isinstance(value, dict):
        return any(_has_huge_int(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_huge_int(v) for v in value)
    return False


def _json_depth(text: str) -> int:
    """Deepest bracket nesting outside strings (a cheap bound checked before parsing)."""
    depth = best = 0
    in_str = escape = False
    for ch in text:
        if in_str:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def _too_deep(what: str, source: str) -> SpecError:
    return SpecError(f"{what} {_quote(source)} nests lists or mappings more than {MAX_DEPTH} "
                     "deep", field=what, value=source, allowed=f"<= {MAX_DEPTH} levels")


def _quote(text: str, limit: int = 200) -> str:
    """``repr`` of a name, cut to ``limit`` characters (error messages stay one short line)."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def dumps_json(data: Any, **kwargs: Any) -> str:
    """``json.dumps`` that writes standard JSON only: a non-finite number (which most parsers
    reject as ``NaN``/``Infinity``) becomes null."""
    default = kwargs.pop("default", None)
    plain = json.loads(json.dumps(data, default=default)) if default else data
    return json.dumps(_finite(plain), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
