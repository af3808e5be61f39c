"""A pure-Python reference for agentdb's metadata filters, and hypothesis strategies for valid filters.

`matches` evaluates a filter (operator objects, query objects or Tryll op nodes) on one row without SQL,
so property tests can check that no hit ever violates its filter. `filters(fields)` draws random valid
filters over a field schema and `metadata(fields)` / `sample_metadata` random rows from the same value
pools, so that a good fraction of rows match. Semantics, as in sql/030_filters.sql: a comparison on a
missing field (absent, null, or of the wrong type, with no default) is false, also for $ne/$nin; a
negation of it is true; a field with a default is never missing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

Fields = Sequence[dict[str, Any]]

QUERY_KEYS = frozenset(
    {
        "term",
        "terms",
        "prefix",
        "field",
        "min",
        "max",
        "inclusive_min",
        "inclusive_max",
        "numeric_range",
        "start",
        "end",
        "inclusive_start",
        "inclusive_end",
        "date_range",
        "conjuncts",
        "disjuncts",
        "bool",
        "must",
        "should",
        "must_not",
        "filter",
        "minimum_should_match",
        "match_all",
        "match_none",
        "ids",
        "doc_id",
    }
)
ORDERED = frozenset({"int", "float", "string", "timestamp"})
_MISSING = object()
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
_OPS = {"$eq": "eq", "$ne": "ne", "$gt": "gt", "$gte": "ge", "$lt": "lt", "$lte": "le"}

# Value pools shared by the row generator and the filter generator.
INTS = list(range(10))
FLOATS = [-1.5, 0.0, 0.25, 1.0, 2.5, 3.75, 5.0, 9.5]
STRINGS = [
    "alpha",
    "beta",
    "gamma",
    "alphabet",
    "Beta",
    "en",
    "fr",
    "o'neil",
    'say "hi"',
    "émile",
    "日本",
    "",
]
PREFIXES = ["al", "alpha", "b", "B", "", "o'", "é", "日", "x"]
SUBSTRINGS = ["ph", "et", "a", "'", "本", "", "zz"]
TAGS = ["red", "green", "blue", "x'y", "ünï"]
TIMESTAMPS = [
    f"2020-01-0{day}T{hour:02d}:00:00{zone}"
    for day in (1, 2, 3, 4)
    for hour in (0, 12)
    for zone in ("Z", "+02:00")
]


def _timestamp(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _field_value(spec: dict[str, Any], metadata: dict[str, Any]) -> Any:
    """The row's value of a field (its default when absent or null), or _MISSING."""
    value = metadata.get(spec["name"])
    if value is None:
        value = spec.get("default")
    if value is None:
        return _MISSING
    kind = spec["type"]
    if kind in ("int", "float"):
        ok = _is_number(value)
    elif kind == "string":
        ok = isinstance(value, str)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "string_set":
        ok = isinstance(value, list | tuple)
    else:
        value = _timestamp(value)
        ok = value is not None
    return value if ok else _MISSING


class _Evaluator:
    def __init__(self, fields: Fields, doc_id: str, metadata: dict[str, Any]) -> None:
        self.specs = {f["name"]: f for f in fields}
        self.doc_id = doc_id
        self.metadata = metadata

    def value(self, name: str) -> Any:
        return _field_value(self.specs[name], self.metadata)

    # Leaves -----------------------------------------------------------------------------------------
    def compare(self, op: str, name: str, literal: Any) -> bool:
        spec = self.specs[name]
        value = self.value(name)
        if value is _MISSING:
            return False
        if spec["type"] == "string_set":
            return (literal in value) if op == "eq" else (literal not in value)
        if spec["type"] == "timestamp":
            literal = _timestamp(literal)
        if op == "eq":
            return bool(value == literal)
        if op == "ne":
            return bool(value != literal)
        if op == "lt":
            return bool(value < literal)
        if op == "le":
            return bool(value <= literal)
        if op == "gt":
            return bool(value > literal)
        return bool(value >= literal)

    def any_of(self, name: str, literals: list[Any], negate: bool = False) -> bool:
        spec = self.specs[name]
        value = self.value(name)
        if value is _MISSING:
            return False
        if spec["type"] == "string_set":
            hit = any(item in value for item in literals)
        elif spec["type"] == "timestamp":
            hit = any(value == _timestamp(item) for item in literals)
        else:
            hit = any(value == item for item in literals)
        return hit != negate

    def contains(self, name: str, literal: str) -> bool:
        value = self.value(name)
        return value is not _MISSING and literal in value

    def prefix(self, name: str, literal: str) -> bool:
        value = self.value(name)
        if value is _MISSING:
            return False
        if isinstance(value, str):
            return value.startswith(literal)
        return any(isinstance(item, str) and item.startswith(literal) for item in value)

    def exists(self, name: str) -> bool:
        return self.value(name) is not _MISSING

    # Nodes ------------------------------------------------------------------------------------------
    def node(self, node: dict[str, Any]) -> bool:
        if "op" in node:
            return self.tryll(node)
        if any(k in QUERY_KEYS and k not in self.specs for k in node):
            return self.query(node)
        return self.operators(node)

    def tryll(self, node: dict[str, Any]) -> bool:
        op = node["op"]
        if op == "and":
            return all(self.node(a) for a in node["args"])
        if op == "or":
            return any(self.node(a) for a in node["args"])
        if op == "not":
            return not self.node(node["arg"])
        if op == "in":
            needle, haystack = node["needle"], node["haystack"]
            if "knowledge" in needle:
                return self.any_of(needle["knowledge"], haystack["value"])
            return self.contains(haystack["knowledge"], needle["value"])
        lhs, rhs = node["lhs"], node["rhs"]
        if "knowledge" in lhs:
            return self.compare(op, lhs["knowledge"], rhs["value"])
        return self.compare(_FLIP.get(op, op), rhs["knowledge"], lhs["value"])

    def clause(self, value: Any) -> list[bool]:
        if value is None:
            return []
        if isinstance(value, dict):
            return [self.node(value)]
        return [self.node(v) for v in value]

    def bool_query(self, node: dict[str, Any]) -> bool:
        must = self.clause(node.get("must")) + self.clause(node.get("filter"))
        should = self.clause(node.get("should"))
        must_not = self.clause(node.get("must_not"))
        wanted = node.get("minimum_should_match")
        if wanted is None:
            wanted = 1 if should and not must else 0
        return all(must) and not any(must_not) and sum(should) >= wanted

    def range_query(self, node: dict[str, Any], low: str, high: str) -> bool:
        name = node["field"]
        ok = True
        if node.get(low) is not None:
            ok = self.compare(
                "ge" if node.get(f"inclusive_{low}", True) is not False else "gt", name, node[low]
            )
        if node.get(high) is not None:
            ok = ok and self.compare("le" if node.get(f"inclusive_{high}") else "lt", name, node[high])
        return ok

    def query(self, node: dict[str, Any]) -> bool:
        if "match_all" in node:
            return True
        if "match_none" in node:
            return False
        if "ids" in node:
            return self.doc_id in node["ids"]
        if "doc_id" in node:
            return self.doc_id in node["doc_id"]["ids"]
        if "conjuncts" in node:
            return all(self.node(q) for q in node["conjuncts"])
        if "disjuncts" in node:
            return sum(self.node(q) for q in node["disjuncts"]) >= node.get("min", 1)
        if "bool" in node:
            return self.bool_query(node["bool"])
        if any(k in node for k in ("must", "should", "must_not", "filter", "minimum_should_match")):
            return self.bool_query(node)
        if "term" in node:
            return self.compare("eq", node["field"], node["term"])
        if "terms" in node:
            return self.any_of(node["field"], node["terms"])
        if "prefix" in node:
            return self.prefix(node["field"], node["prefix"])
        if "numeric_range" in node:
            return self.range_query(node["numeric_range"], "min", "max")
        if "date_range" in node:
            return self.range_query(node["date_range"], "start", "end")
        if any(k in node for k in ("min", "max", "inclusive_min", "inclusive_max")):
            return self.range_query(node, "min", "max")
        return self.range_query(node, "start", "end")

    def operators(self, node: dict[str, Any]) -> bool:
        for key, value in node.items():
            if key == "$and":
                ok = all(self.node(v) for v in value)
            elif key == "$or":
                ok = any(self.node(v) for v in value)
            elif key == "$not":
                ok = not self.node(value)
            else:
                ok = self.condition(key, value)
            if not ok:
                return False
        return True

    def condition(self, name: str, condition: Any) -> bool:
        if not isinstance(condition, dict):
            return self.compare("eq", name, condition)
        for op, literal in condition.items():
            if op in _OPS:
                ok = self.compare(_OPS[op], name, literal)
            elif op in ("$in", "$nin"):
                ok = self.any_of(name, literal, negate=op == "$nin")
            elif op == "$contains":
                ok = self.contains(name, literal)
            elif op == "$exists":
                ok = self.exists(name) == literal
            elif op == "$not":
                ok = not self.condition(name, literal)
            else:
                raise ValueError(f"unknown operator {op}")
            if not ok:
                return False
        return True


def matches(fields: Fields, filter: dict[str, Any] | None, doc_id: str, metadata: dict[str, Any]) -> bool:
    """Whether the row (`doc_id`, field values by field name) satisfies `filter` under `fields`.

    For a registered table, pass the column values by field name (None for SQL NULL; timestamps as
    ISO strings or aware datetimes; string sets as lists)."""
    if filter is None or filter == {} or filter == "":
        return True
    return _Evaluator(fields, doc_id, metadata).node(filter)


# Row generation ---------------------------------------------------------------------------------------


def _random_value(kind: str, rng: random.Random) -> Any:
    if kind == "int":
        return rng.choice(INTS)
    if kind == "float":
        return rng.choice(FLOATS + [2, 5])
    if kind == "string":
        return rng.choice(STRINGS)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "string_set":
        return sorted(rng.sample(TAGS, rng.randint(0, 3)))
    return rng.choice(TIMESTAMPS)


def sample_metadata(fields: Fields, rng: random.Random) -> dict[str, Any]:
    """A random metadata object for `fields`: some keys missing, some JSON null, values from the pools."""
    row: dict[str, Any] = {}
    for f in fields:
        roll = rng.random()
        if roll < 0.2:
            continue
        row[f["name"]] = None if roll < 0.27 else _random_value(f["type"], rng)
    return row


def metadata(fields: Fields) -> st.SearchStrategy[dict[str, Any]]:
    """Random metadata objects for `fields` (see `sample_metadata`)."""
    return st.randoms(use_true_random=False).map(lambda rng: sample_metadata(fields, rng))


# Filter generation ------------------------------------------------------------------------------------


def values(field: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Literals that compare with `field` (int and float promote; sets compare with strings)."""
    kind = field["type"]
    if kind == "int":
        return st.one_of(st.sampled_from(INTS), st.sampled_from([2.5, 4.0, -1.0]))
    if kind == "float":
        return st.one_of(st.sampled_from(FLOATS), st.sampled_from([0, 2, 5]))
    if kind == "string":
        return st.sampled_from(STRINGS)
    if kind == "bool":
        return st.booleans()
    if kind == "string_set":
        return st.sampled_from(TAGS + ["purple"])
    return st.sampled_from(TIMESTAMPS + ["2020-01-02", "2020-01-03T11:00:00+01:00", "2020-01-02T12:00:00.5Z"])


def _fragments(field: dict[str, Any], kind: str) -> st.SearchStrategy[str]:
    if field["type"] == "string_set":
        return (
            st.one_of(st.sampled_from(TAGS), st.sampled_from(["re", "g", "x'", ""]))
            if kind == "prefix"
            else st.sampled_from(TAGS)
        )
    return st.sampled_from(PREFIXES if kind == "prefix" else SUBSTRINGS)


def _lists(field: dict[str, Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(values(field), max_size=4)


@st.composite
def _condition(draw: Callable[..., Any], field: dict[str, Any], depth: int) -> Any:
    kind = field["type"]
    choices = ["bare", "$eq", "$ne", "$in", "$nin", "$exists", "multi"]
    if kind in ORDERED:
        choices += ["$gt", "$gte", "$lt", "$lte"]
    if kind in ("string", "string_set"):
        choices.append("$contains")
    if depth > 0:
        choices.append("$not")
    choice = draw(st.sampled_from(choices))
    if choice == "bare":
        return draw(values(field))
    if choice in ("$in", "$nin"):
        return {choice: draw(_lists(field))}
    if choice == "$exists":
        return {"$exists": draw(st.booleans())}
    if choice == "$contains":
        return {"$contains": draw(_fragments(field, "contains"))}
    if choice == "$not":
        return {"$not": draw(_condition(field, depth - 1))}
    if choice == "multi":
        if kind in ORDERED:
            low, high = draw(st.sampled_from(["$gt", "$gte"])), draw(st.sampled_from(["$lt", "$lte"]))
            return {low: draw(values(field)), high: draw(values(field))}
        return {"$ne": draw(values(field)), "$exists": True}
    return {choice: draw(values(field))}


@st.composite
def _operator_filter(draw: Callable[..., Any], fields: Fields, depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for f in draw(st.lists(st.sampled_from(list(fields)), max_size=2, unique_by=lambda f: f["name"])):
        node[f["name"]] = draw(_condition(f, depth))
    if depth > 0 and draw(st.booleans()):
        key = draw(st.sampled_from(["$and", "$or", "$not"]))
        if key == "$not":
            node[key] = draw(_operator_filter(fields, depth - 1))
        else:
            node[key] = draw(st.lists(_operator_filter(fields, depth - 1), min_size=1, max_size=2))
    if not node:
        f = draw(st.sampled_from(list(fields)))
        node[f["name"]] = draw(_condition(f, 0))
    return node


def _one_or_list(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(strategy, st.lists(strategy, max_size=2))


@st.composite
def _query_filter(
    draw: Callable[..., Any], fields: Fields, depth: int, doc_ids: Sequence[str] | None
) -> dict[str, Any]:
    numeric = [f for f in fields if f["type"] in ("int", "float")]
    dates = [f for f in fields if f["type"] == "timestamp"]
    texts = [f for f in fields if f["type"] in ("string", "string_set")]
    kinds = ["term", "terms", "match_all", "match_none"]
    kinds += ["prefix"] * bool(texts) + ["numeric"] * bool(numeric) + ["date"] * bool(dates)
    kinds += ["ids"] * bool(doc_ids)
    if depth > 0:
        kinds += ["conjuncts", "disjuncts", "bool", "bool"]
    kind = draw(st.sampled_from(kinds))
    sub = _query_filter(fields, depth - 1, doc_ids)
    if kind in ("term", "terms", "prefix"):
        f = draw(st.sampled_from(texts if kind == "prefix" else list(fields)))
        value = draw(
            values(f) if kind == "term" else _lists(f) if kind == "terms" else _fragments(f, "prefix")
        )
        return {kind: value, "field": f["name"]}
    if kind in ("numeric", "date"):
        f = draw(st.sampled_from(numeric if kind == "numeric" else dates))
        low, high = ("min", "max") if kind == "numeric" else ("start", "end")
        body: dict[str, Any] = {"field": f["name"]}
        bounds = draw(st.sampled_from([(low,), (high,), (low, high)]))
        for bound in bounds:
            body[bound] = draw(values(f))
            if draw(st.booleans()):
                body[f"inclusive_{bound}"] = draw(st.booleans())
        if draw(st.booleans()):
            return {"numeric_range" if kind == "numeric" else "date_range": body}
        return body
    if kind == "match_all":
        return {"match_all": {}}
    if kind == "match_none":
        return {"match_none": {}}
    if kind == "ids":
        assert doc_ids is not None
        ids = draw(st.lists(st.sampled_from(list(doc_ids)) | st.just("missing'id"), max_size=5))
        return {"ids": ids} if draw(st.booleans()) else {"doc_id": {"ids": ids}}
    if kind == "conjuncts":
        return {"conjuncts": draw(st.lists(sub, min_size=1, max_size=3))}
    if kind == "disjuncts":
        items = draw(st.lists(sub, min_size=1, max_size=3))
        node: dict[str, Any] = {"disjuncts": items}
        if draw(st.booleans()):
            node["min"] = draw(st.integers(0, len(items) + 1))
        return node
    clauses = draw(
        st.lists(
            st.sampled_from(["must", "should", "must_not", "filter"]), min_size=1, max_size=2, unique=True
        )
    )
    body = {clause: draw(_one_or_list(sub)) for clause in clauses}
    if draw(st.integers(0, 3)) == 0:
        body["minimum_should_match"] = draw(st.integers(0, 2))
    return {"bool": body} if draw(st.booleans()) else body


def _operand(field: dict[str, Any]) -> dict[str, Any]:
    return {"knowledge": field["name"]}


@st.composite
def _tryll_filter(draw: Callable[..., Any], fields: Fields, depth: int) -> dict[str, Any]:
    sets = [f for f in fields if f["type"] == "string_set"]
    kinds = ["cmp", "cmp", "in"] + ["member"] * bool(sets)
    if depth > 0:
        kinds += ["and", "or", "not"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("and", "or"):
        return {"op": kind, "args": draw(st.lists(_tryll_filter(fields, depth - 1), min_size=1, max_size=3))}
    if kind == "not":
        return {"op": "not", "arg": draw(_tryll_filter(fields, depth - 1))}
    if kind == "member":
        f = draw(st.sampled_from(sets))
        return {"op": "in", "needle": {"value": draw(values(f))}, "haystack": _operand(f)}
    f = draw(st.sampled_from(list(fields)))
    if kind == "in":
        return {"op": "in", "needle": _operand(f), "haystack": {"value": draw(_lists(f))}}
    ops = ["eq", "ne"] + (["lt", "le", "gt", "ge"] if f["type"] in ORDERED else [])
    op = draw(st.sampled_from(ops))
    sides = [_operand(f), {"value": draw(values(f))}]
    if draw(st.booleans()):
        sides.reverse()
    return {"op": op, "lhs": sides[0], "rhs": sides[1]}


def filters(fields: Fields, doc_ids: Sequence[str] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """Random valid filters over the filterable `fields`, in all three syntaxes, nested up to three levels
    (`ids` queries are drawn only when `doc_ids` is given)."""
    usable = [f for f in fields if f.get("filterable", True)]
    if not usable:
        return st.just({})
    return st.one_of(_operator_filter(usable, 3), _query_filter(usable, 3, doc_ids), _tryll_filter(usable, 3))
