-- Ranked tree navigation for analysts: the SQL door of `steps.retrieval.navigation` with strategy "tree" and
-- selection "ranked" (agentdb.agent.walk + navigation.rank_tree), returning the same documents in the same
-- order with the same scores for the same request. Every read is the caller's: nodes through agentdb.read,
-- children through agentdb.neighbors, relevance through agentdb.score_keys, seeds through agentdb.retrieve.
--
-- The walk (kept equal to the Python one by tests/test_navigation.py):
--   * start: `start_key`; else `start_nodes` ('$roots', '$hits' or comma-separated keys); else the seed
--     search's hits (agentdb.retrieve with the same query, mode and filters, `top_k` documents) and their
--     parents;
--   * a node's relevance: 0.8 x its best chunk's cosine similarity + 0.2 x min(its best chunk's BM25 / the
--     query's best BM25 in scope, 1); a seed hit of rank r (from 0) adds 0.1 / (1 + r);
--   * best-first: the frontier's highest path score next (ties: the smallest key in code-point order); a
--     root's path score is its relevance, a child's its relevance + 0.5 x its parent's path score; an
--     expansion offers the `beam_width` best unvisited children (ties: stored order) of a node above
--     `max_depth`; a key offered again keeps the higher score; at most `max_nodes` reads (a node found
--     unreadable counts and closes its branch);
--   * answer: the visited documents by relevance (ties: visit order), at most `top_k`.

-- Re-applied on every migrate: drop earlier signatures first, or `create or replace` with new parameters
-- would leave an older overload behind and make calls ambiguous.
do $$
declare
    f regprocedure;
begin
    for f in select p.oid::regprocedure from pg_proc p
             where p.pronamespace = 'agentdb'::regnamespace and p.proname = 'tree_walk'
    loop
        execute format('drop function %s', f);
    end loop;
end;
$$;

create or replace function agentdb.tree_walk(
    source text,
    index text,
    query text default '',
    query_embedding vector default null,
    start_key text default null,
    start_nodes text default null,
    max_depth int default 5,
    beam_width int default 3,
    max_nodes int default 30,
    top_k int default 10,
    mode text default null,
    threshold float8 default 0.5,
    rrf_k int default 60,
    filter jsonb default null,
    filter_query jsonb default null,
    exclusion_query jsonb default null,
    row_filter jsonb default null,
    fields text[] default null
) returns table (rank int, id text, score float8, depth int, parent text, path text[], visit_order int,
                 title text, text text, metadata jsonb)
language plpgsql volatile as $$
declare
    dense_weight constant float8 := 0.8;
    seed_prior constant float8 := 0.1;
    decay constant float8 := 0.5;
    seeds text[] := '{}';
    starts text[];
    scale float8;
    prior jsonb := '{}';       -- key -> seed prior
    frontier jsonb := '{}';    -- key -> {depth, parent, path, score}
    closed text[] := '{}';
    visits jsonb := '[]';      -- [{key, depth, parent, path, order, title, text, metadata}]
    reads int := 0;
    cur record;
    node record;
    child record;
    k text;
    i int;
    kids text[];
    cand jsonb;
begin
    if max_depth is null or max_depth < 1 or max_depth > 20 then
        perform agentdb.raise_error(3007, 'InvalidParamValue', 'max_depth must be between 1 and 20', 'max_depth');
    end if;
    if beam_width is null or beam_width < 1 or beam_width > 20 then
        perform agentdb.raise_error(3007, 'InvalidParamValue', 'beam_width must be between 1 and 20', 'beam_width');
    end if;
    if max_nodes is null or max_nodes < 1 or max_nodes > 500 then
        perform agentdb.raise_error(3007, 'InvalidParamValue', 'max_nodes must be between 1 and 500', 'max_nodes');
    end if;
    if start_key is not null and start_nodes is not null then
        perform agentdb.raise_error(3007, 'InvalidParamValue', 'start_nodes and start_key exclude each other',
                                    'start_nodes');
    end if;
    mode := coalesce(mode, case when query_embedding is null then 'lexical' else 'hybrid' end);

    -- The seed search, and the query's best BM25 score in scope (the lexical leg's scale).
    select coalesce(array_agg(h->>'id' order by n), '{}') into seeds
    from jsonb_array_elements((agentdb.retrieve(source, query, query_embedding, mode => mode, top_k => top_k,
                                                rrf_k => rrf_k, threshold => threshold, filter => tree_walk.filter,
                                                group_by_doc => true, row_filter => row_filter, fields => fields,
                                                filter_query => filter_query,
                                                exclusion_query => exclusion_query))->'hits') with ordinality x(h, n);
    seeds := array(select s from unnest(seeds) with ordinality u(s, n) group by s order by min(n));
    select coalesce(((agentdb.retrieve(source, query, mode => 'lexical', top_k => 1, filter => tree_walk.filter,
                                       row_filter => row_filter, filter_query => filter_query,
                                       exclusion_query => exclusion_query))->'hits'->0->>'bm25_score')::float8, 1.0)
    into scale;
    if scale = 0 then
        scale := 1.0;
    end if;
    scale := greatest(scale, 1e-9);
    for i in 1 .. cardinality(seeds) loop
        prior := prior || jsonb_build_object(seeds[i], seed_prior / (1 + (i - 1)));
    end loop;

    if start_key is not null then
        starts := array[start_key];
    elsif start_nodes = '$roots' then
        starts := array(select r.key from agentdb.index_roots(source, index, null, tree_walk.filter, filter_query,
                                                               exclusion_query, row_filter) r);
    elsif start_nodes is null or start_nodes = '$hits' then
        starts := seeds || array(select n.key from unnest(seeds) with ordinality s(key, o),
                                 lateral agentdb.neighbors(source, index, s.key, 'in', null, 1, tree_walk.filter,
                                                           filter_query, exclusion_query, row_filter) n
                                 order by s.o);
    else
        starts := array(select btrim(x) from unnest(string_to_array(start_nodes, ',')) x where btrim(x) <> '');
    end if;
    starts := array(select s from unnest(starts) with ordinality u(s, n) group by s order by min(n));

    -- Roots: depth 0, path score = relevance + seed prior.
    for node in
        select u.key, coalesce(sc.rel, 0) + coalesce((prior->>u.key)::float8, 0) as score
        from unnest(starts) u(key)
        left join (select s.doc_id, dense_weight * coalesce(s.dense, 0)
                                    + (1 - dense_weight) * least(s.lexical / scale, 1.0) as rel
                   from agentdb.score_keys(source, starts, query, query_embedding, tree_walk.filter, filter_query,
                                           exclusion_query, row_filter) s) sc on sc.doc_id = u.key
    loop
        frontier := frontier || jsonb_build_object(node.key, jsonb_build_object(
            'depth', 0, 'parent', null, 'path', jsonb_build_array(node.key), 'score', node.score));
    end loop;

    loop
        exit when frontier = '{}'::jsonb or reads >= max_nodes;
        select f.key, f.value into cur from jsonb_each(frontier) f
        order by (f.value->>'score')::float8 desc, f.key collate "C" limit 1;
        frontier := frontier - cur.key;
        reads := reads + 1;
        select r.title, r.text, r.metadata into node
        from agentdb.read(source, array[cur.key], array[0], array[0], tree_walk.filter, filter_query,
                          exclusion_query, row_filter, fields) r;
        closed := closed || cur.key;
        if not found then
            continue;  -- hidden or gone: this branch stops, the rest of the frontier stays
        end if;
        visits := visits || jsonb_build_object('key', cur.key, 'depth', cur.value->'depth', 'parent',
            cur.value->'parent', 'path', cur.value->'path', 'order', jsonb_array_length(visits),
            'title', node.title, 'text', node.text, 'metadata', node.metadata);
        if (cur.value->>'depth')::int >= max_depth then
            continue;
        end if;
        kids := array(select n.key from agentdb.neighbors(source, index, cur.key, 'out', null, 256, tree_walk.filter,
                                                          filter_query, exclusion_query, row_filter) n);
        kids := array(select c from unnest(kids) with ordinality u(c, n) where c <> all(closed)
                      group by c order by min(n));
        for child in
            select u.key, coalesce(sc.rel, 0) + decay * (cur.value->>'score')::float8 as score
            from unnest(kids) with ordinality u(key, n)
            left join (select s.doc_id, dense_weight * coalesce(s.dense, 0)
                                        + (1 - dense_weight) * least(s.lexical / scale, 1.0) as rel
                       from agentdb.score_keys(source, kids, query, query_embedding, tree_walk.filter, filter_query,
                                               exclusion_query, row_filter) s) sc on sc.doc_id = u.key
            order by 2 desc, u.n
            limit beam_width
        loop
            cand := frontier->child.key;
            if cand is null or child.score > (cand->>'score')::float8 then
                frontier := frontier || jsonb_build_object(child.key, jsonb_build_object(
                    'depth', (cur.value->>'depth')::int + 1, 'parent', cur.key,
                    'path', (cur.value->'path') || to_jsonb(child.key), 'score', child.score));
            end if;
        end loop;
    end loop;

    return query
    select (row_number() over (order by x.relevance desc, x.ord))::int, x.key, x.relevance, x.depth, x.parent,
           x.path, x.ord, x.title, x.text, x.metadata
    from (
        select v->>'key' as key, (v->>'depth')::int as depth, v->>'parent' as parent,
               array(select jsonb_array_elements_text(v->'path')) as path, (v->>'order')::int as ord,
               v->>'title' as title, v->>'text' as text, v->'metadata' as metadata,
               coalesce(sc.rel, 0) + coalesce((prior->>(v->>'key'))::float8, 0) as relevance
        from jsonb_array_elements(visits) v
        left join (select s.doc_id, dense_weight * coalesce(s.dense, 0)
                                    + (1 - dense_weight) * least(s.lexical / scale, 1.0) as rel
                   from agentdb.score_keys(source, array(select e->>'key' from jsonb_array_elements(visits) e),
                                           query, query_embedding, tree_walk.filter, filter_query, exclusion_query,
                                           row_filter) s) sc on sc.doc_id = v->>'key'
    ) x
    order by x.relevance desc, x.ord
    limit top_k;
end;
$$;
