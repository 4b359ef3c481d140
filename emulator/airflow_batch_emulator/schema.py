"""Make a deterministic JSON value that conforms to a JSON Schema (the subset LLM structured output uses).

Handles objects (properties/required), arrays (items, min/maxItems, uniqueItems), strings (enum,
const, min/maxLength, common formats), numbers and integers within their bounds, booleans,
null, ``anyOf``/``oneOf``/``allOf``, type lists and local ``$ref`` (``#/$defs/...``).
``pattern`` is not honoured.
"""

from __future__ import annotations

import math
import random
from typing import Any

WORDS = (
    "amber", "basil", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris", "juniper", "kelp",
    "lumen", "maple", "nectar", "orbit", "pebble", "quartz", "river", "sage", "tidal", "umber", "velvet",
    "willow", "xenon", "yarrow", "zephyr",
)  # fmt: skip

_MAX_DEPTH = 12


def schema_instance(schema: Any, rng: random.Random) -> Any:
    """Return a value conforming to ``schema``, chosen by ``rng``."""
    return _make(schema, rng, schema if isinstance(schema, dict) else {}, 0)


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    """Follow a local JSON pointer like ``#/$defs/Item``."""
    if not ref.startswith("#"):
        return {}
    node: Any = root
    for token in ref.lstrip("#").strip("/").split("/"):
        if not token:
            continue
        token = token.replace("~1", "/").replace("~0", "~")
        node = node.get(token, {}) if isinstance(node, dict) else {}
    return node


def _make(schema: Any, rng: random.Random, root: dict[str, Any], depth: int) -> Any:
    if not isinstance(schema, dict):
        return "value" if schema is not False else None
    if "$ref" in schema:
        merged = {**_resolve(schema["$ref"], root), **{k: v for k, v in schema.items() if k != "$ref"}}
        return _make(merged, rng, root, depth + 1) if depth < _MAX_DEPTH * 2 else None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(list(schema["enum"]))
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if options:
            usable = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")] or options
            rest = {k: v for k, v in schema.items() if k != key}
            return _make({**rest, **usable[0]} if isinstance(usable[0], dict) else usable[0], rng, root, depth)
    if schema.get("allOf"):
        return _make(_merge_all_of(schema, root), rng, root, depth)
    kind = _kind(schema)
    maker = _MAKERS.get(kind)
    if maker is None:
        return None
    return maker(schema, rng, root, depth)


def _merge_all_of(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Return ``schema`` with its ``allOf`` parts merged in (properties and required lists joined)."""
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        part = _resolve(part["$ref"], root) if isinstance(part, dict) and "$ref" in part else part
        if isinstance(part, dict):
            merged["properties"] = {**merged.get("properties", {}), **part.get("properties", {})}
            merged["required"] = [*merged.get("required", []), *part.get("required", [])]
            merged.update({k: v for k, v in part.items() if k not in ("properties", "required")})
    return merged


def _kind(schema: dict[str, Any]) -> str:
    """Return the one type to make: the first non-null of a list, else guessed from the keys."""
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [t for t in kind if t != "null"]
        kind = non_null[0] if non_null else "null"
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return str(kind)


def _object(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> dict[str, Any]:
    props: dict[str, Any] = schema.get("properties") or {}
    required = list(schema.get("required") or [])
    names = required if depth >= _MAX_DEPTH else list(props)
    result: dict[str, Any] = {}
    for name in names:
        result[name] = _make(props.get(name, {"type": "string"}), rng, root, depth + 1)
    for name in required:
        if name not in result:
            result[name] = _make(props.get(name, {"type": "string"}), rng, root, depth + 1)
    min_props = int(schema.get("minProperties", 0))
    extra = schema.get("additionalProperties", True)
    while len(result) < min_props and extra is not False:
        result[f"extra_{len(result)}"] = _make(extra if isinstance(extra, dict) else {}, rng, root, depth + 1)
    return result


def _array(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> list[Any]:
    lo = int(schema.get("minItems", 0))
    hi = schema.get("maxItems")
    count = lo if depth >= _MAX_DEPTH else max(rng.randint(1, 3), lo)
    if hi is not None:
        count = min(count, int(hi))
    items = schema.get("items", {})
    prefix = schema.get("prefixItems") or []
    if schema.get("uniqueItems") and isinstance(items, dict) and isinstance(items.get("enum"), list):
        return rng.sample(list(items["enum"]), min(count, len(items["enum"])))
    result: list[Any] = []
    for index in range(count):
        value = _make(prefix[index] if index < len(prefix) else items, rng, root, depth + 1)
        if schema.get("uniqueItems") and isinstance(value, str) and value in result:
            value = f"{value} {index}"
        result.append(value)
    return result


def _string(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> str:
    fmt = schema.get("format")
    if fmt == "date":
        value = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    elif fmt == "date-time":
        value = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
    elif fmt == "time":
        value = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00"
    elif fmt == "email":
        value = f"{rng.choice(WORDS)}@example.com"
    elif fmt in ("uri", "url"):
        value = f"https://example.com/{rng.choice(WORDS)}"
    elif fmt == "uuid":
        value = "%08x-%04x-4%03x-8%03x-%012x" % (  # noqa: UP031 - fixed-width hex fields
            rng.getrandbits(32),
            rng.getrandbits(16),
            rng.getrandbits(12),
            rng.getrandbits(12),
            rng.getrandbits(48),
        )
    else:
        value = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
    min_len = int(schema.get("minLength", 0))
    max_len = schema.get("maxLength")
    if len(value) < min_len:
        value = value + "x" * (min_len - len(value))
    if max_len is not None and len(value) > int(max_len):
        value = value[: int(max_len)]
    return value


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float, float]:
    step = 1 if integer else 1e-6
    lo: float | None = _num(schema.get("minimum"))
    hi: float | None = _num(schema.get("maximum"))
    ex_lo, ex_hi = _num(schema.get("exclusiveMinimum")), _num(schema.get("exclusiveMaximum"))
    if ex_lo is not None:
        lo = max(lo, ex_lo + step) if lo is not None else ex_lo + step
    if ex_hi is not None:
        hi = min(hi, ex_hi - step) if hi is not None else ex_hi - step
    if lo is None:
        lo = 0.0 if hi is None else hi - 100
    if hi is None:
        hi = lo + 100
    return float(lo), float(hi)


def _num(value: Any) -> float | None:
    """Return ``value`` when it is a real number (not a bool), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _integer(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> int:
    lo, hi = _bounds(schema, integer=True)
    low, high = math.ceil(lo), math.floor(hi)
    multiple = schema.get("multipleOf")
    if isinstance(multiple, int) and multiple > 0:
        first = -(-low // multiple) * multiple
        if first <= high:
            return first + multiple * rng.randint(0, (high - first) // multiple)
    return rng.randint(low, high) if low <= high else low


def _number(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> float:
    lo, hi = _bounds(schema, integer=False)
    if hi < lo:
        return lo
    value = round(rng.uniform(lo, hi), 3)
    return min(max(value, lo), hi)


def _boolean(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> bool:
    return rng.random() < 0.5


def _null(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> None:
    return None


_MAKERS: dict[str, Any] = {
    "object": _object,
    "array": _array,
    "string": _string,
    "integer": _integer,
    "number": _number,
    "boolean": _boolean,
    "null": _null,
}
