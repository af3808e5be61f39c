-- The lexical index. Every source table carries agentdb_chunk_id and agentdb_tsv; these statement-level
-- triggers (argument: the source id) keep agentdb.postings, term_stats and corpus_stats equal to the
-- rows in the same transaction, whoever writes the table (agentdb's ingestion or another program).

-- The trigger functions run with their owner's rights (SECURITY DEFINER): whoever may write a source
-- table (a principal's writer role, another program writing a registered table) keeps its index current
-- without any privilege on the index tables themselves. Trigger functions cannot be called directly.

-- The same triggers keep the field-derived edges of the source's hierarchy and graph indexes current
-- (agentdb_internal.index_sync_sql, sql/070_indexes.sql), after the lexical index, in the same transaction.

-- Lock order: every writer of a source's index first locks its corpus_stats row, then term_stats rows.
-- Writers of one source thus queue on that row before holding any term, so concurrent transactions that
-- each delete and insert (a re-ingested batch) cannot deadlock on term_stats.

-- Re-applied on every migrate: drop earlier signatures first, or `create or replace` with new parameters
-- would leave an older overload behind (not the trigger functions, which the source tables' triggers hold
-- and which take no arguments).
do $$
declare
    f regprocedure;
begin
    for f in select p.oid::regprocedure from pg_proc p
             where p.pronamespace = 'agentdb'::regnamespace and p.prorettype <> 'trigger'::regtype
               and p.proname in ('lexical_add_sql', 'lexical_remove_sql', 'lexical_rebuild', 'lexical_check')
    loop
        execute format('drop function %s', f);
    end loop;
end;
$$;

-- The statements that add the postings and statistics of the rows of relation `rel` (a transition
-- table inside a trigger, or a whole source table when rebuilding). Returned as text because only the
-- trigger function itself can see its transition tables; $1 is the source id.
create or replace function agentdb.lexical_add_sql(rel text) returns text[]
language sql immutable as $$
select array[
    format($q$
    insert into agentdb.corpus_stats as c (source_id, n_chunks, total_len)
    select $1, count(*),
           coalesce(sum((select sum(coalesce(cardinality(t.positions), 1)) from unnest(n.agentdb_tsv) t)), 0)
    from %s n
    on conflict (source_id) do update
        set n_chunks = c.n_chunks + excluded.n_chunks, total_len = c.total_len + excluded.total_len
    $q$, rel),
    format($q$
    with entries as (
        select n.agentdb_chunk_id as chunk_id, t.lexeme as term,
               coalesce(cardinality(t.positions), 1) as tf
        from %s n cross join lateral unnest(n.agentdb_tsv) as t
    ), lengths as (
        select chunk_id, sum(tf)::int as dl from entries group by chunk_id
    ), ins as (
        insert into agentdb.postings (source_id, term, chunk_id, tf, dl)
        select $1, e.term, e.chunk_id, e.tf, l.dl from entries e join lengths l using (chunk_id)
        returning term, tf, dl
    )
    insert into agentdb.term_stats as s (source_id, term, df, max_tf, min_dl)
    select $1, term, count(*), max(tf), min(dl) from ins group by term order by term
    on conflict (source_id, term) do update
        set df = s.df + excluded.df, max_tf = greatest(s.max_tf, excluded.max_tf),
            min_dl = least(s.min_dl, excluded.min_dl)
    $q$, rel)
];
$$;

create or replace function agentdb.lexical_after_insert() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    stmt text;
begin
    foreach stmt in array agentdb.lexical_add_sql('new_rows') loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    foreach stmt in array agentdb_internal.index_sync_sql(TG_ARGV[0]::int, 'insert') loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    return null;
end;
$$;

-- The statements that remove the postings and statistics of the rows of relation `rel`; $1 is the source id.
create or replace function agentdb.lexical_remove_sql(rel text) returns text[]
language sql immutable as $$
select array[
    format($q$
    update agentdb.corpus_stats c
    set n_chunks = c.n_chunks - o.n, total_len = c.total_len - o.len
    from (
        select count(*) as n,
               coalesce(sum((select sum(coalesce(cardinality(t.positions), 1)) from unnest(r.agentdb_tsv) t)), 0) as len
        from %s r
    ) o
    where c.source_id = $1
    $q$, rel),
    format($q$
    with gone as (
        delete from agentdb.postings p
        using %s o cross join lateral unnest(o.agentdb_tsv) as t
        where p.source_id = $1 and p.term = t.lexeme and p.chunk_id = o.agentdb_chunk_id
        returning p.term
    )
    update agentdb.term_stats s set df = s.df - g.n
    from (select term, count(*) as n from gone group by term order by term) g
    where s.source_id = $1 and s.term = g.term
    $q$, rel),
    'delete from agentdb.term_stats where source_id = $1 and df <= 0'
];
$$;

create or replace function agentdb.lexical_after_delete() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    stmt text;
begin
    foreach stmt in array agentdb.lexical_remove_sql('old_rows') loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    foreach stmt in array agentdb_internal.index_sync_sql(TG_ARGV[0]::int, 'delete') loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    return null;
end;
$$;

-- An update whose lexemes changed is a removal of the old version and an addition of the new one.
-- (Transition tables cannot be combined with UPDATE OF column lists, hence the comparison here.)
create or replace function agentdb.lexical_after_update() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    stmt text;
begin
    foreach stmt in array agentdb.lexical_remove_sql(
        '(select o.* from old_rows o join new_rows n using (agentdb_chunk_id)'
        ' where o.agentdb_tsv is distinct from n.agentdb_tsv)') loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    foreach stmt in array agentdb.lexical_add_sql(
        '(select n.* from new_rows n join old_rows o using (agentdb_chunk_id)'
        ' where o.agentdb_tsv is distinct from n.agentdb_tsv)') loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    foreach stmt in array agentdb_internal.index_sync_sql(TG_ARGV[0]::int, 'update') loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    return null;
end;
$$;

-- TRUNCATE of a source table empties its lexical index too.
create or replace function agentdb.lexical_truncate() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    src int := TG_ARGV[0]::int;
    stmt text;
begin
    update agentdb.corpus_stats set n_chunks = 0, total_len = 0 where source_id = src;
    delete from agentdb.postings where source_id = src;
    delete from agentdb.term_stats where source_id = src;
    foreach stmt in array agentdb_internal.index_sync_sql(src, 'truncate') loop
        execute stmt using src;
    end loop;
    return null;
end;
$$;

-- Recompute a source's whole lexical index from its table (registration of a table with rows, repair).
create or replace function agentdb.lexical_rebuild(source_name text) returns void
language plpgsql as $$
declare
    src agentdb.sources;
    stmt text;
begin
    select * into src from agentdb.sources where name = source_name for update;
    if not found then
        perform agentdb.raise_error(3010, 'StorageFileNotFound', format('unknown source %L', source_name), 'source');
    end if;
    delete from agentdb.corpus_stats where source_id = src.id;
    delete from agentdb.postings where source_id = src.id;
    delete from agentdb.term_stats where source_id = src.id;
    foreach stmt in array agentdb.lexical_add_sql(format('%I.%I', src.table_schema, src.table_name)) loop
        execute stmt using src.id;
    end loop;
    insert into agentdb.corpus_stats (source_id) values (src.id) on conflict do nothing;
end;
$$;

-- Compare a source's stored lexical index with one recomputed from its rows. Each row names a kind of
-- difference and how many entries differ; all zeros means the index matches the documents exactly.
create or replace function agentdb.lexical_check(source_name text)
returns table (what text, mismatches bigint)
language plpgsql as $$
declare
    src agentdb.sources;
    rel text;
begin
    select * into src from agentdb.sources where name = source_name;
    if not found then
        perform agentdb.raise_error(3010, 'StorageFileNotFound', format('unknown source %L', source_name), 'source');
    end if;
    rel := format('%I.%I', src.table_schema, src.table_name);
    return query execute format($q$
        with entries as (
            select n.agentdb_chunk_id as chunk_id, t.lexeme as term, coalesce(cardinality(t.positions), 1) as tf
            from %s n cross join lateral unnest(n.agentdb_tsv) as t
        ), expected as (
            select e.term, e.chunk_id, e.tf, sum(e.tf) over (partition by e.chunk_id)::int as dl from entries e
        ), actual as (
            select term, chunk_id, tf, dl from agentdb.postings where source_id = $1
        ), expected_df as (
            select term, count(*) as df, max(tf) as max_tf, min(dl) as min_dl from expected group by term
        ), actual_df as (
            select term, df, max_tf, min_dl from agentdb.term_stats where source_id = $1
        )
        select 'postings'::text, count(*) from (
            (select * from expected except all select * from actual)
            union all (select * from actual except all select * from expected)) d
        union all
        select 'term_stats', count(*) from (
            (select term, df from expected_df except all select term, df from actual_df)
            union all (select term, df from actual_df except all select term, df from expected_df)) d
        union all
        -- The pruning bounds may be loose after deletions, never tighter than the postings.
        select 'term_bounds', count(*) from expected_df e join actual_df a using (term)
        where a.max_tf < e.max_tf or a.min_dl > e.min_dl
        union all
        select 'corpus_stats', count(*) from (
            select count(*) as n, coalesce(sum(
                (select sum(coalesce(cardinality(t.positions), 1)) from unnest(n.agentdb_tsv) t)), 0) as len
            from %s n
            except select n_chunks, total_len from agentdb.corpus_stats where source_id = $1) d
    $q$, rel, rel) using src.id;
end;
$$;

-- Registered tables: a row whose searched text changes loses its embedding until it is recomputed.
create or replace function agentdb.clear_stale_embedding() returns trigger
language plpgsql as $$
begin
    new.agentdb_embedding := null;
    return new;
end;
$$;
