-- Hierarchy and graph indexes over a source: declared in agentdb.indexes, edges in agentdb.edges
-- (migration 0009). Keys are document ids (a registered table's id column as text); one document is one node,
-- read from its chunk 0 (every chunk of a document carries the same metadata; a registered table's row is
-- its chunk 0).
--
-- An index is one of:
--   * a tree from a parent-key field: an edge parent -> node (type 'child' unless given) for each node whose
--     field names a key; a null, empty or missing parent makes the node a root (no edge). One parent per node;
--   * a graph from a key-list field (e.g. links -> edge type xref: node -> each listed key, duplicates once)
--     or a single-key field (e.g. next -> next);
--   * explicit edges (no field): loaded from a file or posted, kept as given (agentdb.index_add_edges).
-- Field-derived edges follow the documents in the same transaction: the statement triggers that keep the BM25
-- postings current (sql/020_lexical.sql) run agentdb_internal.index_sync_sql's statements after their own, so a
-- check (agentdb.index_check) finds no difference after any sequence of writes. A tree edge belongs to its
-- child, a graph edge to its origin: writing a node rewrites the edges it owns. Edges whose other end names
-- no document are kept (the document may come later) and reported by the check as dangling; TRUNCATE of a
-- source removes its derived edges and keeps explicit ones.
--
-- Principals' roles cannot read agentdb.indexes or agentdb.edges: agentdb.neighbors and agentdb.index_roots,
-- run in the caller's role, take keys from the SECURITY DEFINER agentdb_internal.index_edges and
-- index_root_keys and keep only those the one scoped reader (agentdb.read) returns to the caller. Everything
-- an index shows a role (its edges, roots, edge counts and check) is computed over the rows that role may
-- read (agentdb_internal.index_reader_rows): for a principal, an edge belongs to it when its owner (a tree
-- edge's child, any other edge's origin) is one of its rows, and an end it cannot read is treated exactly as
-- an end that names no document.

-- The helpers that take or return SQL text, and the SECURITY DEFINER edge reader, live in agentdb_internal
-- (not executable by PUBLIC).
-- The document keys a field value names: a string or a number (as text); with `many`, also each string or
-- number element of an array. Empty strings, JSON null and other JSON types name nothing.
create or replace function agentdb_internal.index_value_keys(v jsonb, many boolean) returns setof text
language sql immutable parallel safe as $$
select k from (
    select case when jsonb_typeof(v) in ('string', 'number') then v #>> '{}' end as k
    union all
    select case when jsonb_typeof(e) in ('string', 'number') then e #>> '{}' end
    from jsonb_array_elements(case when many and jsonb_typeof(v) = 'array' then v else '[]'::jsonb end) e
) x
where k <> ''
$$;

-- How an index reads a row of source `src` under alias `a`: the node's key, whether the row is its node's row
-- (a document's chunk 0; any row of a registered table) and the JSON value of field `field`.
create or replace function agentdb_internal.index_row_sql(
    src agentdb.sources, field text, a text, out key_expr text, out node_expr text, out value_expr text
) language plpgsql stable as $$
declare
    col text;
begin
    if src.kind = 'documents' then
        key_expr := format('%I.doc_id', a);
        node_expr := format('%I.chunk = 0', a);
        value_expr := format('%I.metadata -> %L', a, field);
    else
        select f->>'column' into col from jsonb_array_elements(src.fields) f where f->>'name' = field;
        key_expr := format('%I.%I::text', a, src.id_column);
        node_expr := 'true';
        value_expr := case when field is not null then format('to_jsonb(%I.%I)', a, coalesce(col, field)) end;
    end if;
end;
$$;

-- The edges index `idx` derives from the rows of relation `rel` (a transition table, a subquery or the source
-- table itself): a query of distinct (from_key, to_key) pairs. Tree: parent -> node; graph: node -> each key.
create or replace function agentdb_internal.index_edges_sql(src agentdb.sources, idx agentdb.indexes, rel text) returns text
language plpgsql stable as $$
declare
    r record;
begin
    select * into r from agentdb_internal.index_row_sql(src, idx.field, 'c');
    return format(
        'select distinct %s as from_key, %s as to_key'
        ' from %s c cross join lateral agentdb_internal.index_value_keys(%s, %L) k(key)'
        ' where (%s) and %s is not null',
        case when idx.kind = 'tree' then 'k.key' else r.key_expr end,
        case when idx.kind = 'tree' then r.key_expr else 'k.key' end,
        rel, r.value_expr, idx.kind = 'graph', r.node_expr, r.key_expr);
end;
$$;

-- The statement adding the edges index `idx` derives from the rows of `rel` ($1: the source id).
create or replace function agentdb_internal.index_add_sql(src agentdb.sources, idx agentdb.indexes, rel text) returns text
language sql stable as $$
select format(
    'insert into agentdb.edges (source_id, index_id, from_key, edge_type, to_key)'
    ' select $1, %s, e.from_key, %L, e.to_key from (%s) e on conflict do nothing',
    idx.id, idx.edge_type, agentdb_internal.index_edges_sql(src, idx, rel))
$$;

-- The statements removing the edges of index `idx` owned by the nodes among the rows of `rel` ($1: the source
-- id). A registered table may hold several rows with one key: the edges its remaining rows imply come back.
create or replace function agentdb_internal.index_remove_sql(src agentdb.sources, idx agentdb.indexes, rel text) returns text[]
language plpgsql stable as $$
declare
    c record;
    t record;
    stmts text[];
begin
    select * into c from agentdb_internal.index_row_sql(src, idx.field, 'c');
    stmts := array[format(
        'delete from agentdb.edges e using (select distinct %s as key from %s c where (%s)) o'
        ' where e.source_id = $1 and e.index_id = %s and e.%I = o.key',
        c.key_expr, rel, c.node_expr, idx.id, case when idx.kind = 'tree' then 'to_key' else 'from_key' end)];
    if src.kind = 'table' then
        select * into t from agentdb_internal.index_row_sql(src, idx.field, 't');
        stmts := stmts || agentdb_internal.index_add_sql(src, idx, format(
            '(select t.* from %I.%I t where %s in (select %s from %s c where (%s)))',
            src.table_schema, src.table_name, t.key_expr, c.key_expr, rel, c.node_expr));
    end if;
    return stmts;
end;
$$;

-- The statements that keep the field-derived edges of source `source_id` current after a statement of kind
-- `event` (insert, update, delete, truncate) on its table, run by the lexical triggers after their own
-- (which lock the source's corpus_stats row first: index creation queues behind writers, see index_create).
-- The transition tables are new_rows and old_rows; $1 is the source id. One probe of the catalog and no
-- statement when the source has no field-derived index; otherwise one or two statements per index, set-based.
-- An update rewrites the edges of the nodes whose key, node row or field value changed, and only those.
-- `rel` replaces the transition table of an insert or a delete (agentdb_internal.index_write's rows).
create or replace function agentdb_internal.index_sync_sql(source_id int, event text, rel text default null)
returns text[]
language plpgsql stable as $$
declare
    src agentdb.sources;
    idx agentdb.indexes;
    o record;
    n record;
    changed text;
    stmts text[] := '{}';
begin
    if not exists (select 1 from agentdb.indexes i
                   where i.source_id = index_sync_sql.source_id and i.field is not null) then
        return stmts;
    end if;
    select * into src from agentdb.sources s where s.id = index_sync_sql.source_id;
    for idx in select * from agentdb.indexes i
               where i.source_id = index_sync_sql.source_id and i.field is not null order by i.id loop
        if event = 'truncate' then
            stmts := stmts || format('delete from agentdb.edges where source_id = $1 and index_id = %s', idx.id);
        elsif event = 'insert' then
            stmts := stmts || agentdb_internal.index_add_sql(src, idx, coalesce(rel, 'new_rows'));
        elsif event = 'delete' then
            stmts := stmts || agentdb_internal.index_remove_sql(src, idx, coalesce(rel, 'old_rows'));
        elsif event = 'update' then
            select * into o from agentdb_internal.index_row_sql(src, idx.field, 'o');
            select * into n from agentdb_internal.index_row_sql(src, idx.field, 'n');
            changed := format('((%s) or (%s)) and (%s, %s, %s) is distinct from (%s, %s, %s)',
                              o.node_expr, n.node_expr, o.node_expr, o.key_expr, o.value_expr,
                              n.node_expr, n.key_expr, n.value_expr);
            stmts := stmts
                || agentdb_internal.index_remove_sql(src, idx, format(
                       '(select o.* from old_rows o join new_rows n using (agentdb_chunk_id) where %s)', changed))
                || agentdb_internal.index_add_sql(src, idx, format(
                       '(select n.* from new_rows n join old_rows o using (agentdb_chunk_id) where %s)', changed));
        end if;
    end loop;
    return stmts;
end;
$$;

-- The triggers' edge work, done by the writer of a source whose table cannot have triggers (a distributed
-- document source: agentdb_internal.lexical_write calls it after its own): op 'add' after the writer inserted
-- the chunks of documents `doc_ids`, 'remove' before it deletes them. index_sync_sql's statements of an insert
-- or a delete, over those documents' node rows instead of a transition table, in the writer's transaction.
-- The rows are read first, by one statement, and handed to the edge statements as JSON ($2): Citus refuses a
-- statement that writes a reference table (agentdb.edges) and reads a distributed one when it runs on one
-- shard ("cannot perform select on a distributed table and modify a reference table"), which a write of
-- documents hashed to one shard does.
create or replace function agentdb_internal.index_write(source_id int, op text, doc_ids text[]) returns void
language plpgsql as $$
declare
    src agentdb.sources;
    stmts text[];
    stmt text;
    nodes jsonb;
    r record;
begin
    select * into strict src from agentdb.sources s where s.id = index_write.source_id;
    stmts := agentdb_internal.index_sync_sql(src.id, case when op = 'add' then 'insert' else 'delete' end,
                                             format('jsonb_populate_recordset(null::%I.%I, $2)',
                                                    src.table_schema, src.table_name));
    if cardinality(stmts) = 0 then
        return;
    end if;
    select * into r from agentdb_internal.index_row_sql(src, null, 'r');
    execute format($q$
        select coalesce(jsonb_agg(jsonb_build_object('doc_id', r.doc_id, 'chunk', r.chunk, 'metadata', r.metadata)),
                        '[]')
        from %I.%I r where r.doc_id = any ($1) and (%s)$q$, src.table_schema, src.table_name, r.node_expr)
        into nodes using doc_ids;
    foreach stmt in array stmts loop
        execute stmt using src.id, nodes;
    end loop;
end;
$$;

-- The rows of source `src` that the active role (the `role` setting, else the session user) may read, as a
-- relation to select from: the table itself for a role that reads every row (agentdb itself, an analyst's
-- login, a principal whose row filter admits every row or in its own memory store); for any other principal
-- a subquery applying the predicate of its policy on the table (agentdb.principal_policy_sql, the same
-- compiler, as the block reader applies it), since the SECURITY DEFINER functions that call this read as the
-- owner, whom row security does not limit. Null when the role may not read the table.
-- A principal's source whose table has row security policies that are not
-- agentdb's fails closed (9002): those the predicate cannot apply.
create or replace function agentdb_internal.index_reader_rows(src agentdb.sources) returns text
language plpgsql stable as $$
declare
    who name := coalesce(nullif(current_setting('role'), 'none'), session_user::text)::name;
    rel text := format('%I.%I', src.table_schema, src.table_name);
    p agentdb.principals;
    pred text;
begin
    if not has_any_column_privilege(who, rel::regclass, 'SELECT') then
        return null;
    end if;
    select * into p from agentdb.principals x where x.role = who;
    if p.id is null
       or exists (select 1 from agentdb.memory_stores m where m.source_id = src.id and m.owner = p.id) then
        return rel;
    end if;
    if not src.name = any (p.tables) then
        return null;
    end if;
    pred := (select x.expr from agentdb.principal_policy_sql(p.id, src, p.row_filter) x);
    if cardinality(agentdb.principal_foreign_policies(rel::regclass)) > 0 then
        perform agentdb.raise_error(9002, 'DatabaseSetupError',
            format('the table of source %L has row security policies that are not agentdb''s, which its index'
                   ' reads for principals cannot apply', src.name), 'source',
            'drop those policies, or serve this source without indexes to principals');
    end if;
    if pred = 'true' then
        return rel;
    end if;
    if src.distributed and pred <> 'false' then
        -- The predicate is the body of the principal's row function there (its row as $1 and $2): call it.
        pred := format('agentdb.%I(%s.doc_id, %s.metadata)', agentdb.principal_row_function(p.id, src.id), rel, rel);
    end if;
    -- The table keeps its name inside (no alias): the predicate refers to its columns as schema.table.column.
    return format('(select * from %s where %s)', rel, pred);
end;
$$;

-- Index `index_name` of source `src` (3010 at `index` when there is none).
create or replace function agentdb_internal.index_get(src agentdb.sources, index_name text) returns agentdb.indexes
language plpgsql stable as $$
declare
    idx agentdb.indexes;
begin
    select * into idx from agentdb.indexes i where i.source_id = src.id and i.name = index_name;
    if not found then
        perform agentdb.not_found(
                                    format('source %L has no index %L', src.name, index_name), 'index',
                                    format('list them with agentdb index list %s', src.name));
    end if;
    return idx;
end;
$$;

-- Declare index `name` on source `source`: kind 'tree' or 'graph'; `field` the metadata field (a registered
-- table's field column) whose values name the keys, or null for explicit edges; `edge_type` the edges' type
-- (default: 'child' for a tree, the field's name for a graph, 'edge' for explicit edges). A tree's field holds
-- one key (string or int), a graph's one key or a list of keys (string_set). A field-derived index gets its
-- edges from the current documents in the same transaction. Returns the index as JSON with its edge count.
-- Errors: 3010 unknown source; 3007 at name, kind, field or edge_type; 1409 Conflict when the name is taken.
create or replace function agentdb.index_create(
    source text, name text, kind text, field text default null, edge_type text default null
) returns jsonb
language plpgsql as $$
declare
    src agentdb.sources := agentdb_internal.source_named(index_create.source);
    spec jsonb;
    etype text;
    idx agentdb.indexes;
    n bigint := 0;
begin
    if index_create.name is null or index_create.name !~ '^[a-z][a-z0-9_]{0,62}$' then
        perform agentdb.invalid_param(
            format('invalid index name %L: use lowercase letters, digits and _, starting with a letter (max 63)',
                   index_create.name), 'name');
    end if;
    if index_create.kind is null or index_create.kind not in ('tree', 'graph') then
        perform agentdb.invalid_param(
            format('kind must be tree or graph, not %L', index_create.kind), 'kind');
    end if;
    if index_create.field is not null then
        select f into spec from jsonb_array_elements(src.fields) f where f->>'name' = index_create.field;
        if spec is null then
            perform agentdb.invalid_param(
                format('source %L has no field %L; known: %s', src.name, index_create.field,
                       coalesce((select string_agg(f->>'name', ', ' order by f->>'name')
                                 from jsonb_array_elements(src.fields) f), '(none)')), 'field');
        end if;
        if index_create.kind = 'tree' and spec->>'type' not in ('string', 'int') then
            perform agentdb.invalid_param(
                format('a tree''s parent field holds one key: field %L is %s (use a string or int field)',
                       index_create.field, spec->>'type'), 'field');
        end if;
        if spec->>'type' not in ('string', 'string_set', 'int') then
            perform agentdb.invalid_param(
                format('field %L is %s: an index field names document keys (string, string_set or int)',
                       index_create.field, spec->>'type'), 'field');
        end if;
    end if;
    etype := coalesce(index_create.edge_type, case when index_create.kind = 'tree' then 'child'
                                                   else coalesce(index_create.field, 'edge') end);
    if etype !~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,62}$' then
        perform agentdb.invalid_param(
            format('invalid edge type %L: a letter or _, then letters, digits, _ . : - (max 63)', etype), 'edge_type');
    end if;
    -- Writers of the source lock this row first (the lexical triggers) and only then read the index list: a
    -- write either committed before the edges are built from the table here, or waits and then sees the index.
    perform 1 from agentdb.corpus_stats c where c.source_id = src.id for update;
    if exists (select 1 from agentdb.indexes i where i.source_id = src.id and i.name = index_create.name) then
        perform agentdb.raise_error(1409, 'Conflict',
            format('source %L already has an index %L', src.name, index_create.name), 'name',
            'choose another name, or drop the index first');
    end if;
    insert into agentdb.indexes (source_id, name, kind, field, edge_type)
    values (src.id, index_create.name, index_create.kind, index_create.field, etype)
    returning * into idx;
    if idx.field is not null then
        execute agentdb_internal.index_add_sql(src, idx, format('%I.%I', src.table_schema, src.table_name)) using src.id;
        get diagnostics n = row_count;
    end if;
    return jsonb_build_object('name', idx.name, 'kind', idx.kind, 'field', idx.field, 'edge_type', idx.edge_type,
                              'edges', n, 'created_at', idx.created_at);
end;
$$;

-- Remove index `index` of source `source` with its edges; returns how many edges went.
create or replace function agentdb.index_drop(source text, index text) returns bigint
language plpgsql as $$
declare
    src agentdb.sources := agentdb_internal.source_named(index_drop.source);
    idx agentdb.indexes := agentdb_internal.index_get(src, index_drop.index);
    n bigint;
begin
    perform 1 from agentdb.corpus_stats c where c.source_id = src.id for update;  -- as index_create
    select count(*) into n from agentdb.edges e where e.source_id = src.id and e.index_id = idx.id;
    delete from agentdb.indexes i where i.source_id = src.id and i.id = idx.id;
    return n;
end;
$$;

-- The indexes of source `source` with their edge counts, as the active role sees them: an index over a field
-- outside a principal's grant is left out, and a principal counts the edges its rows own. Nothing when the
-- role may not read the source. SECURITY DEFINER over agentdb.indexes and agentdb.edges (see
-- index_reader_rows).
create or replace function agentdb.index_list(source text)
returns table (name text, kind text, field text, edge_type text, edges bigint, created_at timestamptz)
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
declare
    src agentdb.sources := agentdb_internal.source_named(index_list.source);
    idx agentdb.indexes;
    readable text;
    r record;
    rel text := format('%I.%I', src.table_schema, src.table_name);
begin
    readable := agentdb_internal.index_reader_rows(src);
    select * into r from agentdb_internal.index_row_sql(src, null, 'c');
    for idx in select * from agentdb.indexes i where i.source_id = src.id order by i.name loop
        continue when readable is null or not agentdb.principal_field_granted(idx.field);
        if readable = rel then
            select count(*) into edges from agentdb.edges e where e.source_id = src.id and e.index_id = idx.id;
        else
            -- Uncorrelated, as in agentdb_internal.index_edges.
            execute format($q$
                with ends(key) as materialized (
                    select distinct e.%3$I from agentdb.edges e where e.source_id = $1 and e.index_id = $2
                ), owners(key) as materialized (
                    select distinct %2$s from %1$s c where %2$s = any (array(select key from ends)) and (%4$s)
                )
                select count(*) from agentdb.edges e
                where e.source_id = $1 and e.index_id = $2 and e.%3$I in (select key from owners)
                $q$, readable, r.key_expr, case when idx.kind = 'tree' then 'to_key' else 'from_key' end, r.node_expr)
            into edges using src.id, idx.id;
        end if;
        name := idx.name;
        kind := idx.kind;
        field := idx.field;
        edge_type := idx.edge_type;
        created_at := idx.created_at;
        return next;
    end loop;
end;
$$;

-- Add explicit edges to index `index` of source `source` (an index without a field): `edges` is a JSON array of
-- {"from", "to", "type" (default: the index's edge type), "weight" (default 1), "metadata" (an object)}.
-- Keys are non-empty strings of at most 1024 bytes; an edge that exists gets the new weight and metadata (the
-- last one wins within one call). In a tree a node has one parent. All or nothing: the first bad edge is 3007
-- with its path (edges[3].to) and nothing is written. Returns how many edges were written.
create or replace function agentdb.index_add_edges(source text, index text, edges jsonb) returns bigint
language plpgsql as $$
declare
    src agentdb.sources := agentdb_internal.source_named(index_add_edges.source);
    idx agentdb.indexes := agentdb_internal.index_get(src, index_add_edges.index);
    bad record;
    n bigint;
begin
    if idx.field is not null then
        perform agentdb.raise_error(3011, 'StorageKindMismatch',
            format('index %L of source %L derives its edges from field %L: they follow the documents', idx.name,
                   src.name, idx.field), 'index', 'change the documents, or create an index of explicit edges');
    end if;
    if edges is null or jsonb_typeof(edges) <> 'array' then
        perform agentdb.invalid_param(
            'edges must be a JSON array of {"from", "to", "type", "weight", "metadata"}', 'edges');
    end if;
    select e.n - 1 as i, p.problem[1] as suffix, p.problem[2] as message into bad
    from jsonb_array_elements(edges) with ordinality e(v, n)
    cross join lateral (select case
        when jsonb_typeof(e.v) <> 'object' then
            array['', 'an edge must be a JSON object {"from", "to", "type", "weight", "metadata"}']
        when exists (select 1 from jsonb_object_keys(e.v) k where k not in ('from', 'to', 'type', 'weight', 'metadata')) then
            (select array['.' || k, format('unknown key %L: an edge has from, to, type, weight and metadata', k)]
             from jsonb_object_keys(e.v) k where k not in ('from', 'to', 'type', 'weight', 'metadata') order by k limit 1)
        when jsonb_typeof(e.v->'from') is distinct from 'string' or e.v->>'from' = '' then
            array['.from', '"from" must be a non-empty string (a document key)']
        when octet_length(e.v->>'from') > 1024 then array['.from', 'a key is at most 1024 bytes']
        when jsonb_typeof(e.v->'to') is distinct from 'string' or e.v->>'to' = '' then
            array['.to', '"to" must be a non-empty string (a document key)']
        when octet_length(e.v->>'to') > 1024 then array['.to', 'a key is at most 1024 bytes']
        when coalesce(jsonb_typeof(e.v->'type'), 'null') not in ('null', 'string')
             or e.v->>'type' !~ '^[A-Za-z_][A-Za-z0-9_.:-]{0,62}$' then
            array['.type', '"type" must be a letter or _, then letters, digits, _ . : - (max 63)']
        when coalesce(jsonb_typeof(e.v->'weight'), 'null') not in ('null', 'number') then
            array['.weight', '"weight" must be a number']
        when jsonb_typeof(e.v->'weight') = 'number' and abs((e.v->>'weight')::numeric) > 1e308 then
            array['.weight', '"weight" is beyond the range of a double precision number']
        when coalesce(jsonb_typeof(e.v->'metadata'), 'null') not in ('null', 'object') then
            array['.metadata', '"metadata" must be a JSON object']
        end as problem) p
    where p.problem is not null
    order by e.n limit 1;
    if bad.i is not null then
        perform agentdb.invalid_param(format('edges[%s]: %s', bad.i, bad.message),
                                    format('edges[%s]%s', bad.i, bad.suffix));
    end if;
    -- One writer of an index at a time: the one-parent rule of a tree is checked against committed edges.
    perform 1 from agentdb.indexes i where i.source_id = src.id and i.id = idx.id for no key update;
    insert into agentdb.edges as x (source_id, index_id, from_key, edge_type, to_key, weight, metadata)
    select distinct on (e.v->>'from', coalesce(e.v->>'type', idx.edge_type), e.v->>'to')
           src.id, idx.id, e.v->>'from', coalesce(e.v->>'type', idx.edge_type), e.v->>'to',
           coalesce((e.v->>'weight')::float8, 1), coalesce(nullif(e.v->'metadata', 'null'::jsonb), '{}'::jsonb)
    from jsonb_array_elements(edges) with ordinality e(v, n)
    order by e.v->>'from', coalesce(e.v->>'type', idx.edge_type), e.v->>'to', e.n desc
    on conflict (source_id, index_id, from_key, edge_type, to_key)
    do update set weight = excluded.weight, metadata = excluded.metadata;
    get diagnostics n = row_count;
    if idx.kind = 'tree' then
        select e.n - 1 as i, e.v->>'to' as child into bad
        from jsonb_array_elements(edges) with ordinality e(v, n)
        where (select count(distinct x.from_key) from agentdb.edges x
               where x.source_id = src.id and x.index_id = idx.id and x.to_key = e.v->>'to') > 1
        order by e.n limit 1;
        if bad.i is not null then
            perform agentdb.invalid_param(
                format('edges[%s]: node %L would have a second parent in tree index %L (a tree node has one parent)',
                       bad.i, bad.child, idx.name), format('edges[%s].to', bad.i));
        end if;
    end if;
    return n;
end;
$$;

-- Compare the edges of source `source`'s index `index` (every index when null) with what its documents imply:
-- per index, `missing` (implied, not stored) and `extra` (stored, not implied) count field-derived edges
-- (always 0 for explicit edges), `dangling` counts edges with an end that names no document (kept: the
-- document may arrive later; not a mismatch). missing and extra are 0 after any sequence of writes. As the
-- active role sees it (index_reader_rows): a principal compares the edges its rows own with what its rows
-- imply, and an end it cannot read dangles as one that names no document. SECURITY DEFINER, as index_list.
create or replace function agentdb.index_check(source text, index text default null)
returns table (index_name text, what text, mismatches bigint)
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
declare
    src agentdb.sources := agentdb_internal.source_named(index_check.source);
    idx agentdb.indexes;
    r record;
    tbl text := format('%I.%I', src.table_schema, src.table_name);
    readable text;
    owned text;
    missing bigint;
    extra bigint;
    dangling bigint;
begin
    if index_check.index is not null then
        perform agentdb_internal.index_get(src, index_check.index);
    end if;
    readable := agentdb_internal.index_reader_rows(src);
    select * into r from agentdb_internal.index_row_sql(src, null, 'c');
    for idx in select * from agentdb.indexes i
               where i.source_id = src.id and (index_check.index is null or i.name = index_check.index)
               order by i.name loop
        continue when readable is null or not agentdb.principal_field_granted(idx.field);
        -- A principal's part of the stored edges: those its rows (`nodes`, below) own. Uncorrelated, as in
        -- agentdb_internal.index_edges.
        owned := case when readable = tbl then 'true'
                      else format('e.%I in (select n.key from nodes n)', case when idx.kind = 'tree' then 'to_key' else 'from_key' end) end;
        missing := 0;
        extra := 0;
        if idx.field is not null then
            execute format($q$
                with nodes as materialized (select distinct %s as key from %s c where (%s)),
                expected as (select x.from_key, %L::text as edge_type, x.to_key from (%s) x),
                stored as (select e.from_key, e.edge_type, e.to_key from agentdb.edges e
                           where e.source_id = $1 and e.index_id = $2 and (%s))
                select (select count(*) from (select * from expected except select * from stored) d),
                       (select count(*) from (select * from stored except select * from expected) d)
                $q$, r.key_expr, readable, r.node_expr, idx.edge_type, agentdb_internal.index_edges_sql(src, idx, readable), owned)
            into missing, extra using src.id, idx.id;
        end if;
        execute format($q$
            with nodes as (select distinct %s as key from %s c where (%s))
            select count(*) from agentdb.edges e
            where e.source_id = $1 and e.index_id = $2 and (%s)
              and (not exists (select 1 from nodes n where n.key = e.from_key)
                   or not exists (select 1 from nodes n where n.key = e.to_key))
            $q$, r.key_expr, readable, r.node_expr, owned)
        into dangling using src.id, idx.id;
        index_name := idx.name;
        what := 'missing';
        mismatches := missing;
        return next;
        what := 'extra';
        mismatches := extra;
        return next;
        what := 'dangling';
        mismatches := dangling;
        return next;
    end loop;
end;
$$;

-- Rebuild the field-derived edges of source `source`'s index `index` (every such index when null) from its
-- documents (repair after a check found differences); explicit edges are left alone. Returns the edge count.
create or replace function agentdb.index_rebuild(source text, index text default null) returns bigint
language plpgsql as $$
declare
    src agentdb.sources := agentdb_internal.source_named(index_rebuild.source);
    idx agentdb.indexes;
    n bigint;
    total bigint := 0;
begin
    if index_rebuild.index is not null then
        perform agentdb_internal.index_get(src, index_rebuild.index);
    end if;
    perform 1 from agentdb.corpus_stats c where c.source_id = src.id for update;  -- as index_create
    for idx in select * from agentdb.indexes i
               where i.source_id = src.id and i.field is not null
                 and (index_rebuild.index is null or i.name = index_rebuild.index) order by i.id loop
        delete from agentdb.edges e where e.source_id = src.id and e.index_id = idx.id;
        execute agentdb_internal.index_add_sql(src, idx, format('%I.%I', src.table_schema, src.table_name)) using src.id;
        get diagnostics n = row_count;
        total := total + n;
    end loop;
    return total;
end;
$$;

-- What the edge readers below (SECURITY DEFINER, called for the active role) may read of index `index_name`
-- of source `source_id`: `readable`, the relation of the source's rows the role may read
-- (index_reader_rows), null when it may read none of the index (not the source, or not the index's field);
-- `whole_table` when that relation is the table itself; the index's id and whether it is a field's; the key
-- and node expressions over the rows (alias c). 3010 at `index` when the source has no such index.
create or replace function agentdb_internal.index_readable(
    source_id int, index_name text,
    out readable text, out whole_table boolean, out index_id int, out of_field boolean,
    out key_expr text, out node_expr text
) language plpgsql stable as $$
declare
    src agentdb.sources;
    idx agentdb.indexes;
begin
    select * into src from agentdb.sources s where s.id = index_readable.source_id;
    if not found then
        return;
    end if;
    readable := agentdb_internal.index_reader_rows(src);
    if readable is null then
        return;
    end if;
    idx := agentdb_internal.index_get(src, index_name);
    if not agentdb.principal_field_granted(idx.field) then
        readable := null;
        return;
    end if;
    whole_table := readable = format('%I.%I', src.table_schema, src.table_name);
    index_id := idx.id;
    of_field := idx.field is not null;
    select r.key_expr, r.node_expr into key_expr, node_expr from agentdb_internal.index_row_sql(src, null, 'c') r;
end;
$$;

-- The edges at `key` in index `index_name` of source `source_id` for agentdb.neighbors: the key at the other end,
-- the edge type and the weight (the largest when a key is reached both ways), out from the key, in to it, or
-- both, of the types `edge_types` (null = any). SECURITY DEFINER over agentdb.edges, which principals' roles
-- cannot read; for the rows the active role may read (index_reader_rows): empty unless it may read the
-- source, and for a principal limited to some rows nothing unless `key` is one of them, and only the edges
-- whose other end is one too. agentdb.neighbors also keeps only the keys agentdb.read returns to the caller
-- under its filters. 3010 at `index` when the source has no such index.
create or replace function agentdb_internal.index_edges(
    source_id int, index_name text, key text, direction text, edge_types text[]
) returns table (neighbor text, edge_type text, weight float8)
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
declare
    g record := agentdb_internal.index_readable(index_edges.source_id, index_name);
begin
    if g.readable is null then
        return;
    end if;
    -- The keys the role may read are looked up among the edges' ends, uncorrelated: Citus plans no correlated
    -- subquery beside agentdb.edges, a reference table, over a distributed source.
    return query execute format($q$
    with x(k, t, w) as materialized (
        select e.to_key, e.edge_type, e.weight from agentdb.edges e
        where $4 in ('out', 'both') and e.source_id = $1 and e.index_id = $2
          and e.from_key = $3 and ($5 is null or e.edge_type = any ($5))
        union all
        select e.from_key, e.edge_type, e.weight from agentdb.edges e
        where $4 in ('in', 'both') and e.source_id = $1 and e.index_id = $2
          and e.to_key = $3 and ($5 is null or e.edge_type = any ($5))
    )%s
    select x.k, x.t, max(x.w) from x
    where %s
    group by x.k, x.t $q$,
        case when g.whole_table then ''
             else format(', readable(key) as materialized (select distinct %2$s from %1$s c'
                         ' where %2$s = any (array(select x.k from x) || $3) and (%3$s))',
                         g.readable, g.key_expr, g.node_expr) end,
        case when g.whole_table then 'true'
             else '$3 in (select key from readable) and x.k in (select key from readable)' end)
    using source_id, g.index_id, key, direction, edge_types;
end;
$$;

-- The neighbours of document `node` in index `index` of source `source` that the caller may read, for analysts
-- and navigation: `direction` 'out' (a tree node's children, a graph node's successors), 'in' (a tree node's
-- parent, a graph node's predecessors) or 'both'; only edges of the types `edge_types` (null = any); at most
-- `max` (1..256), by weight (highest first), then key and edge type. Runs in the caller's role: a key is kept
-- only when agentdb.read returns its chunk 0 to the caller under `scope` (query filters and row filter) and
-- the role's row security, and `max` counts only those; the start node must be readable under the scope's
-- row filter and row security (else nothing: a hidden node and a missing one look alike). Edges to
-- keys with no document are not returned. Errors: 3010 at source or index, 3007 at node, direction,
-- edge_types[i] or max.
create or replace function agentdb.neighbors(
    source text,
    index text,
    node text,
    direction text default 'out',
    edge_types text[] default null,
    max int default 8,
    scope jsonb default null
) returns table (key text, edge_type text, weight float8)
language plpgsql stable as $$
declare
    src agentdb.sources := agentdb_internal.source_named(neighbors.source);
    bad int;
    cand_keys text[];
    cand_types text[];
    cand_weights float8[];
begin
    if neighbors.node is null or neighbors.node = '' then
        perform agentdb.invalid_param('node must be a document key', 'node');
    end if;
    if neighbors.direction is null or neighbors.direction not in ('out', 'in', 'both') then
        perform agentdb.invalid_param(
            format('direction must be out, in or both, not %L', neighbors.direction), 'direction');
    end if;
    if array_ndims(neighbors.edge_types) > 1 then
        perform agentdb.invalid_param('edge_types must be a list of edge types', 'edge_types');
    end if;
    select t.n - 1 into bad from unnest(neighbors.edge_types) with ordinality t(v, n)
    where t.v is null or t.v = '' order by t.n limit 1;
    if bad is not null then
        perform agentdb.invalid_param('an edge type must be a non-empty string',
                                    format('edge_types[%s]', bad));
    end if;
    if neighbors.max is null or neighbors.max < 1 or neighbors.max > 256 then
        perform agentdb.invalid_param(
            format('max must be between 1 and 256, not %s', coalesce(neighbors.max::text, 'null')), 'max');
    end if;
    select coalesce(array_agg(e.neighbor order by e.neighbor, e.edge_type), '{}'),
           coalesce(array_agg(e.edge_type order by e.neighbor, e.edge_type), '{}'),
           coalesce(array_agg(e.weight order by e.neighbor, e.edge_type), '{}')
    into cand_keys, cand_types, cand_weights
    from agentdb_internal.index_edges(src.id, neighbors.index, neighbors.node, neighbors.direction,
                                      neighbors.edge_types) e;
    if cardinality(cand_keys) = 0
       or not exists (select 1 from agentdb.read(
                          source => neighbors.source, keys => array[neighbors.node], chunk_from => array[0],
                          chunk_to => array[0], fields => '{}',
                          scope => jsonb_build_object('row_filter', neighbors.scope->'row_filter'))) then
        return;
    end if;
    return query
    select c.k, c.t, c.w
    from unnest(cand_keys, cand_types, cand_weights) with ordinality c(k, t, w, ord)
    where c.ord in (select r.ord from agentdb.read(
              source => neighbors.source, keys => cand_keys, chunk_from => array_fill(0, array[cardinality(cand_keys)]),
              chunk_to => array_fill(0, array[cardinality(cand_keys)]), scope => neighbors.scope, fields => '{}') r)
    order by c.w desc, c.k, c.t
    limit neighbors.max;
end;
$$;

-- The roots of index `index_name` of source `source_id` for agentdb.index_roots: the documents no other
-- document points to (a tree's nodes without a parent document; a parent that names no document, or the node
-- itself, makes a root too). In an index of explicit edges, only documents with an edge of their own count.
-- SECURITY DEFINER over agentdb.edges, gated like index_edges, over the rows the active role may read: a
-- node whose parent is hidden from the role is one of its roots, exactly as one whose parent is missing.
create or replace function agentdb_internal.index_root_keys(source_id int, index_name text)
returns table (key text)
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
declare
    g record := agentdb_internal.index_readable(index_root_keys.source_id, index_name);
begin
    if g.readable is null then
        return;
    end if;
    return query execute format($q$
        with nodes as materialized (select distinct %s as key from %s c where (%s))
        select n.key from nodes n
        where not exists (select 1 from agentdb.edges e join nodes p on p.key = e.from_key
                          where e.source_id = $1 and e.index_id = $2 and e.to_key = n.key and e.from_key <> n.key)
          and ($3 or exists (select 1 from agentdb.edges e
                             where e.source_id = $1 and e.index_id = $2 and (e.from_key = n.key or e.to_key = n.key)))
        $q$, g.key_expr, g.readable, g.node_expr)
    using source_id, g.index_id, g.of_field;
end;
$$;

-- The roots of index `index` of source `source` that the caller may read (see index_root_keys), by key, at most
-- `max` (null = all): where a ranked tree walk may start ($roots). Runs in the caller's role and keeps the keys
-- agentdb.read returns under the `scope` (query filters and row filter) and row security. 3010 at source or index.
create or replace function agentdb.index_roots(
    source text,
    index text,
    max int default null,
    scope jsonb default null
) returns table (key text)
language plpgsql stable as $$
declare
    src agentdb.sources := agentdb_internal.source_named(index_roots.source);
    roots text[];
begin
    if index_roots.max is not null and index_roots.max < 1 then
        perform agentdb.invalid_param('max must be at least 1 (or null: all)', 'max');
    end if;
    select coalesce(array_agg(x.key order by x.key), '{}') into roots
    from agentdb_internal.index_root_keys(src.id, index_roots.index) x;
    if cardinality(roots) = 0 then
        return;
    end if;
    return query
    select roots[r.ord]
    from agentdb.read(source => index_roots.source, keys => roots, chunk_from => array_fill(0, array[cardinality(roots)]),
                      chunk_to => array_fill(0, array[cardinality(roots)]), scope => index_roots.scope,
                      fields => '{}') r
    order by r.ord
    limit index_roots.max;
end;
$$;
