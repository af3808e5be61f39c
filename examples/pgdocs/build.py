#!/usr/bin/env python3
"""Build the demo corpus (the PostgreSQL manual) from Debian's ``postgresql-doc-15`` HTML.

One JSON record per page and one per section inside a page (DocBook ``div.sect1`` .. ``sect5``,
``refsect1`` .. ``refsect3``, ``simplesect``), written as gzipped JSONL in reading order.

Record fields (and nothing else):

``_id``      ``page.html`` for a page, ``page.html#ANCHOR`` for a section (ANCHOR = the section div's id)
``title``    plain-text title without its number ("Continuous Archiving and Point-in-Time Recovery (PITR)")
``section``  the number as printed ("26.3", "26.3.1", "F.2", "III"), "" when there is none
``text``     the record's OWN prose: everything not inside a nested child-section record, minus the
             navigation header/footer, the table of contents, the title heading, scripts and styles
``parent``   enclosing record (section -> enclosing section or page; page -> its navigation "Up" page);
             null only for ``index.html``
``links``    sorted unique keys of the records the own prose links to (anchors resolved to the
             innermost record containing them); self-links and dangling targets dropped
``next``     page: the navigation "Next" page; section: the next sibling section under the same parent
``page``     the page file name
``kind``     ``page`` or the DocBook class of the section div
``depth``    0 for index.html, parent's depth + 1 otherwise

The page-level DocBook element (the ``div.sect1`` of a sect1 page, ``div.chapter``, ``div.refentry``, ...)
is the page record itself; it does not get a second record.  A link to its id resolves to the page.

A record whose own prose is empty (e.g. a chapter page that is only a table of contents) keeps its
record and gets, as text, its direct children's numbered titles, one per line, in reading order
(the table-of-contents lines a reader would see); a record with neither prose nor children has "".

Usage::

    python examples/pgdocs/build.py [--html-dir /usr/share/doc/postgresql-doc-15/html]
                                    [--out examples/pgdocs/pgdocs.jsonl.gz] [--pack]
    python examples/pgdocs/build.py --pack-only [--pack-out examples/pgdocs/pgdocs.pack.parquet]

``--pack`` (or ``--pack-only``, which skips the HTML step and reads the existing ``--out``) also
embeds the corpus with the bundled model in a temporary embedded database and writes the knowledge
pack that ``agentdb demo`` loads (``agentdb pack import``), so that nobody has to embed it again.

The output is deterministic: same input gives the same bytes (gzip mtime 0, no file name in the
gzip header, sorted JSON keys).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import posixpath
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

try:  # the HTML step needs beautifulsoup4 and lxml; the pack step (--pack-only) needs only agentdb
    from bs4 import BeautifulSoup, NavigableString, Tag
    from bs4.element import Comment, Declaration, Doctype, ProcessingInstruction

    BS4_MISSING: ImportError | None = None
except ImportError as exc:  # pragma: no cover
    BS4_MISSING = exc

try:  # quieter on bs4 versions that warn about XHTML parsed as HTML
    from bs4 import XMLParsedAsHTMLWarning

    warnings.filterwarnings("ignore", category=XMLParsedAsHTMLWarning)
except ImportError:  # pragma: no cover
    pass

DEFAULT_HTML_DIR = Path("/usr/share/doc/postgresql-doc-15/html")
DEFAULT_OUT = Path(__file__).resolve().parent / "pgdocs.jsonl.gz"
DEFAULT_PACK = Path(__file__).resolve().parent / "pgdocs.pack.parquet"
PACK_SOURCE = "pgdocs"
ROOT_PAGE = "index.html"

SECTION_CLASSES = (
    "sect1",
    "sect2",
    "sect3",
    "sect4",
    "sect5",
    "refsect1",
    "refsect2",
    "refsect3",
    "simplesect",
)
# Navigation and generated tables of contents: not prose (the hierarchy already has them).
SKIP_CLASSES = frozenset(
    {"navheader", "navfooter", "toc", "list-of-tables", "list-of-figures", "list-of-examples"}
)
SKIP_TAGS = frozenset({"script", "style", "head", "title", "meta", "link", "noscript"})
BLOCK_TAGS = frozenset(
    {
        "p", "div", "ul", "ol", "li", "dl", "dt", "dd", "table", "thead", "tbody", "tfoot", "tr",
        "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "hr", "caption", "figure", "section",
        "address", "center", "colgroup", "body",
    }
)  # fmt: skip
CELL_TAGS = frozenset({"td", "th"})
BLOCK_CONTENT_TAGS = ["p", "div", "pre", "ul", "ol", "dl", "table", "blockquote"]
HEADING_TAGS = ("h1", "h2", "h3", "h4", "h5", "h6")

# "Chapter 26. Backup and Restore", "Part III. Server Administration", "Appendix F. Additional ..."
_PREFIXED_NUMBER = re.compile(r"^(?:Chapter|Part|Appendix)\s+([0-9]+|[A-Z]|[IVXLC]+)\.\s+(.*)$", re.S)
# "26.3. Continuous ...", "26.3.1. Setting Up ...", "F.1. adminpack", "1. What Is PostgreSQL?"
_BARE_NUMBER = re.compile(r"^([0-9]+(?:\.[0-9]+)*|[A-Z](?:\.[0-9]+)+)\.\s+(.*)$", re.S)
_WS = re.compile(r"\s+")
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"), None)


def clean_inline(s: str) -> str:
    """Collapse all whitespace (including no-break spaces) to single spaces; drop zero-width chars."""
    return _WS.sub(" ", s.translate(_INVISIBLE).replace("\xa0", " ")).strip()


def split_number(title: str) -> tuple[str, str]:
    """'26.3. Continuous Archiving' -> ('26.3', 'Continuous Archiving'); unnumbered -> ('', title)."""
    t = clean_inline(title)
    for rx in (_PREFIXED_NUMBER, _BARE_NUMBER):
        m = rx.match(t)
        if m:
            return m.group(1), m.group(2).strip()
    return "", t


def css_classes(el: Tag) -> list[str]:
    c: str | list[str] = el.get("class") or []
    return c.split() if isinstance(c, str) else [str(x) for x in c]


def attr(el: Tag, name: str) -> str:
    """A single-valued attribute as a string ("" when absent)."""
    v = el.get(name)
    if v is None:
        return ""
    return v if isinstance(v, str) else " ".join(str(x) for x in v)


def section_kind(el: Tag) -> str | None:
    """The DocBook section class of a div that becomes its own record, else None."""
    if el.name != "div" or not el.get("id"):
        return None
    for c in css_classes(el):
        if c in SECTION_CLASSES:
            return c
    return None


# --------------------------------------------------------------------------------------------------
# Text extraction


class TextBuilder:
    """Accumulates inline fragments into lines; block boundaries end a line."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._cur: list[str] = []
        self.cell_depth = 0  # inside an inline-only table cell, block boundaries become spaces

    def inline(self, s: str) -> None:
        self._cur.append(s)

    def br(self) -> None:
        if self.cell_depth:
            self._cur.append(" ")
            return
        line = clean_inline("".join(self._cur))
        self._cur = []
        if line:
            self.lines.append(line)

    def pre(self, raw: str) -> None:
        if self.cell_depth:
            self._cur.append(" " + raw + " ")
            return
        self.br()
        raw = raw.translate(_INVISIBLE).replace("\xa0", " ").expandtabs(8)
        body = "\n".join(ln.rstrip() for ln in raw.split("\n")).strip("\n")
        if body.strip():
            self.lines.append(body)

    def start_row(self) -> None:
        self.br()

    def start_cell(self) -> None:
        """An inline-only cell: joined to the row's other cells with ' | '."""
        if "".join(self._cur).strip():
            self._cur.append(" | ")
        self.cell_depth += 1

    def end_cell(self) -> None:
        self.cell_depth -= 1

    def text(self) -> str:
        self.br()
        return "\n".join(self.lines)


@dataclass
class Node:
    """One record before link resolution."""

    key: str
    page: str
    kind: str
    title: str
    section: str
    parent: str | None
    element: Tag | None = None
    text: str = ""
    raw_links: list[tuple[str, str]] = field(default_factory=list)  # (target page, anchor or "")
    next: str | None = None
    children: list[str] = field(default_factory=list)


def _href_target(href: str, page: str, pages: set[str]) -> tuple[str, str] | None:
    """Intra-manual href -> (page, anchor); None for external or non-page links."""
    href = href.strip()
    if not href:
        return None
    parts = urlsplit(href)
    if parts.scheme or parts.netloc:
        return None
    path = unquote(parts.path)
    anchor = unquote(parts.fragment)
    if not path:
        target = page
    else:
        target = posixpath.normpath(path)
        if "/" in target or not target.endswith(".html"):
            return None
    if target not in pages:
        return None
    return target, anchor


def extract_own(root: Tag, skip: set[int], page: str, pages: set[str]) -> tuple[str, list[tuple[str, str]]]:
    """Text and intra-manual link targets of ``root`` minus nested records and ``skip`` elements."""
    tb = TextBuilder()
    links: list[tuple[str, str]] = []

    def raw_text(el: Tag) -> str:
        out: list[str] = []
        for d in el.descendants:
            if isinstance(d, Tag):
                if d.name == "a" and d.get("href"):
                    t = _href_target(attr(d, "href"), page, pages)
                    if t:
                        links.append(t)
                elif d.name == "br":
                    out.append("\n")
            elif isinstance(d, NavigableString) and not isinstance(
                d, Comment | Declaration | Doctype | ProcessingInstruction
            ):
                out.append(str(d))
        return "".join(out)

    def walk(el: Tag) -> None:
        for child in el.children:
            if isinstance(child, NavigableString):
                if isinstance(child, Comment | Declaration | Doctype | ProcessingInstruction):
                    continue
                tb.inline(str(child))
                continue
            if not isinstance(child, Tag):
                continue
            name = child.name
            if name in SKIP_TAGS or id(child) in skip:
                continue
            if section_kind(child) is not None:  # a nested record: its prose is its own
                continue
            if SKIP_CLASSES.intersection(css_classes(child)):
                continue
            if name == "pre":
                tb.pre(raw_text(child))
                continue
            if name == "br":
                tb.br()
                continue
            if name == "a" and child.get("href"):
                t = _href_target(attr(child, "href"), page, pages)
                if t:
                    links.append(t)
            if name == "tr":
                tb.start_row()
                walk(child)
                tb.br()
                continue
            if name in CELL_TAGS and not tb.cell_depth and child.find(BLOCK_CONTENT_TAGS) is not None:
                # A cell made of paragraphs (the function tables): its blocks become lines.
                tb.br()
                walk(child)
                tb.br()
                continue
            if name in CELL_TAGS:
                tb.start_cell()
                walk(child)
                tb.end_cell()
                continue
            if name in BLOCK_TAGS:
                tb.br()
                walk(child)
                tb.br()
            else:
                walk(child)

    walk(root)
    return tb.text(), links


# --------------------------------------------------------------------------------------------------
# Per-page parsing


def _nav_href(soup: BeautifulSoup, accesskey: str) -> str | None:
    for cls in ("navheader", "navfooter"):
        nav = soup.find("div", class_=cls)
        if nav is None:
            continue
        a = nav.find("a", accesskey=accesskey)
        if a is not None and a.get("href"):
            return posixpath.normpath(urlsplit(attr(a, "href")).path)
    return None


def _first_heading(el: Tag, owner_of: dict[int, Tag], owner: Tag) -> Tag | None:
    """First heading in document order whose innermost record element is ``owner``."""
    for h in el.find_all(HEADING_TAGS):
        if owner_of.get(id(h)) is owner:
            return h
    return None


def _owner_map(body: Tag, page_root: Tag) -> dict[int, Tag]:
    """id(element) -> innermost record element (a section div, or page_root) containing it."""
    owner: dict[int, Tag] = {}

    def walk(el: Tag, cur: Tag) -> None:
        for c in el.children:
            if isinstance(c, Tag):
                o = c if section_kind(c) is not None and c is not page_root else cur
                owner[id(c)] = o
                walk(c, o)

    owner[id(body)] = page_root
    walk(body, page_root)
    return owner


@dataclass
class Page:
    name: str
    up: str | None
    next: str | None
    nodes: list[Node]
    anchors: dict[str, str]  # element id -> key of innermost record containing it
    title_mismatch: list[str]


def parse_page(path: Path, pages: set[str]) -> Page:
    name = path.name
    soup = BeautifulSoup(path.read_bytes(), "lxml")
    body = soup.body
    assert body is not None, f"{name}: no <body>"
    title_el = soup.find("title")
    page_section, page_title = split_number(title_el.get_text() if title_el else name)

    # The page-level DocBook element: the body's single content div (a sect1 page's div.sect1 is
    # the page itself, not a separate section record).
    content = [
        c
        for c in body.find_all(recursive=False)
        if not SKIP_CLASSES.intersection(css_classes(c)) and c.name not in SKIP_TAGS
    ]
    page_root: Tag = content[0] if len(content) == 1 else body
    owner_of = _owner_map(body, page_root)
    mismatches: list[str] = []

    page_node = Node(
        key=name, page=name, kind="page", title=page_title, section=page_section, parent=None,
        element=page_root,
    )  # fmt: skip
    nodes = [page_node]
    by_el: dict[int, Node] = {id(page_root): page_node}
    skip: set[int] = set()

    # Page title element: the first heading owned by the page (h1/h2 of div.titlepage, the h2 of a
    # refentry's refnamediv), or the legal notice's title paragraph.
    h = _first_heading(page_root, owner_of, page_root)
    if h is None:
        h = page_root.find("p", class_="legalnotice-title")
    if h is not None:
        skip.add(id(h))
        if split_number(h.get_text())[1] != page_title:
            mismatches.append(f"{name}: <title> {page_title!r} vs heading {clean_inline(h.get_text())!r}")

    for div in page_root.find_all("div"):
        kind = section_kind(div)
        if kind is None or div is page_root:
            continue
        parent_el = owner_of[id(div.parent)]
        parent = by_el[id(parent_el)]
        hd = _first_heading(div, owner_of, div)
        if hd is not None:
            skip.add(id(hd))
            sec_num, sec_title = split_number(hd.get_text())
        else:
            sec_num, sec_title = "", ""
            mismatches.append(f"{name}#{attr(div, 'id')}: section without heading")
        node = Node(
            key=f"{name}#{attr(div, 'id')}", page=name, kind=kind, title=sec_title, section=sec_num,
            parent=parent.key, element=div,
        )  # fmt: skip
        parent.children.append(node.key)
        by_el[id(div)] = node
        nodes.append(node)

    anchors: dict[str, str] = {}
    for el in body.find_all(True):
        for name_attr in ("id", "name") if el.name == "a" else ("id",):
            ident = attr(el, name_attr)
            if ident and ident not in anchors:
                anchors[ident] = by_el[id(owner_of[id(el)])].key

    for node in nodes:
        assert node.element is not None
        node.text, node.raw_links = extract_own(node.element, skip, name, pages)
        node.element = None  # let the tree go

    # next sibling among sections of the same parent
    key_to_node = {n.key: n for n in nodes}
    for n in nodes:
        for a, b in zip(n.children, n.children[1:], strict=False):
            key_to_node[a].next = b

    page_node.next = _nav_href(soup, "n")
    up = _nav_href(soup, "u")
    soup.decompose()
    return Page(name, up, page_node.next, nodes, anchors, mismatches)


# --------------------------------------------------------------------------------------------------
# Whole manual


def _progress(items: list[Path]) -> Iterator[Path]:
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        yield from tqdm(items, desc="pages", unit="page", file=sys.stderr)
        return
    total = len(items)
    for i, it in enumerate(items, 1):
        if i == 1 or i % 100 == 0 or i == total:
            print(f"  {i}/{total} pages", file=sys.stderr)
        yield it


@dataclass
class Stats:
    unresolved_anchor: int = 0  # href anchor not found on an existing page (linked to the page)
    dropped: int = 0  # link targets that are not records
    toc_only: int = 0  # records with no own prose that got their children's titles
    mismatches: list[str] = field(default_factory=list)


def build(html_dir: Path) -> tuple[list[dict], Stats]:
    if BS4_MISSING is not None:
        raise SystemExit(f"the HTML step needs beautifulsoup4 and lxml ({BS4_MISSING}); pip install them")
    files = sorted(html_dir.glob("*.html"))
    if not files:
        raise SystemExit(f"no *.html files in {html_dir}")
    names = {f.name for f in files}
    if ROOT_PAGE not in names:
        raise SystemExit(f"{html_dir} has no {ROOT_PAGE}")

    parsed: dict[str, Page] = {}
    for f in _progress(files):
        parsed[f.name] = parse_page(f, names)

    # Reading order: follow "Next" from index.html; pages not on that chain (legalnotice.html)
    # come after it, sorted by name.
    order: list[str] = []
    seen: set[str] = set()
    cur: str | None = ROOT_PAGE
    while cur is not None and cur in parsed and cur not in seen:
        order.append(cur)
        seen.add(cur)
        cur = parsed[cur].next
    off_chain = sorted(names - seen)
    order += off_chain

    # Page parents from the "Up" link.  A page without one (other than index.html) hangs under the
    # first page, in reading order, that links to it (legalnotice.html -> index.html), else index.html.
    linked_from: dict[str, str] = {}
    for p in order:
        for n in parsed[p].nodes:
            for tp, _ in n.raw_links:
                linked_from.setdefault(tp, p)
    for p in order:
        page = parsed[p]
        node = page.nodes[0]
        if p == ROOT_PAGE:
            node.parent = None
        elif page.up in parsed and page.up != p:
            node.parent = page.up
        else:
            lf = linked_from.get(p)
            node.parent = lf if lf and lf != p else ROOT_PAGE
        if node.next is not None and node.next not in parsed:
            node.next = None
    for p in off_chain:
        parsed[p].nodes[0].next = None

    # Resolve links.
    anchors_ci = {
        p: {k.lower(): v for k, v in sorted(pg.anchors.items(), reverse=True)} for p, pg in parsed.items()
    }
    stats = Stats()
    records: list[dict] = []
    nodes_in_order: list[Node] = [n for p in order for n in parsed[p].nodes]
    keys = {n.key for n in nodes_in_order}
    for n in nodes_in_order:
        targets: set[str] = set()
        for tp, anchor in n.raw_links:
            if not anchor:
                key = tp
            else:
                found = parsed[tp].anchors.get(anchor) or anchors_ci[tp].get(anchor.lower())
                if found is not None:
                    key = found
                else:
                    stats.unresolved_anchor += 1
                    key = tp  # the page exists, the anchor does not: link the page
            if key not in keys:
                stats.dropped += 1
                continue
            if key != n.key:
                targets.add(key)
        records.append(
            {
                "_id": n.key,
                "title": n.title,
                "section": n.section,
                "text": n.text,
                "parent": n.parent,
                "links": sorted(targets),
                "next": n.next,
                "page": n.page,
                "kind": n.kind,
                "depth": 0,
            }
        )
    for p in order:
        stats.mismatches += parsed[p].title_mismatch

    # TOC-only records: text = direct children's numbered titles.
    by_key = {r["_id"]: r for r in records}
    children: dict[str, list[str]] = {}
    for r in records:
        if r["parent"] is not None:
            children.setdefault(r["parent"], []).append(r["_id"])
    for r in records:
        if not r["text"] and children.get(r["_id"]):
            lines = []
            for c in children[r["_id"]]:
                cr = by_key[c]
                lines.append(f"{cr['section']}. {cr['title']}" if cr["section"] else cr["title"])
            r["text"] = "\n".join(lines)
            stats.toc_only += 1

    # Depth (and a cycle check) from the parent chain.
    depth: dict[str, int] = {}

    def depth_of(k: str) -> int:
        chain = []
        cur_k: str | None = k
        while cur_k is not None and cur_k not in depth:
            if cur_k in chain:
                raise SystemExit(f"parent cycle through {cur_k}")
            chain.append(cur_k)
            cur_k = by_key[cur_k]["parent"]
        base = -1 if cur_k is None else depth[cur_k]
        for i, ck in enumerate(reversed(chain), 1):
            depth[ck] = base + i
        return depth[k]

    for r in records:
        r["depth"] = depth_of(r["_id"])
    validate(records)
    return records, stats


def validate(records: list[dict]) -> None:
    keys = [r["_id"] for r in records]
    if len(keys) != len(set(keys)):
        raise SystemExit("duplicate keys")
    ks = set(keys)
    by_key = {r["_id"]: r for r in records}
    roots = [r["_id"] for r in records if r["parent"] is None]
    if roots != [ROOT_PAGE]:
        raise SystemExit(f"expected the single root {ROOT_PAGE}, got {roots[:5]}")
    for r in records:
        for ref in [r["parent"], r["next"], *r["links"]]:
            if ref is not None and ref not in ks:
                raise SystemExit(f"{r['_id']}: dangling reference {ref}")
        if r["parent"] is not None and r["depth"] != by_key[r["parent"]]["depth"] + 1:
            raise SystemExit(f"{r['_id']}: bad depth")


def write_jsonl_gz(records: Iterable[dict], out: Path) -> int:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        for r in records:
            line = json.dumps(r, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
            gz.write(line.encode("utf-8") + b"\n")
    data = buf.getvalue()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return len(data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--html-dir", type=Path, default=DEFAULT_HTML_DIR, help=f"default: {DEFAULT_HTML_DIR}")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    ap.add_argument(
        "--pack", action="store_true", help="then embed the corpus and write the knowledge pack (--pack-out)"
    )
    ap.add_argument(
        "--pack-only", action="store_true", help="only (re)build the knowledge pack from the existing --out"
    )
    ap.add_argument("--pack-out", type=Path, default=DEFAULT_PACK, help=f"default: {DEFAULT_PACK}")
    args = ap.parse_args(argv)

    if args.pack_only:
        return build_pack(args.out, args.pack_out)
    records, stats = build(args.html_dir)
    size = write_jsonl_gz(records, args.out)

    pages = sum(r["kind"] == "page" for r in records)
    kinds: dict[str, int] = {}
    for r in records:
        if r["kind"] != "page":
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    n_links = sum(len(r["links"]) for r in records)
    chars = sum(len(r["text"]) for r in records)
    print(f"wrote {args.out}")
    print(f"  records:  {len(records)}")
    print(f"  pages:    {pages}")
    print(f"  sections: {sum(kinds.values())} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})")
    print(f"  links:    {n_links} (anchor not found, linked to page: {stats.unresolved_anchor}; "
          f"dropped: {stats.dropped})")  # fmt: skip
    print(f"  toc-only records given their children's titles: {stats.toc_only}")
    print(f"  text:     {chars:,} characters")
    print(f"  output:   {size:,} bytes ({size / 1e6:.2f} MB)")
    for m in stats.mismatches:
        print(f"  warning: {m}", file=sys.stderr)
    return build_pack(args.out, args.pack_out) if args.pack else 0


# --------------------------------------------------------------------------------------------------
# The knowledge pack: the corpus ingested (chunked and embedded with the bundled model) into a
# temporary embedded database, then exported, so that `agentdb demo` loads it without embedding.


def build_pack(corpus: Path, out: Path) -> int:
    """Ingest ``corpus`` into a throw-away embedded PostgreSQL and export it as the pack ``out``."""
    import shutil
    import tempfile
    import time

    import psycopg

    from agentdb.db.migrate import migrate
    from agentdb.db.pool import configure
    from agentdb.db.server import start_embedded, stop_embedded
    from agentdb.embed import load_embedder
    from agentdb.ingest.pipeline import ingest
    from agentdb.ingest.readers import read_records
    from agentdb.pack import export_pack

    data_dir = Path(tempfile.mkdtemp(prefix="agentdb-pgdocs-pack-"))
    try:
        url = start_embedded(data_dir)
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
            configure(conn)
            started = time.perf_counter()
            report = ingest(conn, PACK_SOURCE, read_records(corpus), load_embedder(), progress=True)
            print(report.summary(), file=sys.stderr)
            manifest = export_pack(conn, PACK_SOURCE, out)
        size = out.stat().st_size
        print(f"wrote {out}")
        print(f"  documents: {manifest.documents}, chunks: {manifest.chunks}")
        print(
            f"  model:     {manifest.embedding.model} ({manifest.embedding.dim} dims, {manifest.embedding.dtype})"
        )
        print(
            f"  size:      {size:,} bytes ({size / 1e6:.2f} MB); built in {time.perf_counter() - started:.0f}s"
        )
    finally:
        stop_embedded(data_dir, force=True)
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
