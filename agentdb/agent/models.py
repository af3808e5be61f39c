"""The request and response models of POST /agents/retrieval. `AgentHit.of` is the one place a typed
`Hit` becomes the hit JSON clients see (`_id`, `_score`, `_source`, ...)."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from agentdb.config import RRF_K
from agentdb.llm import GeneratorSpec
from agentdb.retrieval import Fusion, Hit, Mode

# Query texts are questions, not documents: longer ones are refused before they reach the database.
MAX_QUERY_CHARS = 10_000
# The most hits one query returns (agentdb.retrieve's top_k bound).
MAX_LIMIT = 1000


class FullTextSearch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    match: str = Field(max_length=MAX_QUERY_CHARS)
    field: str | None = None


class Legs(NamedTuple):
    """How a query runs: its mode and the texts of its lexical and dense legs."""

    mode: Mode
    lexical_text: str
    dense_text: str


class QuerySpec(BaseModel):
    """One query of a retrieval request: which table, which legs, which filters, how many hits.

    The table is a source (`table`) or one of the caller's memory stores (`store`, a name template over
    `vars`: the source kind "name"), whose record schema name must be `schema` (agentdb.agent.validate
    resolves it to the source of the store's records)."""

    model_config = ConfigDict(extra="forbid")

    table: str = ""
    store: str | None = Field(None, max_length=200)
    schema_name: str | None = Field(None, alias="schema", max_length=63)
    vars: dict[str, str | int] | None = None
    semantic_search: str | None = Field(None, max_length=MAX_QUERY_CHARS)
    full_text_search: str | FullTextSearch | None = None
    retrieval_mode: Mode | None = None
    filter: dict[str, Any] | None = None
    filter_query: dict[str, Any] | None = None
    exclusion_query: dict[str, Any] | None = None
    fields: list[str] | None = Field(None, max_length=256)
    limit: int = Field(10, ge=1, le=MAX_LIMIT)
    threshold: float = Field(0.5, ge=0, le=2)
    rrf_k: int = Field(RRF_K, ge=1, le=1000)
    # Hybrid fusion: "rrf" (with rrf_k) or "convex" (alpha x BM25 + (1 - alpha) x cosine similarity, each
    # min-max normalised over its leg's candidates); see agentdb.retrieve in sql/040_retrieve.sql.
    fusion: Fusion = "rrf"
    alpha: float = Field(0.5, ge=0, le=1, allow_inf_nan=False)

    @field_validator("full_text_search")
    @classmethod
    def _short_text(cls, value: str | FullTextSearch | None) -> str | FullTextSearch | None:
        if isinstance(value, str) and len(value) > MAX_QUERY_CHARS:
            raise ValueError(f"String should have at most {MAX_QUERY_CHARS} characters")
        return value

    def legs(self, query: str) -> Legs:
        """The mode (given, or inferred from the legs supplied) and the texts of the lexical and dense legs;
        `query`, the request's own text, stands in for a leg that is not given."""
        full_text = (
            self.full_text_search.match
            if isinstance(self.full_text_search, FullTextSearch)
            else self.full_text_search
        )
        mode: Mode = self.retrieval_mode or (
            "hybrid"
            if (self.semantic_search and full_text) or not (self.semantic_search or full_text)
            else "dense"
            if self.semantic_search
            else "lexical"
        )
        return Legs(
            mode, full_text or self.semantic_search or query, self.semantic_search or full_text or query
        )


class RetrievalOptions(BaseModel):
    """`steps.retrieval`: agentic deepening, neighbour expansion, and (later) navigation."""

    model_config = ConfigDict(extra="forbid")

    navigation: dict[str, Any] | None = None
    deepening: dict[str, Any] | None = None
    expand_window: int = Field(3, ge=1, le=101)


class Steps(BaseModel):
    model_config = ConfigDict(extra="forbid")

    retrieval: RetrievalOptions | None = None
    generation: dict[str, Any] | None = None


class MemoryOptions(BaseModel):
    """`memory`: recall from the caller's memory stores (agentdb.memory) for the request's query; the top
    memories, inside `<memory>` delimiters labelled as data, go to the generation step (`{{{memory}}}`, or
    `{{{memory_<store>}}}` per store, in a template) and are reported in the `memory_recall` step."""

    model_config = ConfigDict(extra="forbid")

    stores: list[str] = Field(min_length=1, max_length=8)
    top_k: int = Field(5, ge=1, le=100)
    max_tokens: int = Field(800, ge=50, le=20_000)
    vars: dict[str, str | int] | None = None


class RetrievalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(max_length=MAX_QUERY_CHARS)
    queries: list[QuerySpec] = Field(min_length=1, max_length=8)
    stream: bool = False
    diagnostics: bool = False
    max_internal_iterations: int = Field(0, ge=0, le=20)
    generator: GeneratorSpec | None = None
    steps: Steps | None = None
    memory: MemoryOptions | None = None
    # Read-your-writes, as the X-Agentdb-Min-LSN and X-Agentdb-Consistency headers (the stricter wins); the
    # server reads them before it validates the rest (agentdb.api.routing.read_wish), as they choose the server.
    min_lsn: str | None = Field(
        None,
        max_length=40,
        description="the X-Agentdb-LSN of an earlier write: served by a replica that has replayed it, else "
        "by the primary",
    )
    consistency: Literal["any", "primary"] | None = Field(
        None, description='"primary" reads from the primary; "any" (default) from a replica'
    )


class IndexScores(BaseModel):
    distance: float | None = None
    bm25: float | None = None
    rank_dense: int | None = None
    rank_sparse: int | None = None


class AgentHit(BaseModel):
    """A hit as HTTP clients see it: `_source` holds the projected metadata with title and text."""

    id: str = Field(alias="_id")
    score: float = Field(alias="_score")
    source: dict[str, Any] = Field(alias="_source")
    table: str = Field(alias="_table")
    chunk: int = Field(alias="_chunk")
    chunks: list[int] | None = Field(None, alias="_chunks")
    index_scores: IndexScores = Field(alias="_index_scores")
    tree: dict[str, Any] | None = Field(None, alias="_tree")

    model_config = ConfigDict(populate_by_name=True)

    @classmethod
    def of(cls, hit: Hit) -> AgentHit:
        """The client's view of `hit`: title and text (when read) join its metadata in `_source`."""
        source = dict(hit.metadata)
        if hit.title is not None:
            source["title"] = hit.title
        if hit.text is not None:
            source["text"] = hit.text
        return cls(
            _id=hit.id,
            _score=hit.score,
            _source=source,
            _table=hit.table or "",
            _chunk=hit.chunk,
            _chunks=hit.chunks,
            _tree=hit.tree,
            _index_scores=IndexScores(
                distance=hit.distance,
                bm25=hit.bm25_score,
                rank_dense=hit.rank_dense,
                rank_sparse=hit.rank_sparse,
            ),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this hit, keyed as clients see it (`_id`, ...)."""
        return self.model_dump(by_alias=True)

    @model_serializer(mode="wrap")
    def _without_empty_tree(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # `_tree` only on hits that navigation found.
        out: dict[str, Any] = handler(self)
        if out.get("_tree", 0) is None:
            del out["_tree"]
        if out.get("tree", 0) is None:
            del out["tree"]
        return out


class Step(BaseModel):
    id: str
    kind: Literal["retrieval", "deepening", "expansion", "navigation", "memory", "generation"] = "retrieval"
    name: str
    status: Literal["completed", "failed"]
    duration_ms: float
    details: dict[str, Any]


class UsageOut(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0


class RetrievalResponse(BaseModel):
    hits: list[AgentHit]
    status: Literal["completed", "incomplete", "failed"]
    steps: list[Step]
    route: Literal["found", "not_found"]
    usage: UsageOut
    generation: dict[str, Any] | None = None
    # Tool calls the models made: the deepening judge's and the navigating model's.
    tool_calls_made: int = 0
    # Plain-language warnings about the request (a threshold that removed dense candidates, a query with no
    # search text), so that a caller need not read steps[].details to learn them.
    notices: list[str] = []
    debug_info: dict[str, Any] | None = None


__all__ = [
    "MAX_QUERY_CHARS",
    "AgentHit",
    "FullTextSearch",
    "IndexScores",
    "MemoryOptions",
    "QuerySpec",
    "RetrievalOptions",
    "RetrievalRequest",
    "RetrievalResponse",
    "Step",
    "Steps",
    "UsageOut",
]
