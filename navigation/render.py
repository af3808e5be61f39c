"""How nodes reach a model: untrusted text inside `<document>` / `<candidate>` delimiters it cannot forge.

Every string that comes from the data (keys, titles, texts, field values, rules) is neutralised: in anything
that would open or close one of the delimiter tags (`<document`, `</candidates`, `< rule`, ..., case and
spaces ignored) the `<` becomes `&lt;`; keys and other attribute values also get `"` as `&quot;`. Nothing else
is escaped, so the text reads as stored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from typing import Any

from navigation.nodes import Candidate, Node

TAGS = ("documents", "document", "candidates", "candidate", "rules", "rule")
_DELIMITER = re.compile(r"<(?=\s*/?\s*(?:" + "|".join(TAGS) + r")(?![\w.:-]))", re.IGNORECASE)
_SPACE = re.compile(r"\s+")
SNIPPET_CHARS = 200


def neutralise(text: str) -> str:
    """`text` with every `<` that would start a delimiter tag replaced by `&lt;`."""
    return _DELIMITER.sub("&lt;", text)


def attribute(value: str) -> str:
    """A value for a quoted attribute: neutralised, and `"` as `&quot;`."""
    return neutralise(value).replace('"', "&quot;")


def snippet(text: str, chars: int = SNIPPET_CHARS) -> str:
    """The start of `text` with runs of white space collapsed, cut to `chars` characters (marked by `…`)."""
    flat = _SPACE.sub(" ", text).strip()
    return flat if len(flat) <= chars else flat[: max(chars - 1, 0)].rstrip() + "…"


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def render_document(node: Node, *, exclude_fields: Collection[str] = ()) -> str:
    """A visited node as evidence: title, the other fields (sorted by name) and the text, inside
    `<document key="...">`."""
    lines = [f'<document key="{attribute(node.key)}">']
    if node.title:
        lines.append(f"title: {neutralise(node.title)}")
    for name in sorted(node.fields):
        if name not in exclude_fields:
            lines.append(f"{neutralise(name)}: {neutralise(_value(node.fields[name]))}")
    if node.text:
        lines.append(neutralise(node.text))
    lines.append("</document>")
    return "\n".join(lines)


def render_candidate(candidate: Candidate, *, chars: int = SNIPPET_CHARS, with_text: bool = True) -> str:
    """One offered key as a line: key (and depth, parent or edge type) as attributes, then title and (unless
    `with_text` is false) a snippet of the text."""
    attrs = [f'key="{attribute(candidate.key)}"', f'depth="{candidate.depth}"']
    if candidate.parent is not None:
        attrs.append(f'parent="{attribute(candidate.parent)}"')
    if candidate.edge_type is not None:
        attrs.append(f'edge_type="{attribute(candidate.edge_type)}"')
    node = candidate.node
    body = ""
    if node is not None:
        title = neutralise(snippet(node.title, chars))
        text = neutralise(snippet(node.text, chars)) if with_text else ""
        body = f"{title}: {text}" if title and text else title or text
    return f"<candidate {' '.join(attrs)}>{body}</candidate>"


def render_rules(rules: Sequence[str]) -> str:
    """The accumulated workflow rules as a `<rules>` block, one `<rule>` each (empty when there are none)."""
    if not rules:
        return ""
    return "\n".join(["<rules>", *(f"<rule>{neutralise(r)}</rule>" for r in rules), "</rules>"])
