"""How ranked walks score: the path formula that combines a child's own score with its parent's, and a node's
relevance in its document's context. (agentdb's ranked walk, with its hybrid and keyword-overlap scoring, is
agentdb_internal.tree_walk_run in sql/075_tree_walk.sql.)"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from navigation.protocols import Scorer

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
