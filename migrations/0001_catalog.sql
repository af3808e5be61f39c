-- The catalog of searchable sources and the lexical index (postings and statistics) shared by all of them.
create extension if not exists vector;
create schema if not exists agentdb;
-- Document tables that agentdb creates live here, one table per source.
create schema if not exists agentdb_docs;

create table agentdb.sources (
    id              int generated always as identity primary key,
    name            text not null unique check (name ~ '^[a-z][a-z0-9_]{0,62}$'),
    kind            text not null check (kind in ('documents', 'table')),
    table_schema    text not null,
    table_name      text not null,
    -- For registered tables: the column that identifies a row, and the columns whose text is searched.
    id_column       text not null,
    text_columns    text[] not null,
    -- Typed metadata fields: [{"name", "type", "optional", "default", "filterable", "column"}].
    fields          jsonb not null default '[]',
    embedding_model text not null,
    embedding_dim   int not null check (embedding_dim between 1 and 16000),
    ts_config       regconfig not null default 'english',
    bm25_k1         float8 not null default 1.2 check (bm25_k1 >= 0),
    bm25_b          float8 not null default 0.75 check (bm25_b between 0 and 1),
    chunk_size      int not null default 256 check (chunk_size > 0),
    chunk_overlap   int not null default 32 check (chunk_overlap >= 0),
    created_at      timestamptz not null default now(),
    unique (table_schema, table_name)
);

-- Exact Okapi BM25 needs, per source: postings (term, chunk, tf, chunk length), per-term document
-- frequencies and the corpus size and total length. Triggers on every source table keep them equal
-- to the documents in the same transaction. The source id leads every key (distribution-friendly).
create table agentdb.postings (
    source_id int not null references agentdb.sources (id) on delete cascade,
    term      text not null,
    chunk_id  bigint not null,
    tf        int not null,
    dl        int not null
);
create unique index postings_term_idx on agentdb.postings (source_id, term, chunk_id) include (tf, dl);

create table agentdb.term_stats (
    source_id int not null references agentdb.sources (id) on delete cascade,
    term      text not null,
    df        bigint not null,
    primary key (source_id, term)
);

create table agentdb.corpus_stats (
    source_id int primary key references agentdb.sources (id) on delete cascade,
    n_chunks  bigint not null default 0,
    total_len bigint not null default 0
);
