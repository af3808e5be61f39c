"""The shapes memory is written and read in: what a writer sends (records, entities, relations), what a
read returns (a record, a recall with each candidate's three terms) and the options of a recall."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from agentdb.config import MEMORY_DECAY, MEMORY_HALF_LIFE_HOURS
from agentdb.sources import FieldSpec

Importance = Annotated[StrictInt, Field(ge=1, le=10)]
Name = Annotated[str, Field(min_length=1, max_length=200)]


class EntityIn(BaseModel):
    """An entity: a named node of the store's graph. Names are matched exactly (case aside) in queries."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    kind: str | None = Field(default=None, max_length=100)
    metadata: dict[str, Any] = Field(default_factory=dict)
    embedding: list[float] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return normalise_name(value)


class RelationIn(BaseModel):
    """A typed relation subject -predicate-> object between entities (created when missing). A single-valued
    predicate (given here, or one of the store's `single_valued`) holds one object per subject: a new one
    closes the current one (`invalid_from`) instead of deleting it."""

    model_config = ConfigDict(extra="forbid")

    subject: Name
    predicate: Annotated[str, Field(min_length=1, max_length=63)]
    object: Name
    single_valued: bool | None = None
    valid_from: datetime | None = None
    # For relations written on their own: the record that asserted the fact (written with records, it is
    # the record itself).
    record_id: str | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("subject", "object")
    @classmethod
    def _names(cls, value: str) -> str:
        return normalise_name(value)

    @field_validator("predicate")
    @classmethod
    def _predicate(cls, value: str) -> str:
        return normalise_predicate(value)


class RecordIn(BaseModel):
    """One memory. `importance` (1..10) is the writer's; `metadata` follows the store's record schema;
    `entities` it mentions and `relations` it asserts join it to the entity graph."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, min_length=1, max_length=200)
    text: Annotated[str, Field(min_length=1, max_length=100_000)]
    importance: Importance = 5
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None
    last_accessed_at: datetime | None = None
    entities: list[Name | EntityIn] = Field(default_factory=list, max_length=100)
    relations: list[RelationIn] = Field(default_factory=list, max_length=100)
    embedding: list[float] | None = None

    @field_validator("text")
    @classmethod
    def _text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text must not be blank")
        return value

    @field_validator("entities")
    @classmethod
    def _entities(cls, value: list[str | EntityIn]) -> list[str | EntityIn]:
        return [normalise_name(v) if isinstance(v, str) else v for v in value]


class StoreSpec(BaseModel):
    """How a store is made by its first write: its record schema (typed metadata fields, as for sources),
    optionally under a schema name, and its single-valued predicates. Given again for an existing store, it
    must match (3011 otherwise)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    fields: list[FieldSpec] | None = None
    schema_name: str | None = Field(default=None, alias="schema", pattern=r"^[a-z][a-z0-9_]{0,62}$")
    single_valued: list[str] | None = None


class WriteIn(StoreSpec):
    """The body of a records write: records (one or many) and, for a store the write creates, its spec."""

    records: list[RecordIn] = Field(min_length=1, max_length=10_000)
    vars: dict[str, str | int] | None = None


class RelationResult(BaseModel):
    id: int
    subject: str
    predicate: str
    object: str
    status: Literal["new", "exists", "history"]
    closed: list[int] = Field(default_factory=list)


class WriteReport(BaseModel):
    """What a write did: the store (and whether it made it), the record ids in order, entities created and
    each relation's fate (new, an existing fact, or straight into history; the relations it closed)."""

    store: str
    created_store: bool
    ids: list[str]
    entities_created: list[str]
    relations: list[RelationResult]


class Fact(BaseModel):
    """A relation as read: names instead of entity ids; `current` is false once contradicted."""

    id: int
    subject: str
    predicate: str
    object: str
    valid_from: datetime
    invalid_from: datetime | None = None
    current: bool
    record_id: str | None = None


class MemoryRecord(BaseModel):
    """A record as read by key (reading it updates last_accessed_at)."""

    id: str
    text: str
    metadata: dict[str, Any]
    importance: int
    created_at: datetime
    last_accessed_at: datetime
    current: bool
    superseded_at: datetime | None = None
    entities: list[str]
    relations: list[Fact]


class EntityOut(BaseModel):
    """An entity with the relations around it, both directions (history too when asked)."""

    id: int
    name: str
    kind: str | None
    metadata: dict[str, Any]
    relations: list[Fact]
    records: list[str]


class StoreInfo(BaseModel):
    name: str
    schema_name: str | None = Field(default=None, serialization_alias="schema")
    fields: list[FieldSpec]
    single_valued: list[str]
    embedding_model: str
    embedding_dim: int
    records: int
    entities: int
    relations: int
    created_at: datetime


class Weights(BaseModel):
    """How much each term counts; a weight left out is the ranking's default (calibrated: recency 1,
    importance 0.5, relevance 3; generative_agents: 1, 1, 1 as in the paper)."""

    model_config = ConfigDict(extra="forbid")

    recency: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    importance: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    relevance: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class RecallOptions(BaseModel):
    """Knobs of a recall (agentdb.memory_recall documents each). `ranking` "calibrated" (the default) keeps
    relevance as the raw similarity and lets recency halve every `half_life_hours` x importance^2 hours since
    last access; "generative_agents" is the paper's formula: each term min-max normalised over the
    candidates, recency `decay` per hour."""

    model_config = ConfigDict(extra="forbid")

    top_k: int = Field(default=5, ge=1, le=100)
    ranking: Literal["calibrated", "generative_agents"] = "calibrated"
    half_life_hours: float = Field(default=MEMORY_HALF_LIFE_HOURS, gt=0, allow_inf_nan=False)
    decay: float = Field(default=MEMORY_DECAY, gt=0, le=1)
    weights: Weights = Weights()
    candidates: int = Field(default=20, ge=0, le=1000)
    entity_candidates: int = Field(default=3, ge=0, le=100)
    entity_threshold: float = Field(default=0.6, ge=0, le=2)
    hops: int = Field(default=1, ge=0, le=3)
    per_entity: int = Field(default=20, ge=0, le=1000)
    prior: int = Field(default=10, ge=0, le=1000)
    max_edges: int = Field(default=200, ge=1, le=10_000)
    include_history: bool = False
    touch: bool = True
    as_of: datetime | None = None
    # A metadata filter on the store's record schema (the filter grammar of sources).
    filter: dict[str, Any] | None = None


class TermScore(BaseModel):
    """One ranking term of a candidate: its raw value, on the ranking's scale (`normalized`: calibrated, a
    fixed scale; generative_agents, min-max over the candidates), and weighted.
    For relevance, `via` says what the query was most similar to: "memory" (the record itself), "entity X"
    (an entry entity it mentions) or the fact "X PREDICATE Y" that led to an entity it mentions."""

    raw: float | None
    normalized: float
    weighted: float
    via: str | None = None


class Terms(BaseModel):
    recency: TermScore
    importance: TermScore
    relevance: TermScore


class RecallCandidate(BaseModel):
    """A ranked memory with why it was a candidate (`via`: vector, entity, relation, importance, recency) and
    its three terms; `decided_by` is the term that weighed most in its score."""

    id: str
    rank: int
    score: float
    text: str
    metadata: dict[str, Any]
    importance: int
    created_at: datetime
    last_accessed_at: datetime
    hours_since_access: float
    current: bool
    superseded_at: datetime | None = None
    via: list[str]
    terms: Terms
    decided_by: str | None = None


class EntryNode(BaseModel):
    id: int
    name: str
    via: Literal["name", "vector"]
    distance: float | None = None


class ReachedEntity(BaseModel):
    id: int
    name: str
    depth: int


class RecallResult(BaseModel):
    """A recall: the query, the entry nodes and the entities reached from them, what decided the order
    (`ranked_by`: the terms that varied among the candidates and had weight; `relevance` says whether it was
    available), how many candidates were ranked, the top ones with their terms, and the facts around them."""

    store: str
    query: str
    as_of: datetime
    ranking: str
    decay: float
    half_life_hours: float
    weights: Weights
    relevance: str
    ranked_by: list[str]
    entry_nodes: list[EntryNode]
    reached: list[ReachedEntity]
    candidate_count: int
    via_counts: dict[str, int]
    candidates: list[RecallCandidate]
    facts: list[Fact]

    @property
    def relevance_available(self) -> bool:
        return not self.relevance.startswith("unavailable")

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.candidates]


class AssembledMemory(BaseModel):
    """The memory block for a prompt and what reached it (record ids and fact ids, in order)."""

    text: str
    record_ids: list[str]
    fact_ids: list[int]
    tokens: int
    left_out: int


def normalise_name(value: str) -> str:
    """An entity name as stored: surrounding space removed and inner runs of space made one space."""
    name = " ".join(value.split())
    if not any(ch.isalnum() for ch in name):
        raise ValueError("a name needs at least one letter or digit")
    return name


def fact_text(subject: str, predicate: str, obj: str) -> str:
    """A relation as the sentence its embedding is made from: "Priya married to Rui"."""
    return f"{subject} {predicate.replace('_', ' ').lower()} {obj}"


def normalise_predicate(value: str) -> str:
    """A predicate as stored: upper case, spaces and dashes as underscores (works at -> WORKS_AT)."""
    predicate = re.sub(r"[\s-]+", "_", value.strip()).upper()
    if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,62}", predicate):
        raise ValueError(
            "a predicate is letters, digits and _ starting with a letter (max 63), e.g. WORKS_AT"
        )
    return predicate
