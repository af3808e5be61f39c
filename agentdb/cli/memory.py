"""memory list, write, recall, get, delete, relate, entity, drop: memory stores and their entity graph."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg

from agentdb.cli.common import Command, Subparsers, command, connect, field_types, group, split_names
from agentdb.config import MEMORY_DECAY, MEMORY_HALF_LIFE_HOURS
from agentdb.errors import InvalidParamValue


def memory_principal(conn: psycopg.Connection[Any], name: str | None) -> Any:
    """The principal `--as NAME` acts for (its stores, under its role), or None for the application's."""
    if name is None:
        return None
    from agentdb.auth import list_principals
    from agentdb.errors import StorageFileNotFound

    found = next((p for p in list_principals(conn) if p.name == name), None)
    if found is None:
        raise StorageFileNotFound(f"unknown principal {name!r}", path="as")
    return found


def memory_vars(specs: list[str] | None) -> dict[str, str]:
    """`--var user_id=42` options as {name: value}."""
    out = {}
    for i, spec in enumerate(specs or ()):
        name, sep, value = spec.partition("=")
        if not sep or not name:
            raise InvalidParamValue(f"--var takes NAME=VALUE, not {spec!r}", path=f"var[{i}]")
        out[name] = value
    return out


def memory_embedder(args: argparse.Namespace) -> Any:
    from agentdb.embed import load_embedder

    return None if getattr(args, "no_embed", False) else load_embedder()


def memory_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "top_k": args.top_k,
        "decay": args.decay,
        "ranking": args.ranking,
        "half_life_hours": args.half_life_hours,
    }
    if args.weights:
        parts = args.weights.split(",")
        if len(parts) != 3:
            raise InvalidParamValue(
                "--weights takes RECENCY,IMPORTANCE,RELEVANCE, e.g. 1,1,1", path="weights"
            )
        try:
            options["weights"] = dict(
                zip(("recency", "importance", "relevance"), map(float, parts), strict=True)
            )
        except ValueError:
            raise InvalidParamValue(
                f"--weights takes three numbers, not {args.weights!r}", path="weights"
            ) from None
    if getattr(args, "as_of", None):
        options["as_of"] = args.as_of
    return options


def _on_store(
    args: argparse.Namespace, func: Callable[..., Any], *more: Any, embed: bool = False, **options: Any
) -> Any:
    """`func(conn, store, *more, principal=, variables=, **options)` on the command's store, as the caller or the
    --as principal, with the command's embedder when `embed`; writers (`migrate_schema`) bring the schema up."""
    migrate_schema = options.pop("migrate_schema", False)
    with connect(args, migrate_schema=migrate_schema) as conn:
        if embed:
            options["embedder"] = memory_embedder(args)
        return func(
            conn,
            args.store,
            *more,
            principal=memory_principal(conn, args.as_principal),
            variables=memory_vars(args.var),
            **options,
        )


def cmd_memory_list(args: argparse.Namespace) -> None:
    from agentdb.memory import list_stores

    with connect(args) as conn:
        stores = list_stores(conn, principal=memory_principal(conn, args.as_principal))
    if args.json:
        print(orjson.dumps([s.model_dump(mode="json", by_alias=True) for s in stores]).decode())
        return
    if not stores:
        print("no memory stores yet: `agentdb memory write STORE FILE.jsonl` (or --text) makes one")
        return
    print(f"{'store':24} {'records':>8} {'entities':>9} {'relations':>10}  fields")
    for s in stores:
        fields = ", ".join(f"{f.name}:{f.type}" for f in s.fields) or "-"
        print(f"{s.name:24} {s.records:>8} {s.entities:>9} {s.relations:>10}  {fields}")


def cmd_memory_write(args: argparse.Namespace) -> None:
    from agentdb.memory import StoreSpec, write_records
    from agentdb.memory.eval_memory import load_records
    from agentdb.sources import FieldSpec

    records: list[dict[str, Any]] = []
    for path in args.files:
        records += load_records(Path(path))
    if args.text is not None:
        record: dict[str, Any] = {"text": args.text, "importance": args.importance}
        if args.id:
            record["id"] = args.id
        if args.entity:
            record["entities"] = args.entity
        records.append(record)
    if not records:
        raise InvalidParamValue("give JSONL files of records, or --text", path="files")
    spec = None
    if args.field or args.schema or args.single_valued is not None:
        spec = StoreSpec(
            fields=None
            if not args.field
            else [FieldSpec(name=n, type=t, optional=True) for n, t in field_types(args.field).items()],  # type: ignore[arg-type]
            schema=args.schema,
            single_valued=split_names(args.single_valued),
        )
    report = _on_store(args, write_records, records, embed=True, spec=spec, migrate_schema=True)
    closed = sum(len(r.closed) for r in report.relations)
    print(
        f"{'created' if report.created_store else 'wrote to'} memory store {report.store}: {len(report.ids)} records,"
        f" {len(report.entities_created)} new entities, {len(report.relations)} relations"
        + (f" ({closed} earlier ones closed)" if closed else "")
    )


def cmd_memory_recall(args: argparse.Namespace) -> None:
    from agentdb.memory import assemble, recall

    options = {**memory_options(args), "include_history": args.history, "touch": not args.no_touch}
    result = _on_store(args, recall, args.query, embed=True, options=options)
    if args.json:
        print(result.model_dump_json())
        return
    if args.max_tokens:
        print(assemble(result, max_tokens=args.max_tokens).text)
        return
    entries = ", ".join(f"{e.name} ({e.via})" for e in result.entry_nodes) or "none"
    print(
        f"ranked by {' + '.join(result.ranked_by) or 'nothing (all candidates tie)'}; relevance: {result.relevance}"
    )
    print(f"entry nodes: {entries}; {result.candidate_count} candidates")
    for c in result.candidates:
        t = c.terms
        state = "" if c.current else "  [superseded]"
        print(
            f"{c.rank:>3}. {c.text}{state}\n     [{c.id}] score {c.score:.3f} = recency {t.recency.weighted:.3f}"
            f" + importance {t.importance.weighted:.3f} + relevance {t.relevance.weighted:.3f}"
            f" (importance {c.importance}, {c.hours_since_access:.0f} h since access"
            + (
                f", relevance via {t.relevance.via}"
                if t.relevance.via and t.relevance.via != "memory"
                else ""
            )
            + ")"
        )
    for f in result.facts:
        print(
            f"   fact: {f.subject} {f.predicate} {f.object}"
            + ("" if f.current else f" (until {f.invalid_from})")
        )


def cmd_memory_get(args: argparse.Namespace) -> None:
    from agentdb.memory import get_record

    record = _on_store(args, get_record, args.id, touch=not args.no_touch)
    print(record.model_dump_json(indent=2))


def cmd_memory_delete(args: argparse.Namespace) -> None:
    from agentdb.memory import delete_record

    _on_store(args, delete_record, args.id)
    print(f"deleted record {args.id}")


def cmd_memory_relate(args: argparse.Namespace) -> None:
    from agentdb.memory import write_relations

    relation: dict[str, Any] = {"subject": args.subject, "predicate": args.predicate, "object": args.object}
    if args.single:
        relation["single_valued"] = True
    if args.record:
        relation["record_id"] = args.record
    if args.valid_from:
        relation["valid_from"] = args.valid_from
    result = _on_store(args, write_relations, [relation], embed=True)[0]
    closed = f"; closed {len(result.closed)} earlier" if result.closed else ""
    print(f"{result.subject} {result.predicate} {result.object}: {result.status}{closed}")


def cmd_memory_entity(args: argparse.Namespace) -> None:
    from agentdb.memory import get_entity

    entity = _on_store(args, get_entity, args.name, include_history=args.history)
    print(entity.model_dump_json(indent=2))


def cmd_memory_drop(args: argparse.Namespace) -> None:
    from agentdb.memory import drop_store

    _on_store(args, drop_store)
    print(f"dropped memory store {args.store}")


def add_ranking_options(p: argparse.ArgumentParser) -> None:
    """The ranking options that `memory_options` reads (memory recall's, eval-memory's)."""
    p.add_argument(
        "--decay", type=float, default=MEMORY_DECAY, help="recency = decay ** hours since last access"
    )
    p.add_argument(
        "--ranking",
        default="calibrated",
        choices=["calibrated", "generative_agents"],
        help="calibrated (raw similarity, half-life slowed by importance) or the paper's min-max formula",
    )
    p.add_argument(
        "--half-life-hours",
        type=float,
        default=MEMORY_HALF_LIFE_HOURS,
        help="calibrated: at importance 1 (x importance^2)",
    )
    p.add_argument(
        "--weights", help="RECENCY,IMPORTANCE,RELEVANCE (default: the ranking's, 1,0.5,3 or 1,1,1)"
    )


def _store_action(actions: Subparsers, name: str, func: Command, help_text: str) -> argparse.ArgumentParser:
    """A memory action on one store (or, for list, on all of them), as the caller or --as a principal."""
    q = command(actions, name, func, help_text)
    q.add_argument("--as", dest="as_principal", metavar="PRINCIPAL", help="act on this principal's stores")
    if name != "list":
        q.add_argument("store", help="store name; may be a template such as user_{var.user_id}")
        q.add_argument("--var", action="append", metavar="NAME=VALUE", help="a variable of the store name")
    return q


def _add_write(actions: Subparsers) -> None:
    q = _store_action(
        actions,
        "write",
        cmd_memory_write,
        "write records (JSONL files, or one --text) in one transaction; makes the store",
    )
    q.add_argument(
        "files", nargs="*", help='JSONL records: {"id", "text", "importance", "metadata", "entities", ...}'
    )
    q.add_argument("--text", help="one record's text")
    q.add_argument("--importance", type=int, default=5, help="with --text: 1..10 (default 5)")
    q.add_argument("--id", help="with --text: the record id (default: generated)")
    q.add_argument("--entity", action="append", help="with --text: an entity it mentions (repeatable)")
    q.add_argument(
        "--field", action="append", metavar="NAME:TYPE", help="a record schema field of a new store"
    )
    q.add_argument(
        "--schema", help="the record schema's name (a new store's, or checked against an existing one)"
    )
    q.add_argument("--single-valued", help="comma-separated predicates with one current object per subject")
    q.add_argument("--no-embed", action="store_true", help="write without embeddings (no relevance for them)")


def _add_recall(actions: Subparsers) -> None:
    q = _store_action(
        actions,
        "recall",
        cmd_memory_recall,
        "recall: entry nodes, traversal, ranked memories with their terms",
    )
    q.add_argument("query")
    q.add_argument("--top-k", type=int, default=5)
    add_ranking_options(q)
    q.add_argument(
        "--history", action="store_true", help="include contradicted (superseded) memories and facts"
    )
    q.add_argument("--no-touch", action="store_true", help="leave the last-accessed times alone")
    q.add_argument("--as-of", help="the time recency is measured to (ISO 8601; default now)")
    q.add_argument(
        "--no-embed", action="store_true", help="rank without relevance (recency and importance only)"
    )
    q.add_argument("--max-tokens", type=int, help="print the <memory> block for a prompt within this budget")
    q.add_argument("--json", action="store_true")


def add_parsers(sub: Subparsers) -> None:
    help_text = (
        "memory stores: records with importance, an entity graph, recall by recency, importance, relevance"
    )
    actions = group(sub, "memory", help_text)
    q = _store_action(actions, "list", cmd_memory_list, "list the memory stores with their counts")
    q.add_argument("--json", action="store_true")
    _add_write(actions)
    _add_recall(actions)
    q = _store_action(actions, "get", cmd_memory_get, "read a record by id (updates its last-accessed time)")
    q.add_argument("id")
    q.add_argument("--no-touch", action="store_true")
    q = _store_action(
        actions,
        "delete",
        cmd_memory_delete,
        "delete a record with its mentions and the relations it asserted",
    )
    q.add_argument("id")
    q = _store_action(actions, "relate", cmd_memory_relate, "assert a relation SUBJECT PREDICATE OBJECT")
    q.add_argument("subject")
    q.add_argument("predicate")
    q.add_argument("object")
    q.add_argument("--single", action="store_true", help="single-valued: close the subject's current one")
    q.add_argument("--record", help="the record that asserted it")
    q.add_argument("--valid-from", help="ISO 8601 (default now)")
    q.add_argument("--no-embed", action="store_true")
    q = _store_action(actions, "entity", cmd_memory_entity, "an entity with its relations in both directions")
    q.add_argument("name")
    q.add_argument("--history", action="store_true", help="closed relations too")
    _store_action(actions, "drop", cmd_memory_drop, "drop a store with everything in it")
