-- Retrieve-then-expand (seed 003, DashAI AgenticSingleRetriever `expand_window`): widen each hit with the
-- neighbouring chunks of its document and merge windows that meet, in one statement over the source table.
--
-- Rules (agentdb.expand and the Python reference in tests/test_expansion.py implement the same ones):
--   * A window holds `expand_window` chunk positions in total, the hit's own included: centred when odd,
--     the extra position after the hit when even (window 4 around chunk c covers c-1 .. c+2).
--   * Windows never leave the document: positions below 0 or past the document's last chunk simply do
--     not exist, so a window at an edge is clipped, NOT shifted (the seed only says "never leave the
--     document"; clipping keeps every window centred on its hit).
--   * Windows of the same document that overlap or touch (the next starts right after the previous ends)
--     merge into ONE hit. It keeps every field of its best input hit (lowest `rank`, then input order) -
--     id, chunk, rank, scores, title, metadata - and gets the merged `text`, `chunks` (the positions it
--     covers, ascending) and `hit_chunks` (the positions of the input hits it absorbed). Output order is
--     the best hits' order.
--   * Text is the concatenation in document order. Chunks of a document overlap by the source's
--     `chunk_overlap` tokens, so two consecutive positions are joined without repeating the overlap: the
--     longest suffix of the first that is a prefix of the second is written once (agentdb.chunk_overlap).
--     With chunk_overlap = 0, or when no overlap is found, consecutive chunks are joined with one space;
--     positions that are not consecutive (a neighbour missing or hidden by a filter) with ' … '.
--   * Every neighbour is read by agentdb.read, the one scoped reader: `filter`, `filter_query`,
--     `exclusion_query` and `row_filter` apply as in agentdb.retrieve, under the caller's role, so row
--     security hides what it hides from the search too. `fields` projects the text as in agentdb.retrieve:
--     without 'text' the merged hit carries no text (and a role whose field grant lacks 'text' reads none).
--   * expand_window = 1 changes nothing (no merging either); each hit only gains `chunks` = [chunk] and
--     `hit_chunks` = [chunk]. Registered tables (one row per document) are returned the same way.
--   * A hit none of whose window is readable is returned as it came, with `chunks` = [].

-- Re-applied on every migrate: drop earlier signatures first, or `create or replace` with new parameters
-- would leave an older overload behind and make calls ambiguous.
do $$
declare
    f regprocedure;
begin
    for f in select p.oid::regprocedure from pg_proc p
             where p.pronamespace = 'agentdb'::regnamespace and p.proname in ('expand', 'chunk_overlap', 'chunk_join')
    loop
        execute format('drop function %s', f);
    end loop;
end;
$$;

-- Length of the longest suffix of `a` that is also a prefix of `b` (0 when there is none). Candidate
-- starts are the occurrences in `a` of b's first character, tried from the longest suffix down.
create or replace function agentdb.chunk_overlap(a text, b text) returns int
language plpgsql immutable strict as $$
declare
    la int := length(a);
    lb int := length(b);
    first_char text := left(b, 1);
    p int := greatest(la - lb, 0);  -- a suffix longer than b cannot be a prefix of it
    q int;
begin
    if la = 0 or lb = 0 then
        return 0;
    end if;
    loop
        q := strpos(substr(a, p + 1), first_char);
        exit when q = 0;
        p := p + q;
        if substr(a, p) = left(b, la - p + 1) then
            return la - p + 1;
        end if;
    end loop;
    return 0;
end;
$$;

-- Append chunk text `b` at position `b_pos` to the text `a` that ends with position `a_pos`, following the
-- joining rules above (`dedup` = the source's chunks overlap).
create or replace function agentdb.chunk_join(a text, a_pos int, b text, b_pos int, dedup boolean)
returns text language plpgsql immutable as $$
declare
    k int;
begin
    if a is null then
        return b;
    end if;
    if b_pos <> a_pos + 1 then
        return a || ' … ' || b;
    end if;
    if dedup then
        k := agentdb.chunk_overlap(a, b);
        if k > 0 then
            return a || substr(b, k + 1);
        end if;
    end if;
    return a || ' ' || b;
end;
$$;

-- Expand `hits` (a JSON array of objects with at least "id" and "chunk", such as agentdb.retrieve's hits)
-- of source `source` to windows of `expand_window` chunks and merge the windows that meet; returns the
-- JSON array of merged hits. See the rules at the top of this file.
create or replace function agentdb.expand(
    source text,
    hits jsonb,
    expand_window int default 3,
    filter jsonb default null,
    row_filter jsonb default null,
    fields text[] default null,
    filter_query jsonb default null,
    exclusion_query jsonb default null
) returns jsonb
language plpgsql stable as $$
declare
    src agentdb.sources;
    r record;
    groups jsonb;
    texts jsonb := '{}'::jsonb;   -- group id -> {"text", "chunks"}
    cur_gid int;
    cur_text text;
    cur_pos int;
    cur_chunks jsonb;
    with_text boolean := fields is null or 'text' = any(fields);
    dedup boolean;
    result jsonb;
begin
    select * into src from agentdb.sources s where s.name = expand.source;
    if not found then
        perform agentdb.raise_error(3010, 'StorageFileNotFound', format('unknown source %L', expand.source), 'source');
    end if;
    if expand_window is null or expand_window < 1 or expand_window > 101 then
        perform agentdb.raise_error(3007, 'InvalidParamValue', 'expand_window must be between 1 and 101', 'expand_window');
    end if;
    if hits is null or jsonb_typeof(hits) <> 'array' then
        perform agentdb.raise_error(3007, 'InvalidParamValue', 'hits must be a JSON array', 'hits');
    end if;
    if exists (select 1 from jsonb_array_elements(hits) with ordinality h(v, n)
               where jsonb_typeof(v) <> 'object' or coalesce(jsonb_typeof(v->'id'), 'null') not in ('string', 'number')
                  or case when jsonb_typeof(v->'chunk') = 'number'
                          then (v->>'chunk')::numeric % 1 <> 0 or (v->>'chunk')::numeric < 0 else true end
                  or coalesce(jsonb_typeof(v->'rank'), 'null') not in ('number', 'null')) then
        perform agentdb.raise_error(3007, 'InvalidParamValue',
            'every hit must be an object with an "id", a chunk position ("chunk", an integer >= 0) and, optionally, a numeric "rank"', 'hits');
    end if;
    if jsonb_array_length(hits) = 0 then
        return '[]'::jsonb;
    end if;

    if expand_window = 1 or src.kind <> 'documents' then
        return coalesce((
            select jsonb_agg(v || jsonb_build_object('chunks', jsonb_build_array((v->>'chunk')::int),
                                                     'hit_chunks', jsonb_build_array((v->>'chunk')::int))
                             order by n)
            from jsonb_array_elements(hits) with ordinality h(v, n)), '[]'::jsonb);
    end if;

    -- Windows, then groups: a window starts a new group unless it begins at most one position after the
    -- furthest end of the earlier windows of its document (ordered by start).
    with h as (
        select n::int as ord, v as hit, v->>'id' as id, (v->>'chunk')::int as chunk,
               coalesce((v->>'rank')::float8, n::float8) as rank
        from jsonb_array_elements(hits) with ordinality x(v, n)
    ), w as (
        select h.*, greatest(0, chunk - (expand_window - 1) / 2) as lo, chunk + expand_window / 2 as hi
        from h
    ), m as (
        select w.*, max(hi) over (partition by id order by lo, ord rows between unbounded preceding and 1 preceding)
                   as prev_hi
        from w
    ), g as (
        select m.*, sum(case when prev_hi is null or lo > prev_hi + 1 then 1 else 0 end)
                        over (partition by id order by lo, ord) as part
        from m
    )
    select jsonb_agg(jsonb_build_object('gid', gid, 'id', id, 'lo', lo, 'hi', hi, 'best', best,
                                        'hit_chunks', hit_chunks))
    into groups
    from (
        select row_number() over (order by best_rank, best_ord) as gid, grouped.*
        from (
            select id, min(lo) as lo, max(hi) as hi,
                   (array_agg(hit order by rank, ord))[1] as best,
                   (array_agg(rank order by rank, ord))[1] as best_rank,
                   (array_agg(ord order by rank, ord))[1] as best_ord,
                   to_jsonb(array(select distinct c from unnest(array_agg(chunk)) c order by 1)) as hit_chunks
            from g group by id, part
        ) grouped
    ) numbered;

    dedup := src.chunk_overlap > 0;

    -- One read for every window: the readable chunks of each group, in document order.
    for r in
        select x.ord as gid, x.chunk, x.text
        from agentdb.read(expand.source,
                          array(select g->>'id' from jsonb_array_elements(groups) g order by (g->>'gid')::int),
                          array(select (g->>'lo')::int from jsonb_array_elements(groups) g order by (g->>'gid')::int),
                          array(select (g->>'hi')::int from jsonb_array_elements(groups) g order by (g->>'gid')::int),
                          filter => expand.filter, filter_query => expand.filter_query,
                          exclusion_query => expand.exclusion_query, row_filter => expand.row_filter,
                          fields => expand.fields) x
    loop
        if cur_gid is distinct from r.gid then
            if cur_gid is not null then
                texts := texts || jsonb_build_object(cur_gid::text, jsonb_build_object('text', cur_text, 'chunks', cur_chunks));
            end if;
            cur_gid := r.gid;
            cur_text := null;
            cur_chunks := '[]'::jsonb;
        end if;
        cur_text := agentdb.chunk_join(cur_text, cur_pos, r.text, r.chunk, dedup);
        cur_pos := r.chunk;
        cur_chunks := cur_chunks || to_jsonb(r.chunk);
    end loop;
    if cur_gid is not null then
        texts := texts || jsonb_build_object(cur_gid::text, jsonb_build_object('text', cur_text, 'chunks', cur_chunks));
    end if;

    select coalesce(jsonb_agg(
               case when t.v is null
                    then g->'best' || jsonb_build_object('chunks', '[]'::jsonb, 'hit_chunks', g->'hit_chunks')
                    else g->'best' || jsonb_build_object('chunks', t.v->'chunks', 'hit_chunks', g->'hit_chunks')
                         || case when with_text then jsonb_build_object('text', t.v->'text') else '{}'::jsonb end
               end
               order by (g->>'gid')::int), '[]'::jsonb)
    into result
    from jsonb_array_elements(groups) g
    left join lateral (select texts->(g->>'gid') as v) t on true;
    return result;
end;
$$;
