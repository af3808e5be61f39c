-- Memory stores (migration 0011, agentdb/memory/): records written at run time, an entity graph per store, and
-- recall ranked by recency, importance and relevance (Generative Agents, or the calibrated ranking).
--
-- A store N has four tables in schema agentdb_memory:
--   s<N>_records    the memories: a document source (agentdb_mem_<N> in agentdb.sources) with one chunk per
--                   record, plus importance (1..10, given by the writer), created_at, last_accessed_at and
--                   superseded_at (set when a relation the record asserted was contradicted); the lexical
--                   triggers keep its BM25 postings current and an HNSW index serves its embeddings;
--   s<N>_entities   named nodes (name, key = lower(name), embedding of the name, HNSW);
--   s<N>_relations  typed edges subject -predicate-> object with valid_from / invalid_from and the record that
--                   asserted them; a single-valued predicate has at most one current relation per subject;
--   s<N>_mentions   which records mention which entities.
-- On a Citus coordinator the four tables are reference tables (a copy on every node, written on all of them in
-- one two-phase commit): recall's walk and ranking are statements of laterals and limits over them that Citus
-- runs whole on one node, and the records' postings are distributed with every other source's. A reference
-- table cannot have triggers, so there the records' source is marked `distributed` and the memory writer keeps
-- its postings and statistics (agentdb_internal.lexical_write), as the document writer does.
-- Only the owner's role (a principal's) is granted these tables (agentdb_internal.memory_grant), so another
-- principal's role cannot read, count or write them whatever a request asks; the owner's reads and writes run
-- under its role. The application (owner null) reads and writes as itself.

-- The principal whose role is active (the `role` setting that SET ROLE sets), or null for anyone else: the
-- owner whose stores a caller sees. Read from the setting rather than current_user so that it holds inside
-- SECURITY DEFINER functions too.
create or replace function agentdb_internal.memory_owner() returns int
language sql stable as $$
select (regexp_match(nullif(current_setting('role'), 'none'),
                     format('^agentdb_p_%s_(\d+)$', (select oid from pg_database where datname = current_database()))))[1]::int
$$;

-- The caller's store called `store` (a row of agentdb.memory_stores), or no row: the store of that name owned
-- by the active principal, or by the application when no principal is active. A lookup by name, never a
-- listing; another owner's store of the same name is simply not found. SECURITY DEFINER over the catalog,
-- which principals' roles cannot read.
create or replace function agentdb_internal.memory_store(store text) returns setof agentdb.memory_stores
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
select m.* from agentdb.memory_stores m
where m.name = $1 and coalesce(m.owner, 0) = coalesce(agentdb_internal.memory_owner(), 0)
$$;

-- The caller's stores (the active principal's, or the application's), by name. SECURITY DEFINER, like
-- agentdb_internal.memory_store: a role lists its own stores and nobody else's.
create or replace function agentdb_internal.memory_list() returns setof agentdb.memory_stores
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
select m.* from agentdb.memory_stores m
where coalesce(m.owner, 0) = coalesce(agentdb_internal.memory_owner(), 0)
order by m.name
$$;

-- The qualified name of table `what` (records, entities, relations, mentions) of store `store_id`.
create or replace function agentdb_internal.memory_table(store_id int, what text) returns text
language sql immutable as $$
select format('agentdb_memory.%I', format('s%s_%s', store_id, what))
$$;

-- Give the owner of store `store_id` (when a principal whose role exists) what its reads and writes need:
-- usage on the schema, every privilege its writes use on the store's four tables, and nothing else.
create or replace function agentdb_internal.memory_grant(store_id int) returns void
language plpgsql as $$
declare
    owner_role name;
begin
    select p.role into owner_role
    from agentdb.memory_stores m join agentdb.principals p on p.id = m.owner
    where m.id = store_id;
    if owner_role is null or not exists (select 1 from pg_roles where rolname = owner_role) then
        return;
    end if;
    execute format('grant usage on schema agentdb_memory to %I', owner_role);
    execute format('grant select, insert, delete on %s to %I',
                   agentdb_internal.memory_table(store_id, 'records'), owner_role);
    execute format('grant update (last_accessed_at, superseded_at) on %s to %I',
                   agentdb_internal.memory_table(store_id, 'records'), owner_role);
    execute format('grant select, insert, update, delete on %s, %s, %s to %I',
                   agentdb_internal.memory_table(store_id, 'entities'),
                   agentdb_internal.memory_table(store_id, 'relations'),
                   agentdb_internal.memory_table(store_id, 'mentions'), owner_role);
    -- Its role reads the store's postings too (lexical search over its own memories).
    perform agentdb.principal_install_postings((select m.owner from agentdb.memory_stores m where m.id = store_id));
end;
$$;

-- Create store `name` of `owner` (a principal id, or null for the application) unless it exists; returns its
-- id. `fields` is the record schema (typed metadata fields, as for sources), embedding_model and
-- embedding_dim the model of its records and entities. Concurrent creators of the same store queue on an
-- advisory lock, and the later one finds the store the first made.
create or replace function agentdb.memory_create_store(
    owner int,
    name text,
    fields jsonb,
    embedding_model text,
    embedding_dim int,
    ts_config regconfig default 'english',
    single_valued text[] default '{}',
    schema_name text default null
) returns int
language plpgsql as $$
declare
    sid int;
    src_id int;
    rec text;
    ent text;
    rel text;
    men text;
    stmt text;
    citus boolean := agentdb_internal.on_citus();
begin
    if name is null or name !~ '^[a-z][a-z0-9_]{0,62}$' then
        perform agentdb.invalid_param(
            format('invalid memory store name %L: use lowercase letters, digits and _, starting with a letter (max 63)', name),
            'store');
    end if;
    if owner is not null and not exists (select 1 from agentdb.principals p where p.id = owner) then
        perform agentdb.not_found(format('unknown principal id %s', owner), 'owner');
    end if;
    perform pg_advisory_xact_lock(hashtextextended(format('agentdb.memory_store:%s:%s', coalesce(owner, 0), name), 0));
    select m.id into sid from agentdb.memory_stores m where m.name = memory_create_store.name
        and coalesce(m.owner, 0) = coalesce(memory_create_store.owner, 0);
    if found then
        return sid;
    end if;
    if citus then
        -- One connection per node for the rest of the transaction: it writes reference tables, then makes more.
        perform set_config('citus.multi_shard_modify_mode', 'sequential', true);
    end if;
    sid := nextval(pg_get_serial_sequence('agentdb.memory_stores', 'id'));
    rec := agentdb_internal.memory_table(sid, 'records');
    ent := agentdb_internal.memory_table(sid, 'entities');
    rel := agentdb_internal.memory_table(sid, 'relations');
    men := agentdb_internal.memory_table(sid, 'mentions');
    insert into agentdb.sources (name, kind, table_schema, table_name, id_column, text_columns, fields,
                                 embedding_model, embedding_dim, ts_config, distributed)
    values (format('agentdb_mem_%s', sid), 'documents', 'agentdb_memory', format('s%s_records', sid), 'doc_id',
            array['title', 'text'], coalesce(fields, '[]'::jsonb), embedding_model, embedding_dim, ts_config, citus)
    returning id into src_id;
    insert into agentdb.corpus_stats (source_id) values (src_id);
    execute format($q$
        create table %1$s (
            agentdb_chunk_id bigint generated always as identity primary key,
            doc_id text not null unique check (doc_id <> ''),
            chunk int not null default 0 check (chunk = 0),
            title text not null default '',
            text text not null check (btrim(text) <> ''),
            metadata jsonb not null default '{}',
            agentdb_embedding vector(%2$s),
            agentdb_tsv tsvector generated always as (to_tsvector(%3$L::regconfig, title || ' ' || text)) stored,
            importance smallint not null default 5 check (importance between 1 and 10),
            created_at timestamptz not null default now(),
            last_accessed_at timestamptz not null default now(),
            superseded_at timestamptz
        ) $q$, rec, embedding_dim, ts_config);
    -- Vectors and ordinary texts kept in the row, as for documents: recall reads both.
    perform agentdb_internal.store_rows_inline(src_id);
    execute format('create index %I on %s using hnsw (agentdb_embedding vector_cosine_ops)', format('s%s_records_hnsw', sid), rec);
    execute format('create index %I on %s using gin (metadata jsonb_path_ops)', format('s%s_records_meta', sid), rec);
    -- The query-independent candidates of recall: the most recently used and the most important current records.
    execute format('create index %I on %s (last_accessed_at desc) where superseded_at is null', format('s%s_records_recent', sid), rec);
    execute format('create index %I on %s (importance desc, last_accessed_at desc) where superseded_at is null',
                   format('s%s_records_important', sid), rec);
    if citus then
        perform create_reference_table(rec::regclass);
    end if;
    foreach stmt in array case when citus then '{}'::text[] else array[
        'create trigger agentdb_lex_insert after insert on %s referencing new table as new_rows'
        ' for each statement execute function agentdb.lexical_after_insert(%L)',
        'create trigger agentdb_lex_delete after delete on %s referencing old table as old_rows'
        ' for each statement execute function agentdb.lexical_after_delete(%L)',
        'create trigger agentdb_lex_update after update on %s referencing old table as old_rows new table as new_rows'
        ' for each statement execute function agentdb.lexical_after_update(%L)',
        'create trigger agentdb_lex_truncate after truncate on %s for each statement execute function agentdb.lexical_truncate(%L)'
    ] end loop
        execute format(stmt, rec, src_id::text);
    end loop;
    execute format($q$
        create table %1$s (
            id bigint generated always as identity primary key,
            name text not null check (name ~ '[[:alnum:]]' and length(name) <= 200),
            -- agentdb_internal.memory_key(name), written out: a generated column cannot depend on a function
            -- that migrate drops and re-creates.
            key text generated always as (lower(btrim(regexp_replace(regexp_replace(regexp_replace(name,
                '(^|\s)[^[:alnum:]\s]+', '\1', 'g'), '[^[:alnum:]\s]+(\s|$)', '\1', 'g'), '\s+', ' ', 'g')))) stored unique,
            kind text,
            metadata jsonb not null default '{}',
            embedding vector(%2$s),
            created_at timestamptz not null default now()
        ) $q$, ent, embedding_dim);
    execute format('create index %I on %s using hnsw (embedding vector_cosine_ops)', format('s%s_entities_hnsw', sid), ent);
    if citus then
        perform create_reference_table(ent::regclass);
    end if;
    execute format($q$
        create table %1$s (
            id bigint generated always as identity primary key,
            subject bigint not null,
            predicate text not null check (predicate ~ '^[A-Z][A-Z0-9_]{0,62}$'),
            object bigint not null,
            record_id text,
            single_valued boolean not null default false,
            valid_from timestamptz not null default now(),
            invalid_from timestamptz,
            invalidated_by bigint,
            -- The embedding of the fact as a sentence ("Priya married to Rui"), which recall compares with the query.
            embedding vector(%2$s),
            created_at timestamptz not null default now(),
            check (invalid_from is null or invalid_from >= valid_from)
        ) $q$, rel, embedding_dim);
    execute format('create index %I on %s (subject, predicate) include (object) where invalid_from is null',
                   format('s%s_relations_current', sid), rel);
    execute format('create unique index %I on %s (subject, predicate, object) where invalid_from is null',
                   format('s%s_relations_fact', sid), rel);
    execute format('create unique index %I on %s (subject, predicate) where invalid_from is null and single_valued',
                   format('s%s_relations_single', sid), rel);
    execute format('create index %I on %s (subject)', format('s%s_relations_subject', sid), rel);
    execute format('create index %I on %s (object)', format('s%s_relations_object', sid), rel);
    execute format('create index %I on %s (record_id)', format('s%s_relations_record', sid), rel);
    execute format($q$
        create table %1$s (
            entity_id bigint not null,
            record_id text not null,
            primary key (entity_id, record_id)
        ) $q$, men);
    execute format('create index %I on %s (record_id)', format('s%s_mentions_record', sid), men);
    -- The foreign keys once both ends are what they stay (Citus: a reference table references reference tables).
    if citus then
        perform create_reference_table(rel::regclass);
        perform create_reference_table(men::regclass);
    end if;
    foreach stmt in array array[
        format('alter table %s add foreign key (subject) references %s (id) on delete cascade', rel, ent),
        format('alter table %s add foreign key (object) references %s (id) on delete cascade', rel, ent),
        format('alter table %s add foreign key (record_id) references %s (doc_id) on delete cascade', rel, rec),
        format('alter table %s add foreign key (entity_id) references %s (id) on delete cascade', men, ent),
        format('alter table %s add foreign key (record_id) references %s (doc_id) on delete cascade', men, rec)
    ] loop
        execute stmt;  -- one constraint a statement (Citus takes no other subcommand with ADD CONSTRAINT)
    end loop;
    -- The predicates computed first: on a Citus coordinator memory_stores is a reference table, and Citus
    -- refuses a subquery in an INSERT's values.
    single_valued := array(select distinct upper(p) from unnest(coalesce(single_valued, '{}')) p order by 1);
    insert into agentdb.memory_stores (id, owner, name, source_id, schema_name, single_valued)
    overriding system value
    values (sid, owner, name, src_id, schema_name, single_valued);
    perform agentdb_internal.memory_grant(sid);
    return sid;
end;
$$;

-- The tables and the source of store `store_id` (records source `source_id`, owner `owner`), gone with its
-- catalog row: by the row trigger below on one node, by agentdb.memory_drop_store on a Citus coordinator
-- (whose catalog tables cannot have triggers; there the postings do not reference the catalog either, so
-- they are deleted here). A principal's records are not written there (agentdb/memory/write.py).
create or replace function agentdb_internal.memory_drop_tables(store_id int, source_id int, owner int) returns void
language plpgsql as $$
begin
    execute format('drop table if exists %s, %s, %s',
                   agentdb_internal.memory_table(store_id, 'mentions'), agentdb_internal.memory_table(store_id, 'relations'),
                   agentdb_internal.memory_table(store_id, 'entities'));
    if agentdb_internal.on_citus() then
        delete from agentdb.postings p where p.source_id = memory_drop_tables.source_id;
    end if;
    delete from agentdb.sources s where s.id = memory_drop_tables.source_id;
    execute format('drop table if exists %s', agentdb_internal.memory_table(store_id, 'records'));
    -- The owner's postings policy no longer names the store's table.
    if exists (select 1 from agentdb.principals p join pg_roles r on r.rolname = p.role where p.id = owner) then
        perform agentdb.principal_install_postings(owner);
    end if;
end;
$$;

create or replace function agentdb_internal.memory_store_dropped() returns trigger
language plpgsql as $$
begin
    perform agentdb_internal.memory_drop_tables(old.id, old.source_id, old.owner);
    return null;
end;
$$;

select agentdb_internal.catalog_delete_trigger('memory_stores_dropped', 'agentdb.memory_stores',
                                              'agentdb_internal.memory_store_dropped()');

-- Drop store `name` of `owner` with everything in it; false when there is no such store.
create or replace function agentdb.memory_drop_store(owner int, name text) returns boolean
language plpgsql as $$
declare
    gone agentdb.memory_stores;
begin
    if agentdb_internal.on_citus() then
        -- One connection per node: it deletes catalog rows, then drops tables and deletes postings.
        perform set_config('citus.multi_shard_modify_mode', 'sequential', true);
    end if;
    delete from agentdb.memory_stores m
    where m.name = memory_drop_store.name and coalesce(m.owner, 0) = coalesce(memory_drop_store.owner, 0)
    returning * into gone;
    if not found then
        return false;
    end if;
    if agentdb_internal.on_citus() then
        perform agentdb_internal.memory_drop_tables(gone.id, gone.source_id, gone.owner);
    end if;
    return true;
end;
$$;

-- The key an entity name is matched by: lower case, the punctuation at either end of each word dropped, words
-- separated by one space ("Dr. Osei" -> "dr osei", "Halden & Co" -> "halden co", "Kenji's Bowl" -> "kenji's
-- bowl"). The entities table computes the same expression in its generated column `key`.
create or replace function agentdb_internal.memory_key(name text) returns text
language sql immutable parallel safe as $$
select lower(btrim(regexp_replace(regexp_replace(regexp_replace(name,
    '(^|\s)[^[:alnum:]\s]+', '\1', 'g'), '[^[:alnum:]\s]+(\s|$)', '\1', 'g'), '\s+', ' ', 'g')))
$$;

-- The candidate entity keys in a query: every run of 1..max_words consecutive words (at most the first 64
-- words), keyed as entity names are (agentdb_internal.memory_key), also with a trailing possessive ('s)
-- dropped from each word. Entity names match one of them exactly (agentdb.memory_recall), so "Where does
-- Acme Corp's CEO live?" finds "Acme Corp", and "Dr. Osei's office" finds "Dr. Osei".
create or replace function agentdb_internal.memory_ngrams(query text, max_words int default 6) returns text[]
language plpgsql immutable as $$
declare
    clean text[] := array(select k from (
        select agentdb_internal.memory_key(t) as k, n
        from unnest(regexp_split_to_array(coalesce(query, ''), '\s+')) with ordinality u(t, n)) x
        where k <> '' order by n limit 64);
    bare text[] := array(select regexp_replace(w, '[''’]s$', '') from unnest(clean) with ordinality u(w, n) order by n);
    words text[];
    grams text[] := '{}';
    i int;
    n int;
    v int;
begin
    for v in 1 .. 2 loop
        words := case v when 1 then clean else bare end;
        for i in 1 .. coalesce(cardinality(words), 0) loop
            for n in 1 .. least(max_words, cardinality(words) - i + 1) loop
                grams := grams || array_to_string(words[i:i + n - 1], ' ');
            end loop;
        end loop;
    end loop;
    return array(select distinct g from unnest(grams) g where g <> '');
end;
$$;

-- Serialise the writers of store `store_id` for the rest of the transaction. Every memory write (records,
-- entities, relations, deletes) and every touch of last_accessed_at takes this lock before any other: the
-- lexical triggers lock the store's corpus_stats row on any change of the records table, and a writer that
-- updated records rows first and waited for that row second could deadlock with one that did the opposite.
-- On a Citus coordinator the transaction also keeps one connection per node: the store's tables are reference
-- tables with foreign keys, which Citus writes only so, and its postings are written first.
create or replace function agentdb_internal.memory_lock(store_id int) returns void
language plpgsql as $$
begin
    perform pg_advisory_xact_lock(hashtextextended(format('agentdb.memory_write:%s', store_id), 0));
    if agentdb_internal.on_citus() then
        perform set_config('citus.multi_shard_modify_mode', 'sequential', true);
    end if;
end;
$$;

-- Assert relation subject -predicate-> object (entity ids) in store `store_id`, valid from `valid_from`, asserted
-- by record `record_id` (or null). The same current fact again changes nothing ('exists'). With `single`, the
-- predicate holds one object per subject: an older current relation with another object is closed
-- (invalid_from = valid_from, invalidated_by = the new one) and the records that asserted it are marked
-- superseded; if a current one is newer than `valid_from`, the new relation goes straight into history
-- ('history'), closed by it, and its own record is superseded. Nothing is deleted. Writers of one subject and
-- predicate queue on an advisory lock (the caller holds the store's write lock, agentdb_internal.memory_lock). Returns {"id", "status": "new"|"exists"|"history", "closed": [ids]}.
-- Runs in the caller's role (the store's owner).
create or replace function agentdb_internal.memory_assert(
    store_id int, subject bigint, predicate text, object bigint, record_id text, valid_from timestamptz, single boolean,
    embedding vector default null
) returns jsonb
language plpgsql as $$
declare
    rel text := agentdb_internal.memory_table(store_id, 'relations');
    rec text := agentdb_internal.memory_table(store_id, 'records');
    existing bigint;
    newer_id bigint;
    newer_from timestamptz;
    closed bigint[];
    new_id bigint;
begin
    perform pg_advisory_xact_lock(hashtextextended(format('agentdb.memory_relation:%s:%s:%s', store_id, subject, predicate), 0));
    execute format('select id from %s where subject = $1 and predicate = $2 and object = $3 and invalid_from is null', rel)
        into existing using subject, predicate, object;
    if existing is not null then
        execute format('update %s set record_id = coalesce(record_id, $2), embedding = coalesce(embedding, $3)'
                       ' where id = $1 and (record_id is null or embedding is null)', rel)
            using existing, record_id, embedding;
        return jsonb_build_object('id', existing, 'status', 'exists', 'closed', '[]'::jsonb);
    end if;
    if not single then
        execute format('insert into %s (subject, predicate, object, record_id, single_valued, valid_from, embedding)'
                       ' values ($1, $2, $3, $4, false, $5, $6) returning id', rel)
            into new_id using subject, predicate, object, record_id, valid_from, embedding;
        return jsonb_build_object('id', new_id, 'status', 'new', 'closed', '[]'::jsonb);
    end if;
    -- A current relation that began after this one: the new fact is already history.
    execute format('select id, valid_from from %s where subject = $1 and predicate = $2 and invalid_from is null'
                   ' and valid_from > $3 order by valid_from limit 1', rel)
        into newer_id, newer_from using subject, predicate, valid_from;
    if newer_id is not null then
        execute format('insert into %s (subject, predicate, object, record_id, single_valued, valid_from, invalid_from,'
                       ' invalidated_by, embedding) values ($1, $2, $3, $4, true, $5, $6, $7, $8) returning id', rel)
            into new_id using subject, predicate, object, record_id, valid_from, newer_from, newer_id, embedding;
        if record_id is not null then
            execute format('update %s set superseded_at = coalesce(superseded_at, $2) where doc_id = $1', rec)
                using record_id, newer_from;
        end if;
        return jsonb_build_object('id', new_id, 'status', 'history', 'closed', '[]'::jsonb);
    end if;
    execute format('with c as (update %s set invalid_from = $3 where subject = $1 and predicate = $2'
                   ' and invalid_from is null returning id) select coalesce(array_agg(id order by id), ''{}'') from c', rel)
        into closed using subject, predicate, valid_from;
    execute format('insert into %s (subject, predicate, object, record_id, single_valued, valid_from, embedding)'
                   ' values ($1, $2, $3, $4, true, $5, $6) returning id', rel)
        into new_id using subject, predicate, object, record_id, valid_from, embedding;
    if cardinality(closed) > 0 then
        execute format('update %s set invalidated_by = $1 where id = any($2)', rel) using new_id, closed;
        execute format('update %s r set superseded_at = coalesce(r.superseded_at, $2)'
                       ' where r.doc_id in (select x.record_id from %s x where x.id = any($1) and x.record_id is not null)'
                       '   and r.doc_id is distinct from $3', rec, rel)
            using closed, valid_from, record_id;
    end if;
    return jsonb_build_object('id', new_id, 'status', 'new', 'closed', to_jsonb(closed));
end;
$$;

-- Recall from the caller's store `store`: entry nodes, traversal, candidates, ranking, in one call.
--   Entry nodes: the entities whose name is a run of words of `query` (agentdb_internal.memory_ngrams, exact,
--     case-insensitive), and with `query_embedding` the `entity_candidates` entities nearest to it (HNSW) within
--     cosine distance `entity_threshold` (0 = no limit; names embed far from most questions, so the nearest
--     few are often noise).
--   Traversal: `hops` steps over relations in both directions from the entries (current relations only unless
--     `include_history`), at most `max_edges` relations a step.
--   Candidates (never the whole store): the `candidates` records nearest to the query embedding (agentdb.retrieve's
--     dense leg), the records that mention an entry or reached entity (of the first 100 entities, entries
--     first; at most `per_entity` each: the nearest
--     to the query, else the most important), the records that asserted a walked relation, and, without a query
--     embedding only, the `prior` most important and the `prior` most recently used current records (indexes),
--     so that a query without a vector that names nothing still has candidates (the same for every such
--     query: the seed's fallback). Superseded records (a relation they asserted was contradicted) are left
--     out unless `include_history`, and so is every record that `filter` (a metadata filter on the store's
--     record schema, in the grammar of sources' filters; 3007 at filter... when it does not compile) rejects.
--   Ranking, `ranking` 'calibrated' (the default): recency = 0.5 ^ (hours since last access / (`half_life_hours`
--     x importance^2)), so a memory of importance 10 keeps half its recency a hundred times longer than one of
--     importance 1 (durable facts do not fade like chatter); importance / 10; relevance = the raw cosine
--     similarity below (at least 0), not stretched by the other candidates. Default weights 1, 0.5, 3.
--   Ranking 'generative_agents' (the Generative Agents formula): recency = decay ^ hours since last access,
--     importance (1..10) and relevance, each min-max normalised over the candidates (all equal -> 0). Default
--     weights 1, 1, 1.
--   Relevance (both rankings): cosine similarity of the query embedding to the memory, or to the memory in the
--     context that led to it, whichever is higher. That context is an entry entity the memory mentions, or
--     the fact (a relation, embedded as a sentence) walked to an entity it mentions that is most similar to the
--     query; the memory in context is the sum of the two vectors (about the vector of the memory written with
--     its context). So "what does Priya's husband do?" finds "Rui teaches marine biology" through "Priya
--     MARRIED_TO Rui". Without a query embedding relevance is 0 and the response says it was unavailable.
--   The terms are weighted by w_recency, w_importance, w_relevance (null: the ranking's default) and summed;
--     ties go to the more important, then the more recent, then the id.
--   With `touch`, the `top_k` records returned get last_accessed_at = as_of (never earlier than it was).
-- Returns {"store", "query", "as_of", "ranking", "decay", "half_life_hours", "weights", "relevance", "ranked_by", "entry_nodes",
-- "reached", "candidate_count", "candidates": [top_k, ranked, each with its three terms], "facts"}.
drop function if exists agentdb.memory_recall(text, text, vector, int, float8, float8, float8, float8, int, int,
                                              float8, int, int, int, int, boolean, boolean, timestamptz, jsonb);
create or replace function agentdb.memory_recall(
    store text,
    query text default '',
    query_embedding vector default null,
    top_k int default 5,
    decay float8 default 0.995,
    w_recency float8 default null,
    w_importance float8 default null,
    w_relevance float8 default null,
    candidates int default 20,
    entity_candidates int default 3,
    entity_threshold float8 default 0.6,
    hops int default 1,
    per_entity int default 20,
    prior int default 10,
    max_edges int default 200,
    include_history boolean default false,
    touch boolean default true,
    as_of timestamptz default null,
    filter jsonb default null,
    ranking text default 'calibrated',
    half_life_hours float8 default 72
) returns jsonb
language plpgsql
set hnsw.iterative_scan = 'relaxed_order'
set jit = off
as $$
declare
    st agentdb.memory_stores;
    src agentdb.sources;
    rec text;
    ent text;
    rel text;
    men text;
    at_ts timestamptz := coalesce(as_of, now());
    names text[];
    entries jsonb;
    entry_ids bigint[];
    visited bigint[];
    frontier bigint[];
    depths jsonb := '{}'::jsonb;
    walked bigint[] := '{}';
    step_ids bigint[];
    step_rel bigint[];
    step_paths jsonb;
    paths jsonb := '{}'::jsonb;
    h int;
    vector_hits jsonb := '[]'::jsonb;
    result jsonb;
    top_ids text[];
    facts jsonb;
    reached jsonb;
    filter_pred text;
    filter_params jsonb;
begin
    perform agentdb_internal.check_between(top_k, 1, 100, 'top_k');
    if ranking is null or ranking not in ('calibrated', 'generative_agents') then
        perform agentdb.invalid_param(
            'ranking must be calibrated or generative_agents', 'ranking');
    end if;
    if decay is null or not (decay > 0 and decay <= 1) then
        perform agentdb.invalid_param('decay must be greater than 0 and at most 1', 'decay');
    end if;
    if half_life_hours is null or not (half_life_hours > 0 and half_life_hours < 'Infinity'::float8) then
        perform agentdb.invalid_param('half_life_hours must be positive and finite',
                                    'half_life_hours');
    end if;
    w_recency := coalesce(w_recency, 1);
    w_importance := coalesce(w_importance, case when ranking = 'calibrated' then 0.5 else 1 end);
    w_relevance := coalesce(w_relevance, case when ranking = 'calibrated' then 3 else 1 end);
    if w_recency is null or not (w_recency >= 0 and w_recency < 'Infinity'::float8) then
        perform agentdb.invalid_param('weights must be finite and not negative', 'weights.recency');
    end if;
    if w_importance is null or not (w_importance >= 0 and w_importance < 'Infinity'::float8) then
        perform agentdb.invalid_param('weights must be finite and not negative', 'weights.importance');
    end if;
    if w_relevance is null or not (w_relevance >= 0 and w_relevance < 'Infinity'::float8) then
        perform agentdb.invalid_param('weights must be finite and not negative', 'weights.relevance');
    end if;
    if w_recency + w_importance + w_relevance = 0 then
        perform agentdb.invalid_param('at least one weight must be positive', 'weights');
    end if;
    perform agentdb_internal.check_between(candidates, 0, 1000, 'candidates');
    perform agentdb_internal.check_between(entity_candidates, 0, 100, 'entity_candidates');
    perform agentdb_internal.check_between(entity_threshold, 0, 2, 'entity_threshold');
    perform agentdb_internal.check_between(hops, 0, 3, 'hops');
    perform agentdb_internal.check_between(per_entity, 0, 1000, 'per_entity');
    perform agentdb_internal.check_between(prior, 0, 1000, 'prior');
    perform agentdb_internal.check_between(max_edges, 1, 10000, 'max_edges');
    select * into st from agentdb_internal.memory_store(store);
    if st.id is null then
        perform agentdb.not_found(format('unknown memory store %L', store), 'store',
                                    'a store is created by its first write');
    end if;
    select * into src from agentdb.sources s where s.id = st.source_id;
    if query_embedding is not null and vector_dims(query_embedding) <> src.embedding_dim then
        perform agentdb.content_mismatch(
            format('query_embedding has dimension %s but memory store %L has dimension %s',
                   vector_dims(query_embedding), store, src.embedding_dim), 'query_embedding');
    end if;
    -- A metadata filter on the store's record schema (the filter grammar of sources), on every candidate.
    select c.predicate, c.params into filter_pred, filter_params
    from agentdb_internal.compile_filter(src.fields, filter, '$15', 'c.doc_id', 'filter') c;
    rec := agentdb_internal.memory_table(st.id, 'records');
    ent := agentdb_internal.memory_table(st.id, 'entities');
    rel := agentdb_internal.memory_table(st.id, 'relations');
    men := agentdb_internal.memory_table(st.id, 'mentions');

    -- Entry nodes: exact names in the query, then the entities nearest to it (a name match wins a tie).
    names := agentdb_internal.memory_ngrams(query);
    execute format($q$
        select coalesce(jsonb_agg(x.j order by x.ord, x.distance nulls first, x.id), '[]'::jsonb)
        from (
            select distinct on (y.id) y.* from (
                select e.id, 0 as ord, (e.embedding <=> $2)::float8 as distance,
                       jsonb_build_object('id', e.id, 'name', e.name, 'via', 'name',
                                          'distance', (e.embedding <=> $2)::float8) as j
                from %1$s e where e.key = any($1)
                union all
                select v.id, 1, v.distance,
                       jsonb_build_object('id', v.id, 'name', v.name, 'via', 'vector', 'distance', v.distance)
                from (select e.id, e.name, (e.embedding <=> $2)::float8 as distance from %1$s e
                      where $2::vector is not null and e.embedding is not null
                      order by e.embedding <=> $2 limit $3) v
                where $4 = 0 or v.distance <= $4
            ) y order by y.id, y.ord
        ) x $q$, ent)
        into entries using names, query_embedding, case when query_embedding is null then 0 else entity_candidates end,
                           entity_threshold;
    entry_ids := array(select (e->>'id')::bigint from jsonb_array_elements(entries) e);
    visited := entry_ids;
    frontier := entry_ids;
    select coalesce(jsonb_object_agg(i::text, 0), '{}'::jsonb) into depths from unnest(entry_ids) i;
    -- How close each reached entity is to the query: an entry's own similarity, and for the others the best
    -- similarity of the query to a fact (relation) that led to them.
    select coalesce(jsonb_object_agg(e->>'id', jsonb_build_object('sim', 1 - (e->>'distance')::float8,
                                                                  'via', 'entity ' || (e->>'name'))), '{}'::jsonb)
    into paths from jsonb_array_elements(entries) e where e->>'distance' is not null;

    -- Traversal in both directions, `hops` steps, at most max_edges relations a step (the most recent first).
    for h in 1 .. hops loop
        exit when cardinality(frontier) = 0;
        execute format($q$
            with x as (
                select r.id, case when r.subject = any($1) then r.object else r.subject end as other,
                       (1 - (r.embedding <=> $5))::float8 as sim, r.subject, r.predicate, r.object
                from %1$s r
                where (r.subject = any($1) or r.object = any($1)) and (r.invalid_from is null or $2)
                order by r.valid_from desc, r.id limit $3
            ), best as (
                select distinct on (x.other) x.other, x.sim, x.id, s.name || ' ' || x.predicate || ' ' || o.name as via
                from x join %2$s s on s.id = x.subject join %2$s o on o.id = x.object
                where x.sim is not null order by x.other, x.sim desc
            )
            select coalesce((select array_agg(distinct x.other) from x where not x.other = any($4)), '{}'),
                   coalesce((select array_agg(x.id) from x), '{}'),
                   coalesce((select jsonb_object_agg(b.other::text, jsonb_build_object('sim', b.sim, 'rel', b.id, 'via', b.via))
                             from best b), '{}'::jsonb) $q$, rel, ent)
            into step_ids, step_rel, step_paths using frontier, include_history, max_edges, visited, query_embedding;
        walked := walked || step_rel;
        visited := visited || step_ids;
        depths := depths || coalesce((select jsonb_object_agg(i::text, h) from unnest(step_ids) i), '{}'::jsonb);
        select coalesce(jsonb_object_agg(z.k, z.v), '{}'::jsonb) into paths
        from (select distinct on (u.k) u.k, u.v
              from (select * from jsonb_each(paths) union all select * from jsonb_each(step_paths)) u(k, v)
              order by u.k, (u.v->>'sim')::float8 desc) z;
        frontier := step_ids;
    end loop;

    -- The dense leg of the one retrieval function: the records nearest to the query.
    if query_embedding is not null and candidates > 0 then
        vector_hits := agentdb.retrieve(source => src.name, query => '', query_embedding => query_embedding,
                                        mode => 'dense', top_k => candidates, threshold => 0,
                                        scope => jsonb_build_object('filter', filter), output_results => false)->'hits';
    end if;

    execute format($q$
        with cand as (
            select h->>'id' as id, 'vector'::text as via from jsonb_array_elements($1) h
            union all
            -- the records of the first 100 entities reached (entries first, then by hop)
            select m.record_id, 'entity'
            from (select u.id from unnest($2::bigint[]) with ordinality u(id, n) order by u.n limit 100) v
            cross join lateral (
                select mm.record_id from %2$s mm join %1$s r on r.doc_id = mm.record_id
                where mm.entity_id = v.id and (r.superseded_at is null or $9)
                order by case when $3::vector is null then 0 else r.agentdb_embedding <=> $3 end,
                         r.importance desc, r.last_accessed_at desc, r.doc_id
                limit $4) m
            union all
            select r.record_id, 'relation' from %3$s r where r.id = any($5) and r.record_id is not null
            union all
            (select r.doc_id, 'importance' from %1$s r where $3::vector is null and r.superseded_at is null
             order by r.importance desc, r.last_accessed_at desc limit $6)
            union all
            (select r.doc_id, 'recency' from %1$s r where $3::vector is null and r.superseded_at is null
             order by r.last_accessed_at desc limit $6)
        ), cands as (
            select id, array_agg(distinct via order by via) as via from cand group by id
        ), s0 as (
            select c.doc_id, c.text, c.title, c.metadata, c.importance, c.created_at, c.last_accessed_at,
                   c.superseded_at, cands.via,
                   greatest(extract(epoch from ($7 - c.last_accessed_at)) / 3600.0, 0)::float8 as hours,
                   c.importance::float8 as imp_raw,
                   case when $3::vector is not null and c.agentdb_embedding is not null
                        then (1 - (c.agentdb_embedding <=> $3))::float8 end as own_rel,
                   p.sim as path_rel, p.via as path_via
            from cands join %1$s c on c.doc_id = cands.id
            left join lateral (
                -- the memory in the context that led to it: the sum of its vector and the fact's (or the entry
                -- entity's), which is about the vector of the memory written with that context
                select (1 - ($3 <=> (ctx.v + c.agentdb_embedding)))::float8 as sim, pp.value->>'via' as via
                from %2$s m join jsonb_each($14) pp on pp.key = m.entity_id::text
                cross join lateral (
                    select coalesce((select x.embedding from %3$s x where x.id = (pp.value->>'rel')::bigint),
                                    (select e.embedding from %4$s e where e.id = m.entity_id)) as v) ctx
                where m.record_id = c.doc_id and ctx.v is not null and c.agentdb_embedding is not null
                order by 1 desc limit 1) p on true
            where (c.superseded_at is null or $9) and (%5$s)
        ), s as (
            select s0.*, greatest(own_rel, path_rel) as rel_raw,
                   case when own_rel is null and path_rel is null then null
                        when path_rel > coalesce(own_rel, -2) then path_via else 'memory' end as rel_via
            from s0
        ), raw as (
            select s.*,
                   case when $16 = 'calibrated'
                        then exp(greatest(-ln(2) * s.hours / ($17 * s.imp_raw * s.imp_raw), -700))
                        else exp(greatest(s.hours * ln($8), -700)) end::float8 as rec_raw
            from s
        ), n as (
            -- calibrated: each term on its own fixed scale; generative_agents: min-max over the candidates
            select raw.*,
                   case when $16 = 'calibrated' then rec_raw
                        else coalesce((rec_raw - min(rec_raw) over ()) / nullif(max(rec_raw) over () - min(rec_raw) over (), 0), 0) end as rec_n,
                   case when $16 = 'calibrated' then imp_raw / 10
                        else coalesce((imp_raw - min(imp_raw) over ()) / nullif(max(imp_raw) over () - min(imp_raw) over (), 0), 0) end as imp_n,
                   case when $16 = 'calibrated' then greatest(coalesce(rel_raw, 0), 0)
                        else coalesce((rel_raw - min(rel_raw) over ()) / nullif(max(rel_raw) over () - min(rel_raw) over (), 0), 0) end as rel_n,
                   max(rec_raw) over () - min(rec_raw) over () as rec_spread,
                   max(imp_raw) over () - min(imp_raw) over () as imp_spread,
                   coalesce(max(rel_raw) over () - min(rel_raw) over (), 0) as rel_spread
            from raw
        ), w as (
            select n.*, $10 * rec_n as rec_w, $11 * imp_n as imp_w, $12 * rel_n as rel_w,
                   $10 * rec_n + $11 * imp_n + $12 * rel_n as score
            from n
        ), ranked as (
            select w.*, row_number() over (order by score desc, importance desc, last_accessed_at desc, doc_id) as rank
            from w
        )
        select jsonb_build_object(
            'candidate_count', (select count(*) from ranked),
            'spread', (select jsonb_build_object('recency', max(rec_spread), 'importance', max(imp_spread),
                                                 'relevance', max(rel_spread)) from ranked),
            'via_counts', (select coalesce(jsonb_object_agg(v, k), '{}'::jsonb)
                           from (select v, count(*) as k from ranked, unnest(via) v group by v) x),
            'candidates', coalesce((select jsonb_agg(jsonb_build_object(
                'id', doc_id, 'rank', rank, 'score', score, 'text', text, 'metadata', metadata,
                'importance', importance, 'created_at', created_at, 'last_accessed_at', last_accessed_at,
                'hours_since_access', hours, 'current', superseded_at is null, 'superseded_at', superseded_at,
                'via', to_jsonb(via),
                'terms', jsonb_build_object(
                    'recency', jsonb_build_object('raw', rec_raw, 'normalized', rec_n, 'weighted', rec_w),
                    'importance', jsonb_build_object('raw', imp_raw, 'normalized', imp_n, 'weighted', imp_w),
                    'relevance', jsonb_build_object('raw', rel_raw, 'normalized', rel_n, 'weighted', rel_w,
                                                    'via', rel_via)),
                'decided_by', case when greatest(rec_w, imp_w, rel_w) = 0 then null
                                   when rel_w >= rec_w and rel_w >= imp_w then 'relevance'
                                   when imp_w >= rec_w then 'importance' else 'recency' end
            ) order by rank) from ranked where rank <= $13), '[]'::jsonb)) $q$, rec, men, rel, ent, filter_pred)
        into result
        using vector_hits, visited, query_embedding, per_entity, walked, prior, at_ts, decay,
              include_history, w_recency, w_importance, w_relevance, top_k, paths, filter_params, ranking,
              half_life_hours;

    top_ids := array(select c->>'id' from jsonb_array_elements(result->'candidates') c);
    if touch and cardinality(top_ids) > 0 then
        perform agentdb_internal.memory_lock(st.id);
        execute format('update %s set last_accessed_at = greatest(last_accessed_at, $2) where doc_id = any($1)', rec)
            using top_ids, at_ts;
    end if;

    -- The facts around the entries: the relations walked, and those the returned records asserted.
    execute format($q$
        select coalesce(jsonb_agg(jsonb_build_object(
                   'id', r.id, 'subject', s.name, 'predicate', r.predicate, 'object', o.name,
                   'valid_from', r.valid_from, 'invalid_from', r.invalid_from, 'current', r.invalid_from is null,
                   'record_id', r.record_id) order by r.valid_from desc, r.id), '[]'::jsonb)
        from (select * from %1$s x where (x.id = any($1) or x.record_id = any($2)) and (x.invalid_from is null or $3)
              order by x.valid_from desc, x.id limit $4) r
        join %2$s s on s.id = r.subject join %2$s o on o.id = r.object $q$, rel, ent)
        into facts using walked, top_ids, include_history, max_edges;
    execute format($q$
        select coalesce(jsonb_agg(jsonb_build_object('id', e.id, 'name', e.name, 'depth', ($2->>(e.id::text))::int)
                                  order by ($2->>(e.id::text))::int, e.id), '[]'::jsonb)
        from %s e where e.id = any($1) $q$, ent)
        into reached using visited, depths;

    return jsonb_build_object(
        'store', store, 'query', query, 'as_of', at_ts, 'ranking', ranking, 'decay', decay,
        'half_life_hours', half_life_hours,
        'weights', jsonb_build_object('recency', w_recency, 'importance', w_importance, 'relevance', w_relevance),
        'relevance', case when query_embedding is null then 'unavailable: no query embedding, so relevance is 0 for every candidate'
                          else 'cosine similarity to the query embedding' end,
        'ranked_by', to_jsonb(array_remove(array[
            case when w_recency > 0 and (result->'spread'->>'recency')::float8 > 0 then 'recency' end,
            case when w_importance > 0 and (result->'spread'->>'importance')::float8 > 0 then 'importance' end,
            case when w_relevance > 0 and query_embedding is not null
                      and (result->'spread'->>'relevance')::float8 > 0 then 'relevance' end], null)),
        'entry_nodes', entries,
        'reached', reached,
        'candidate_count', result->'candidate_count',
        'via_counts', result->'via_counts',
        'candidates', result->'candidates',
        'facts', facts);
end;
$$;

-- Stores made before their owner's role was (re-)installed, e.g. a principal re-installed by sql/050 on this
-- migrate, get their grants again.
do $$
declare
    sid int;
begin
    for sid in select id from agentdb.memory_stores where owner is not null order by id loop
        perform agentdb_internal.memory_grant(sid);
    end loop;
end;
$$;
