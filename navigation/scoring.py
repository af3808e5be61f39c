"""How ranked walks score: the path formula that combines a child's own score with its parent's, a node's
relevance in its document's context, and the keyword-overlap baseline (what Antfly ranks children by) for
comparison with hybrid relevance."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from navigation.protocols import NodeReader, Scorer

ScoreCombiner = Callable[[float, float], float]
"""(a child's own score, its parent's combined score) -> the child's combined score."""

DEFAULT_DECAY = 0.5


def decayed_sum(decay: float) -> ScoreCombiner:
    """`combined = own + decay * parent_combined`: a node's own relevance plus its ancestors' own relevance
    discounted by `decay` per level (0 ranks children by their own score alone)."""
    if not 0.0 <= decay < 1.0:
        raise ValueError("decay must be in [0, 1)")

    def combine(own: float, parent: float) -> float:
        return own + decay * parent

    return combine


DEFAULT_COMBINE: ScoreCombiner = decayed_sum(DEFAULT_DECAY)


def document_key(key: str) -> str:
    """The key of the document a section key `doc#fragment` belongs to (`doc`); a key without a fragment is
    its own document."""
    return key.split("#", 1)[0] or key


class ContextScorer:
    """A `Scorer` that scores a node in its context: `own + context_weight x own(its document) + prior`, where
    its document is `document_key(key)` (a page for a section `page#anchor`, the node itself for a page) and
    `prior` a per-key bonus (e.g. for the seed search's rank). A section of a relevant page is more likely to
    answer than an equally similar section elsewhere; a key the base scorer does not return is left out. Each
    call asks the base scorer once, for the keys and their pages (not memoised: a SQL sum's last bit can
    depend on the batch, and agentdb.tree_walk scores the same batches)."""

    def __init__(
        self, scorer: Scorer, *, context_weight: float, prior: Mapping[str, float] | None = None
    ) -> None:
        self.scorer = scorer
        self.context_weight = context_weight
        self.prior = prior or {}

    def score(self, keys: Sequence[str]) -> Mapping[str, float]:
        if not keys:
            return {}
        own = self.scorer.score(list(dict.fromkeys([*keys, *(document_key(k) for k in keys)])))
        return {
            k: float(own[k])
            + self.context_weight * float(own.get(document_key(k), 0.0))
            + self.prior.get(k, 0.0)
            for k in keys
            if k in own
        }


STOPWORDS = frozenset(
    "a an and are as at be by can do does for from how i in is it my of on or the to what when where which "
    "who why with".split()
)
_WORD = re.compile(r"\w+")


def keywords(text: str) -> set[str]:
    """The distinct lower-cased words of `text`, stopwords and single characters left out."""
    return {w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS}


def keyword_overlap(query: str, title: str, text: str = "", *, title_weight: float = 1.0) -> float:
    """The share of the query's keywords found in the title or text; a title match counts `title_weight`
    (so 1.0 is plain overlap and the score stays in [0, 1] with the default)."""
    wanted = keywords(query)
    if not wanted:
        return 0.0
    in_title = keywords(title)
    in_text = keywords(text)
    matched = sum(title_weight if w in in_title else 1.0 if w in in_text else 0.0 for w in wanted)
    return matched / len(wanted)


class KeywordScorer:
    """A `Scorer` that ranks keys by keyword overlap of the query with each node's title and text."""

    def __init__(self, query: str, reader: NodeReader, *, title_weight: float = 1.0) -> None:
        self.query = query
        self.reader = reader
        self.title_weight = title_weight

    def score(self, keys: Sequence[str]) -> Mapping[str, float]:
        """Overlap scores of the visible nodes among `keys` (read through the scoped reader)."""
        if not keys:
            return {}
        return {
            n.key: keyword_overlap(self.query, n.title, n.text, title_weight=self.title_weight)
            for n in self.reader.read(keys)
        }
