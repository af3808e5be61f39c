-- The caller's scope over a source, in one place: which rows a read may see (the query filters, the row
-- filter, row-level security through the caller's role), which fields it may show (the `fields`
-- projection), and agentdb.read, the one reader by key that expansion, document fetch, navigation and
-- memory use. agentdb.retrieve applies the same predicate and projection through the same helpers.

-- Raise 3007 at `fields[i]` unless every name in the projection `fields` is one of the source's fields,
-- `title` or `text` (null = every field).
create or replace function agentdb.check_projection(src agentdb.sources, fields text[]) returns void
language plpgsql stable as $$
declare
    allowed text[] := array['title', 'text'] || array(select f->>'name' from jsonb_array_elements(src.fields) f);
begin
    for i in 1 .. coalesce(cardinality(fields), 0) loop
        if fields[i] is null or not fields[i] = any(allowed) then
            perform agentdb.invalid_param(
                format('unknown field %L in the projection; known: %s', fields[i], array_to_string(allowed, ', ')),
                format('fields[%s]', i - 1));
        end if;
    end loop;
end;
$$;

-- A row's metadata as the projection `fields` shows it: all of it without a projection, else only the
-- projected keys.
create or replace function agentdb.project_metadata(metadata jsonb, fields text[]) returns jsonb
language sql immutable as $$
select case when fields is null then metadata
            else (select coalesce(jsonb_object_agg(key, value), '{}'::jsonb) from jsonb_each(metadata)
                  where key = any(fields)) end
$$;

-- A read's scope is one jsonb object, the `scope` parameter of agentdb.retrieve, agentdb.read and the functions
-- built on them: any of the keys `filter` (a metadata filter), `filter_query` and `exclusion_query` (query
-- objects: rows must match the one and not the other) and `row_filter` (a principal's row filter); a key
-- that is absent or null applies nothing, and so does a null scope. A filter's errors carry its key as the
-- path (`filter.year`), as when each was a parameter of its own; an unknown key is 3007 at `scope.<key>`,
-- so a misspelt filter is an error, never an unfiltered read.
--
-- The predicates a read of `src` (aliased c) applies under `scope`, written with the parameter placeholders
-- `refs` (filter, row filter, filter_query, exclusion_query, in that order) and the values to bind there:
--   pred: `filter` and `filter_query` match and `exclusion_query` does not;
--   row_pred: the caller's row filter, or 'true' when it is the active principal's own, which its role's
--   row security applies already (and which may read fields outside the role's column grant).
create or replace function agentdb_internal.scope_predicate(
    src agentdb.sources, scope jsonb, refs text[],
    out pred text, out row_pred text,
    out filter_params jsonb, out row_params jsonb, out fq_params jsonb, out ex_params jsonb
) language plpgsql stable as $$
declare
    doc_id text := (select r.doc_id from agentdb_internal.source_row_sql(src) r);
    row_filter jsonb := scope->'row_filter';
    exclusion_query jsonb := scope->'exclusion_query';
    unknown text;
    fq_pred text;
    ex_pred text;
begin
    if jsonb_typeof(scope) not in ('object', 'null') then
        perform agentdb.invalid_param(
            'scope must be a JSON object with any of filter, filter_query, exclusion_query and row_filter', 'scope');
    end if;
    if jsonb_typeof(scope) = 'object' then
        select k into unknown from jsonb_object_keys(scope) k
        where k <> all (array['filter', 'filter_query', 'exclusion_query', 'row_filter']) order by k limit 1;
        if unknown is not null then
            perform agentdb.invalid_param(
                format('unknown key %L in the scope; known: filter, filter_query, exclusion_query, row_filter',
                       unknown), 'scope.' || unknown);
        end if;
    end if;
    select c.predicate, c.params into pred, filter_params
    from agentdb_internal.compile_filter(src.fields, scope->'filter', refs[1], doc_id, 'filter') c;
    if row_filter is not null and agentdb.current_principal() is not null
       and agentdb.principal_row_filter_applies(row_filter) then
        row_pred := 'true';
        row_params := '[]'::jsonb;
    else
        select c.predicate, c.params into row_pred, row_params
        from agentdb_internal.compile_filter(src.fields, row_filter, refs[2], doc_id, 'row_filter') c;
    end if;
    select c.predicate, c.params into fq_pred, fq_params
    from agentdb_internal.compile_filter(src.fields, scope->'filter_query', refs[3], doc_id, 'filter_query') c;
    select c.predicate, c.params into ex_pred, ex_params
    from agentdb_internal.compile_filter(src.fields, exclusion_query, refs[4], doc_id, 'exclusion_query') c;
    if fq_pred <> 'true' then
        pred := format('(%s) and (%s)', pred, fq_pred);
    end if;
    if exclusion_query is not null and ex_pred <> 'true' then
        pred := format('(%s) and not (%s)', pred, ex_pred);
    elsif exclusion_query is not null and exclusion_query <> '{}'::jsonb and exclusion_query <> 'null'::jsonb then
        pred := 'false';  -- excluding everything (e.g. match_all) leaves nothing
    end if;
end;
$$;

-- The one reader by key: the chunks of the documents `keys` of source `source` (rows of a registered table,
-- as chunk 0), optionally only positions chunk_from[i] .. chunk_to[i] of keys[i] (null = no bound), that
-- the caller may see: the `scope` (the query filters and the row filter) as agentdb.retrieve applies it,
-- row-level security through the caller's role (a principal's role reads agentdb.source_relation), title,
-- text and metadata projected by `fields`. `ord` is the position of the key in `keys` (from 1); rows come by ord,
-- then chunk. A key that is missing and a key that is hidden are indistinguishable: neither returns a row.
-- Reads are one indexed join; nothing the caller cannot read is counted or shown.
create or replace function agentdb.read(
    source text,
    keys text[],
    chunk_from int[] default null,
    chunk_to int[] default null,
    scope jsonb default null,
    fields text[] default null
) returns table (ord int, doc_id text, chunk int, title text, text text, metadata jsonb)
language plpgsql stable as $$
declare
    src agentdb.sources := agentdb_internal.source_named(read.source);
    r record;
    s record;
begin
    if keys is null or array_ndims(keys) > 1 then
        perform agentdb.invalid_param('keys must be a one-dimensional array of keys', 'keys');
    end if;
    if cardinality(chunk_from) is distinct from cardinality(keys) and chunk_from is not null then
        perform agentdb.invalid_param('chunk_from must have one entry per key', 'chunk_from');
    end if;
    if cardinality(chunk_to) is distinct from cardinality(keys) and chunk_to is not null then
        perform agentdb.invalid_param('chunk_to must have one entry per key', 'chunk_to');
    end if;
    perform agentdb.check_projection(src, fields);
    if cardinality(keys) = 0 then
        return;
    end if;
    select * into r from agentdb_internal.source_row_sql(src);
    s := agentdb_internal.scope_predicate(src, read.scope, array['$4', '$5', '$6', '$7']);
    return query execute format($q$
        select k.ord::int, %1$s, (%2$s)::int,
               case when $8::text[] is null or 'title' = any($8) then %3$s end,
               case when $8::text[] is null or 'text' = any($8) then %4$s end,
               agentdb.project_metadata(%5$s, $8)
        from unnest($1::text[], $2::int[], $3::int[]) with ordinality k(key, lo, hi, ord)
        join %6$s c on %1$s = k.key and (%2$s) between coalesce(k.lo, 0) and coalesce(k.hi, 2147483647)
        where (%7$s) and (%8$s)
        order by k.ord, 3 $q$,
        r.doc_id, r.chunk, r.title, r.body, r.metadata, agentdb.source_relation(src), s.pred, s.row_pred)
        using keys, chunk_from, chunk_to, s.filter_params, s.row_params, s.fq_params, s.ex_params, fields;
end;
$$;
