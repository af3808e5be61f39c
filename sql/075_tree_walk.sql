-- Ranked tree navigation: the one implementation of the walk that `steps.retrieval.navigation` with strategy
-- "tree" and selection "ranked" runs (agentdb.agent.navigation.step calls agentdb_internal.tree_walk_run)
-- and analysts call as agentdb.tree_walk. Every read is the caller's: nodes through agentdb.read, children
-- and links through agentdb.neighbors, relevance through agentdb.score_keys (or agentdb.read for keyword
-- scoring), seeds through agentdb.retrieve, all under the same scope (query filters and row filter) and
-- projection.
--
-- The walk (its weights are the constants of tree_walk_relevance and tree_walk_run, nowhere else):
--   * start: `start_key`; else `start_nodes` ('$roots', '$hits' or comma-separated keys); else the seed
--     hits (given by the caller, or the seed search's: agentdb.retrieve with the same query, mode and
--     filters, `top_k` documents) and their parents;
--   * a document's own score: with scoring 'hybrid', 0.8 x its best chunk's cosine similarity + 0.2 x
--     min(its best chunk's BM25 / the query's best BM25 in scope, 1); with 'keywords', the share of the
--     query's keywords in its title or text (how Antfly ranks branches); its relevance: its own score + 0.2 x
--     the own score of its page (the key before '#', the document itself for a key without one) + 0.1 /
--     (1 + r) for a document of rank r (from 0) in the seed search run 2 x `top_k` deep, the seed hits first;
--   * best-first: the frontier's highest path score next (ties: the smallest key in code-point order); a
--     root's path score is its relevance, a child's its relevance + 0.5 x its parent's path score; an
--     expansion of a node above `max_depth` offers the `beam_width` best unvisited children (ties: stored
--     order), then, with `links_index`, the 2 most relevant unvisited out-neighbours in that index (ties:
--     stored order), each with its relevance as path score; a key offered again keeps the higher score; at
--     most `max_nodes` reads (a node found unreadable counts and closes its branch);
--   * answer: the 3 most relevant visited documents (ties: visit order), then the others by relevance +
--     0.2 x the relevance of the most relevant of those 3 that links to them in `links_index` (ties: visit
--     order), at most `top_k`; `score` is what each is ranked by.

-- The distinct lower-cased words of `body` (\w+), single characters and stopwords left out.
create or replace function agentdb_internal.keywords(body text) returns text[]
language sql immutable parallel safe as $$
    select coalesce(array_agg(distinct m[1]), '{}')
    from regexp_matches(lower(coalesce(body, '')), '\w+', 'g') m
    where length(m[1]) > 1
      and m[1] <> all ('{a,an,and,are,as,at,be,by,can,do,does,for,from,how,i,in,is,it,my,of,on,or,the,to,what,'
                       'when,where,which,who,why,with}'::text[])
$$;

-- The share of the query's keywords found in a node's title or text (0 for a query without keywords): a
-- keyword counts when it is a whole word there (\m, \M: a whole \w+ run, not part of a longer one), which
-- is the same as tokenizing the node's text and much cheaper than it in PostgreSQL's regex engine.
create or replace function agentdb_internal.keyword_overlap(query text, title text, body text) returns float8
language sql immutable parallel safe as $$
    select case when cardinality(q.words) = 0 then 0.0::float8
                else (select count(*) from unnest(q.words) x(w) where n.words ~ ('\m' || x.w || '\M'))::float8
                     / cardinality(q.words) end
    from (select agentdb_internal.keywords(query) as words) q,
         (select lower(coalesce(title, '') || ' ' || coalesce(body, '')) as words) n
$$;

-- A document's own score (see above) for each of `keys` the caller may read; `scale` is the query's best BM25
-- score in scope (hybrid scoring). Also the relevance a graph walk's chooser ranks neighbours by.
create or replace function agentdb_internal.tree_walk_own(
    source text,
    keys text[],
    query text,
    query_embedding vector,
    scale float8,
    scoring text,
    scope jsonb,
    fields text[]
) returns table (doc_id text, rel float8)
language sql stable as $$
    select s.doc_id, 0.8 * coalesce(s.dense, 0) + (1 - 0.8::float8) * least(s.lexical / greatest(scale, 1e-9), 1.0)
    from agentdb.score_keys(source => source, keys => keys, query => query, query_embedding => query_embedding,
                            scope => scope) s
    where scoring = 'hybrid'
    union all
    select r.doc_id, agentdb_internal.keyword_overlap(query, r.title, r.text)
    from agentdb.read(source => source, keys => keys, chunk_to => array_fill(0, array[cardinality(keys)]),
                      scope => scope, fields => fields) r
    where scoring = 'keywords'
$$;

-- A walk's relevance of `keys` (see above): own score + 0.2 x the page's own score + the seed prior; keys the
-- caller may not read return no row.
create or replace function agentdb_internal.tree_walk_relevance(
    source text,
    keys text[],
    query text,
    query_embedding vector,
    scale float8,
    prior jsonb,
    scoring text,
    scope jsonb,
    fields text[]
) returns table (doc_id text, rel float8)
language sql stable as $$
    with k as (
        select u.key, coalesce(nullif(split_part(u.key, '#', 1), ''), u.key) as page
        from unnest(keys) u(key)),
    own as (
        select o.doc_id, o.rel
        from agentdb_internal.tree_walk_own(
                 source => source, keys => array(select key from k union select page from k), query => query,
                 query_embedding => query_embedding, scale => scale, scoring => scoring, scope => scope,
                 fields => fields) o)
    select k.key, o.rel + 0.2 * coalesce(p.rel, 0) + coalesce((prior->>k.key)::float8, 0)
    from k join own o on o.doc_id = k.key left join own p on p.doc_id = k.page
$$;

-- The walk (see above) as one jsonb: `visits` in visit order ({key, depth, parent, path, order, score (the
-- path score it was read with), edge_type (for a link target), duration_ms (its read and expansion), title,
-- text, metadata}), `unreadable` (keys found hidden or gone), `stopped` ('max_nodes' when the budget ended it
-- with nodes still offered, else null) and `answer` ([{key, score}], best first). `seeds` null runs the seed
-- search; with `progress`, every visit is also raised as a notice 'agentdb.tree_walk.visit' whose detail is
-- the visit (without title, text and metadata) as it happens.
create or replace function agentdb_internal.tree_walk_run(
    source text,
    index text,
    query text,
    query_embedding vector,
    seeds text[],
    start_key text,
    start_nodes text,
    max_depth int,
    beam_width int,
    max_nodes int,
    top_k int,
    mode text,
    threshold float8,
    rrf_k int,
    fusion text,
    alpha float8,
    scoring text,
    scope jsonb,
    fields text[],
    links_index text,
    progress boolean
) returns jsonb
language plpgsql volatile as $$
declare
    seed_prior constant float8 := 0.1;
    prior_depth constant int := 2;
    decay constant float8 := 0.5;
    link_width constant int := 2;
    answer_head constant int := 3;
    link_bonus constant float8 := 0.2;
    ranked text[];
    starts text[];
    scale float8;
    prior jsonb := '{}';       -- key -> seed prior
    frontier jsonb := '{}';    -- key -> {depth, parent, path, score, edge_type}
    closed text[] := '{}';
    visits jsonb := '[]';      -- [{key, depth, parent, path, order, score, edge_type, duration_ms, ...}]
    unreadable jsonb := '[]';
    reads int := 0;
    started timestamptz;
    cur record;
    node record;
    child record;
    visit jsonb;
    i int;
    kids text[];
    links text[];
    link_types jsonb;          -- link target -> the edge type it was first listed with
    cand jsonb;
    offers jsonb;
    rels jsonb;                -- key -> relevance (of the keys being offered, then of the visits)
    head text[];
    via jsonb := '{}';         -- key -> relevance of the best head document linking to it
    answer jsonb;
begin
    perform agentdb_internal.check_between(max_depth, 1, 20, 'max_depth');
    perform agentdb_internal.check_between(beam_width, 1, 20, 'beam_width');
    perform agentdb_internal.check_between(max_nodes, 1, 500, 'max_nodes');
    if start_key is not null and start_nodes is not null then
        perform agentdb.invalid_param('start_nodes and start_key exclude each other',
                                    'start_nodes');
    end if;
    if scoring is null or scoring not in ('hybrid', 'keywords') then
        perform agentdb.invalid_param('scoring must be hybrid or keywords', 'scoring');
    end if;
    mode := coalesce(mode, case when query_embedding is null then 'lexical' else 'hybrid' end);

    if seeds is null then
        select coalesce(array_agg(h->>'id' order by n), '{}') into seeds
        from json_array_elements((agentdb.retrieve(source => source, query => query,
                                                    query_embedding => query_embedding, mode => mode, top_k => top_k,
                                                    rrf_k => rrf_k, threshold => threshold, scope => scope,
                                                    group_by_doc => true, fields => fields, fusion => fusion,
                                                    alpha => alpha, output_results => false))->'hits')
             with ordinality x(h, n);
    end if;
    seeds := array(select s from unnest(seeds) with ordinality u(s, n) group by s order by min(n));
    -- The query's best BM25 score in scope: the lexical leg's scale.
    select coalesce(((agentdb.retrieve(source => source, query => query, mode => 'lexical', top_k => 1,
                                       scope => scope, output_results => false))
                  ->'hits'->0->>'bm25_score')::float8, 1.0)
    into scale;
    if scale = 0 then
        scale := 1.0;
    end if;
    scale := greatest(scale, 1e-9);
    -- The prior: the seed search run prior_depth times deeper (within retrieve's bound), the seed hits first.
    select coalesce(array_agg(h->>'id' order by n), '{}') into ranked
    from json_array_elements((agentdb.retrieve(source => source, query => query, query_embedding => query_embedding,
                                                mode => mode, top_k => least(prior_depth * top_k, 1000),
                                                rrf_k => rrf_k, threshold => threshold, scope => scope,
                                                group_by_doc => true, fusion => fusion, alpha => alpha,
                                                output_results => false))->'hits') with ordinality x(h, n);
    ranked := array(select s from unnest(seeds || ranked) with ordinality u(s, n) group by s order by min(n));
    for i in 1 .. cardinality(ranked) loop
        prior := prior || jsonb_build_object(ranked[i], seed_prior / (1 + (i - 1)));
    end loop;

    if start_key is not null then
        starts := array[start_key];
    elsif start_nodes = '$roots' then
        starts := array(select r.key from agentdb.index_roots(source => source, index => index, scope => scope) r);
    elsif start_nodes is null or start_nodes = '$hits' then
        -- The seed hits and their parents: a section's answer often continues in a sibling, which the walk
        -- reaches from the parent.
        starts := seeds || array(select n.key from unnest(seeds) with ordinality s(key, o),
                                 lateral agentdb.neighbors(source => source, index => index, node => s.key,
                                                           direction => 'in', max => 1, scope => scope) n
                                 order by s.o);
    else
        starts := array(select btrim(x) from unnest(string_to_array(start_nodes, ',')) x where btrim(x) <> '');
    end if;
    starts := array(select s from unnest(starts) with ordinality u(s, n) group by s order by min(n));

    -- Roots: depth 0, path score = relevance.
    for node in
        select u.key, coalesce(sc.rel, 0) as score
        from unnest(starts) u(key)
        left join agentdb_internal.tree_walk_relevance(
                      source => source, keys => starts, query => query, query_embedding => query_embedding,
                      scale => scale, prior => prior, scoring => scoring, scope => scope, fields => fields) sc
               on sc.doc_id = u.key
    loop
        frontier := frontier || jsonb_build_object(node.key, jsonb_build_object(
            'depth', 0, 'parent', null, 'path', jsonb_build_array(node.key), 'score', node.score,
            'edge_type', null));
    end loop;

    loop
        exit when frontier = '{}'::jsonb or reads >= max_nodes;
        started := clock_timestamp();
        select f.key, f.value into cur from jsonb_each(frontier) f
        order by (f.value->>'score')::float8 desc, f.key collate "C" limit 1;
        frontier := frontier - cur.key;
        reads := reads + 1;
        select r.title, r.text, r.metadata into node
        from agentdb.read(source => source, keys => array[cur.key], chunk_from => array[0], chunk_to => array[0],
                          scope => scope, fields => fields) r;
        closed := closed || cur.key;
        if not found then
            unreadable := unreadable || to_jsonb(cur.key);
            continue;  -- hidden or gone: this branch stops, the rest of the frontier stays
        end if;
        if (cur.value->>'depth')::int < max_depth then
            kids := array(select n.key from agentdb.neighbors(source => source, index => index, node => cur.key,
                                                              max => 256, scope => scope) n);
            kids := array(select c from unnest(kids) with ordinality u(c, n) where c <> all(closed)
                          group by c order by min(n));
            links := '{}';
            link_types := '{}';
            if links_index is not null then
                select coalesce(array_agg(l.key order by l.n), '{}'),
                       coalesce(jsonb_object_agg(l.key, l.edge_type), '{}')
                into links, link_types
                from (select n.key, (array_agg(n.edge_type order by n.o))[1] as edge_type, min(n.o) as n
                      from agentdb.neighbors(source => source, index => links_index, node => cur.key, max => 256,
                                             scope => scope) with ordinality n(key, edge_type, weight, o)
                      where n.key <> all(closed)
                      group by n.key) l;
            end if;
            -- The best children by path score, then the best link targets by relevance, offered in that
            -- order; scored in one batch.
            if cardinality(kids) + cardinality(links) > 0 then
                select coalesce(jsonb_object_agg(sc.doc_id, sc.rel), '{}') into rels
                from agentdb_internal.tree_walk_relevance(
                         source => source,
                         keys => array(select c from unnest(kids || links) with ordinality u(c, n) group by c
                                       order by min(n)),
                         query => query, query_embedding => query_embedding, scale => scale, prior => prior,
                         scoring => scoring, scope => scope, fields => fields) sc;
                select coalesce(jsonb_agg(o.x order by o.part, o.ord), '[]') into offers
                from (
                    (select 0 as part,
                            row_number() over (order by coalesce((rels->>u.key)::float8, 0)
                                                        + decay * (cur.value->>'score')::float8 desc, u.n) as ord,
                            jsonb_build_object('key', u.key, 'score', coalesce((rels->>u.key)::float8, 0)
                                                                      + decay * (cur.value->>'score')::float8,
                                               'edge_type', null) as x
                     from unnest(kids) with ordinality u(key, n)
                     order by 2 limit beam_width)
                    union all
                    (select 1, row_number() over (order by coalesce((rels->>u.key)::float8, 0) desc, u.n),
                            jsonb_build_object('key', u.key, 'score', coalesce((rels->>u.key)::float8, 0),
                                               'edge_type', link_types->u.key)
                     from unnest(links) with ordinality u(key, n)
                     order by 2 limit link_width)
                ) o;
                for child in select (e->>'key') as key, (e->>'score')::float8 as score, e->'edge_type' as edge_type
                             from jsonb_array_elements(offers) e
                loop
                    cand := frontier->child.key;
                    if cand is null or child.score > (cand->>'score')::float8 then
                        frontier := frontier || jsonb_build_object(child.key, jsonb_build_object(
                            'depth', (cur.value->>'depth')::int + 1, 'parent', cur.key,
                            'path', (cur.value->'path') || to_jsonb(child.key), 'score', child.score,
                            'edge_type', child.edge_type));
                    end if;
                end loop;
            end if;
        end if;
        visit := jsonb_build_object('key', cur.key, 'depth', cur.value->'depth', 'parent', cur.value->'parent',
            'path', cur.value->'path', 'order', jsonb_array_length(visits), 'score', cur.value->'score',
            'edge_type', cur.value->'edge_type',
            'duration_ms', extract(epoch from clock_timestamp() - started) * 1000);
        if progress then
            raise notice 'agentdb.tree_walk.visit' using detail = visit::text;
        end if;
        visits := visits || (visit || jsonb_build_object('title', node.title, 'text', node.text,
                                                         'metadata', node.metadata));
    end loop;

    -- The answer: the head by relevance, then the rest with the bonus of the head's links.
    select coalesce(jsonb_object_agg(sc.doc_id, sc.rel), '{}') into rels
    from agentdb_internal.tree_walk_relevance(
             source => source, keys => array(select e->>'key' from jsonb_array_elements(visits) e), query => query,
             query_embedding => query_embedding, scale => scale, prior => prior, scoring => scoring, scope => scope,
             fields => fields) sc;
    head := array(select x->>'key' from jsonb_array_elements(visits) x
                  order by coalesce((rels->>(x->>'key'))::float8, 0) desc, (x->>'order')::int limit answer_head);
    if links_index is not null then
        select coalesce(jsonb_object_agg(t.key, t.via), '{}') into via
        from (select n.key, max(coalesce((rels->>h.key)::float8, 0)) as via
              from unnest(head) h(key),
                   lateral agentdb.neighbors(source => source, index => links_index, node => h.key, max => 256,
                                             scope => scope) n
              group by n.key) t;
    end if;
    select coalesce(jsonb_agg(jsonb_build_object('key', y.key, 'score', y.final)
                              order by y.pos nulls last, y.final desc, y.ord), '[]')
    into answer
    from (
        select z.key, z.pos, z.ord,
               case when z.pos is not null then z.relevance
                    else z.relevance + link_bonus * coalesce((via->>z.key)::float8, 0) end as final
        from (
            select x->>'key' as key, (x->>'order')::int as ord, coalesce((rels->>(x->>'key'))::float8, 0) as relevance,
                   array_position(head, x->>'key') as pos
            from jsonb_array_elements(visits) x
        ) z
        order by z.pos nulls last,
                 case when z.pos is not null then z.relevance
                      else z.relevance + link_bonus * coalesce((via->>z.key)::float8, 0) end desc,
                 z.ord
        limit top_k
    ) y;
    return jsonb_build_object('visits', visits, 'unreadable', unreadable,
                              'stopped', case when frontier <> '{}'::jsonb then 'max_nodes' end,
                              'answer', answer);
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
    rrf_k int default agentdb_internal.default_rrf_k(),
    scope jsonb default null,
    fields text[] default null,
    links_index text default null
) returns table (rank int, id text, score float8, depth int, parent text, path text[], visit_order int,
                 title text, text text, metadata jsonb)
language sql volatile as $$
    with w as (
        select agentdb_internal.tree_walk_run(
                   source => source, index => index, query => query, query_embedding => query_embedding,
                   seeds => null, start_key => start_key, start_nodes => start_nodes, max_depth => max_depth,
                   beam_width => beam_width, max_nodes => max_nodes, top_k => top_k, mode => mode,
                   threshold => threshold, rrf_k => rrf_k, fusion => 'rrf', alpha => 0.5, scoring => 'hybrid',
                   scope => scope, fields => fields, links_index => links_index, progress => false) as r),
    v as (
        select x->>'key' as key, x from w, jsonb_array_elements(w.r->'visits') x)
    select a.n::int, a.e->>'key', (a.e->>'score')::float8, (v.x->>'depth')::int, v.x->>'parent',
           array(select jsonb_array_elements_text(v.x->'path')), (v.x->>'order')::int, v.x->>'title',
           v.x->>'text', v.x->'metadata'
    from w cross join lateral jsonb_array_elements(w.r->'answer') with ordinality a(e, n)
    join v on v.key = a.e->>'key'
    order by a.n
$$;
