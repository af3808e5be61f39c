-- Retrieve-then-expand (DashAI AgenticSingleRetriever's `expand_window`): widen each hit with the
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
--   * Every neighbour is read by agentdb.read, the one scoped reader: the `scope` (query filters and row
--     filter) applies as in agentdb.retrieve, under the caller's role, so row security hides what it hides
--     from the search too. `fields` projects the text as in agentdb.retrieve:
--     without 'text' the merged hit carries no text (and a role whose field grant lacks 'text' reads none).
--   * expand_window = 1 changes nothing (no merging either); each hit only gains `chunks` = [chunk] and
--     `hit_chunks` = [chunk]. Registered tables (one row per document) are returned the same way.
--   * A hit none of whose window is readable is returned as it came, with `chunks` = [].

-- Length of the longest suffix of `a` that is also a prefix of `b` (0 when there is none). Only the last
-- length(b) characters of `a` can take part (a longer suffix cannot be a prefix of b). An overlap of `probe`
-- characters or more starts with b's first `probe` characters, so their occurrences in that tail (found by
-- strpos, from the left, i.e. the longest first) are the only candidates to verify; shorter overlaps are then
-- tried from probe - 1 down. Chunks overlap by tens of characters, so this checks a handful of candidates
-- where a scan for b's first character would check dozens.
create or replace function agentdb.chunk_overlap(a text, b text) returns int
language plpgsql immutable strict as $$
declare
    lb int := length(b);
    t text;             -- the tail of a that may overlap b
    lt int;
    probe int;
    head text;
    p int := 0;         -- candidate start in t (1-based) = lt - k + 1 for overlap k
    q int;
begin
    if lb = 0 or a = '' then
        return 0;
    end if;
    t := right(a, lb);
    lt := length(t);
    probe := least(16, lt);
    head := left(b, probe);
    loop
        q := strpos(substr(t, p + 1), head);
        exit when q = 0;
        p := p + q;
        if substr(t, p) = left(b, lt - p + 1) then
            return lt - p + 1;
        end if;
    end loop;
    for k in reverse probe - 1 .. 1 loop
        if right(t, k) = left(b, k) then
            return k;
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
    scope jsonb default null,
    fields text[] default null
) returns jsonb
language plpgsql stable as $$
declare
    src agentdb.sources := agentdb_internal.source_named(expand.source);
    r record;
    -- The groups, by group id (1-based, in output order): document, window bounds, the input position of the
    -- best hit (from 1), and the positions of the hits merged into it.
    g_id text[];
    g_lo int[];
    g_hi int[];
    g_best int[];
    g_hit_chunks jsonb[];
    -- The merged text and readable positions of each group that has any (by group id).
    t_gid int[] := '{}';
    t_text text[] := '{}';
    t_chunks jsonb[] := '{}';
    cur_gid int;
    cur_text text;
    cur_pos int;
    cur_chunks int[];
    k int;
    with_text boolean := fields is null or 'text' = any(fields);
    dedup boolean;
    result jsonb;
begin
    perform agentdb_internal.check_between(expand_window, 1, 101, 'expand_window');
    if hits is null or jsonb_typeof(hits) <> 'array' then
        perform agentdb.invalid_param('hits must be a JSON array', 'hits');
    end if;
    if exists (select 1 from jsonb_array_elements(hits) with ordinality h(v, n)
               where jsonb_typeof(v) <> 'object' or coalesce(jsonb_typeof(v->'id'), 'null') not in ('string', 'number')
                  or case when jsonb_typeof(v->'chunk') = 'number'
                          then (v->>'chunk')::numeric % 1 <> 0 or (v->>'chunk')::numeric < 0 else true end
                  or coalesce(jsonb_typeof(v->'rank'), 'null') not in ('number', 'null')) then
        perform agentdb.invalid_param(
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
    -- furthest end of the earlier windows of its document (ordered by start). Only positions and ranks are
    -- carried along; each group's best hit is taken from `hits` once, at the end.
    with h as (
        select n::int as ord, v->>'id' as id, (v->>'chunk')::int as chunk,
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
    ), grouped as (
        select id, min(lo) as lo, max(hi) as hi,
               (array_agg(rank order by rank, ord))[1] as best_rank,
               (array_agg(ord order by rank, ord))[1] as best_ord,
               to_jsonb(array(select distinct c from unnest(array_agg(chunk)) c order by 1)) as hit_chunks
        from g group by id, part
    )
    select array_agg(id order by best_rank, best_ord), array_agg(lo order by best_rank, best_ord),
           array_agg(hi order by best_rank, best_ord), array_agg(best_ord order by best_rank, best_ord),
           array_agg(hit_chunks order by best_rank, best_ord)
    into g_id, g_lo, g_hi, g_best, g_hit_chunks
    from grouped;

    dedup := src.chunk_overlap > 0;

    -- One read for every window: the readable chunks of each group, in document order, joined by the rules
    -- of agentdb.chunk_join (written out here: this loop runs once per chunk read).
    for r in
        select x.ord as gid, x.chunk, x.text
        from agentdb.read(source => expand.source, keys => g_id, chunk_from => g_lo, chunk_to => g_hi,
                          scope => expand.scope, fields => expand.fields) x
    loop
        if cur_gid is distinct from r.gid then
            if cur_gid is not null then
                t_gid := t_gid || cur_gid;
                t_text := t_text || cur_text;
                t_chunks := t_chunks || to_jsonb(cur_chunks);
            end if;
            cur_gid := r.gid;
            cur_text := r.text;
            cur_chunks := array[r.chunk];
        else
            if cur_text is null then
                cur_text := r.text;
            elsif r.chunk <> cur_pos + 1 then
                cur_text := cur_text || ' … ' || r.text;
            else
                k := case when dedup then agentdb.chunk_overlap(cur_text, r.text) end;
                cur_text := case when k > 0 then cur_text || substr(r.text, k + 1) else cur_text || ' ' || r.text end;
            end if;
            cur_chunks := cur_chunks || r.chunk;
        end if;
        cur_pos := r.chunk;
    end loop;
    if cur_gid is not null then
        t_gid := t_gid || cur_gid;
        t_text := t_text || cur_text;
        t_chunks := t_chunks || to_jsonb(cur_chunks);
    end if;

    select coalesce(jsonb_agg(
               case when t.gid is null
                    then hits->(b.best - 1) || jsonb_build_object('chunks', '[]'::jsonb, 'hit_chunks', b.hit_chunks)
                    else hits->(b.best - 1) || jsonb_build_object('chunks', t.chunks, 'hit_chunks', b.hit_chunks)
                         || case when with_text then jsonb_build_object('text', t.text) else '{}'::jsonb end
               end
               order by b.gid), '[]'::jsonb)
    into result
    from unnest(g_best, g_hit_chunks) with ordinality b(best, hit_chunks, gid)
    left join unnest(t_gid, t_text, t_chunks) t(gid, text, chunks) on t.gid = b.gid;
    return result;
end;
$$;
