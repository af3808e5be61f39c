-- The lexical index. Every source table carries agentdb_chunk_id and agentdb_tsv; these statement-level
-- triggers (argument: the source id) keep agentdb.postings, term_stats and corpus_stats equal to the
-- rows in the same transaction, whoever writes the table (agentdb's ingestion or another program).

-- The trigger functions run with their owner's rights (SECURITY DEFINER): whoever may write a source
-- table (a principal's writer role, another program writing a registered table) keeps its index current
-- without any privilege on the index tables themselves. Trigger functions cannot be called directly.

-- The same triggers keep the field-derived edges of the source's hierarchy and graph indexes current
-- (agentdb_internal.index_sync_sql, sql/070_indexes.sql), after the lexical index, in the same transaction.

-- Two layouts (agentdb.sources.lexical_layout, migrations/0013_block_postings.sql): 'rows' keeps one row of
-- agentdb.postings per term and chunk; 'blocks' one row of agentdb.posting_blocks per term and block of up to
-- 128 chunks. A write adds its rows' postings as new blocks (each statement's postings of a term cut into
-- blocks of 128 in chunk order); a removal rewrites the blocks that held the removed chunks (exact bounds
-- again); agentdb.lexical_optimize merges a term's partly filled blocks. Readers go through
-- agentdb_internal.term_postings, which serves either layout; a principal's role reads blocks only through
-- agentdb_internal.principal_block_postings (one posting a row, of the chunks it may read).

-- Lock order: every writer of a source's statistics first locks its corpus_stats row, then term_stats rows.
-- Writers of one source thus queue on that row before holding any term, so concurrent transactions that
-- each delete and insert (a re-ingested batch) cannot deadlock on term_stats. An addition inserts its new
-- postings or blocks before it takes that lock (they hold only the chunk ids it adds, which no other writer
-- can add, remove or merge), so concurrent writers of one source overlap in all but adding their statistics
-- (agentdb_internal.lexical_apply); a removal rewrites existing blocks and does all of it under the lock.

-- A BM25 score as every lexical leg returns it: rounded to a grid of 1e-9 (the C cursor's round_score, in
-- ext/agentdb_accel.c, is the same). Chunks whose scores are mathematically equal then carry the same score
-- whatever order their terms were summed in, and rank by chunk id alike on every path. round(float8) is C's
-- rint, as in the cursor. Inlined (plain SQL).
create or replace function agentdb_internal.bm25_round(score float8) returns float8
language sql immutable parallel safe as $$ select round(score * 1e9) / 1e9 $$;

-- A posting block's offsets or lengths as int4, from whichever of their two columns holds them: the wide
-- int4[] or the narrow int2[] (migrations/0025_narrow_posting_blocks.sql). Inlined (plain SQL).
create or replace function agentdb_internal.block_ints(wide int4[], narrow int2[]) returns int4[]
language sql immutable parallel safe as $$ select coalesce(wide, narrow::int4[]) $$;

-- The statement that reads the postings of the terms $2 of source $1 from table `blocks` (agentdb.posting_blocks
-- or one of its shards), one a row: u.term, chunk_id, u.tf, u.dl, each block's arrays unnested in lockstep.
create or replace function agentdb_internal.block_postings_sql(blocks text) returns text
language sql immutable as $$
select format($q$
    select u.term, u.first_chunk + u.off as chunk_id, u.tf::int as tf, u.dl
    from (select b.term, b.first_chunk, unnest(agentdb_internal.block_ints(b.offs, b.narrow_offs)) as off,
                 unnest(b.tfs) as tf, unnest(agentdb_internal.block_ints(b.dls, b.narrow_dls)) as dl
          from %s b where b.source_id = $1 and b.term = any ($2)) u $q$, blocks)
$$;

-- The block postings of the named `terms` of source `source_id`, one a row (term, chunk_id, tf, dl), of the
-- chunks that the active principal may read (agentdb.principal_block_predicate, sql/050_principals.sql, says
-- which): nothing for anyone else, nor for a source outside its grant. SECURITY DEFINER: principals' roles
-- cannot read agentdb.posting_blocks. With `shard_anchor`, on a Citus worker: of the shard of a distributed
-- source that anchor key hashes to (agentdb_internal.shard_maxscore), its blocks and rows read directly. The
-- shards are found from the key and the catalog, never named by the caller.
create or replace function agentdb_internal.principal_block_postings(source_id int, terms text[],
                                                                     shard_anchor text default null)
returns table (term text, chunk_id bigint, tf int, dl int)
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
declare
    v record;
    blocks text := 'agentdb.posting_blocks';
    docs text;
begin
    select * into v from agentdb.principal_block_predicate(principal_block_postings.source_id);
    if v.pred is null then
        return;
    end if;
    if shard_anchor is not null then
        blocks := agentdb_internal.shard_of('agentdb.posting_blocks', shard_anchor);
        docs := agentdb_internal.shard_of(v.rel::regclass, shard_anchor);
        v.pred := replace(v.pred, v.rel, docs);
        v.rel := docs;
    end if;
    -- The source table keeps its name (no alias): the predicate refers to its columns as schema.table.column.
    return query execute agentdb_internal.block_postings_sql(blocks)
        || case when v.pred = 'true' then ''
                else format(' join %1$s on %1$s.agentdb_chunk_id = u.first_chunk + u.off where %2$s', v.rel, v.pred) end
        using principal_block_postings.source_id, terms;
end;
$$;

-- The block postings of the named `terms` of distributed source `source_id` in the shard of
-- agentdb.posting_blocks that anchor key `shard_anchor` hashes to, one a row (term, chunk_id, tf, dl), on the
-- worker holding it: for a principal's role those of the chunks it may read (principal_block_postings).
-- A coordinator reads a distributed source's block postings by term as `select
-- agentdb_internal.shard_block_postings(..., a.key) from agentdb.shard_anchors a`, each shard on its worker.
create or replace function agentdb_internal.shard_block_postings(source_id int, terms text[], shard_anchor text)
returns table (term text, chunk_id bigint, tf int, dl int)
language plpgsql stable as $$
begin
    if left(current_user, 10) = 'agentdb_p_' then
        return query select * from agentdb_internal.principal_block_postings(source_id, terms, shard_anchor);
    else
        return query execute agentdb_internal.block_postings_sql(
                agentdb_internal.shard_of('agentdb.posting_blocks', shard_anchor))
            using source_id, terms;
    end if;
end;
$$;

-- The postings of the named `terms` of source `source_id`, whichever its layout, each with its term's weight
-- from `weights` (in the order of `terms`; the BM25 callers pass each term's idf x (k1 + 1)): (term,
-- chunk_id, wk, tf, dl). Every reader of postings by term goes through it: the lexical leg's sums
-- (agentdb.retrieve, agentdb_internal.bm25_maxscore) and agentdb.score_keys. Each term is joined to its
-- weight once, and each block's postings take the weight of the block's term, not a join a posting at a time
-- (one join a block instead of one a posting). Inlined into the caller's statement (a plain SQL function), so
-- the caller's row security applies to the row postings. A principal's role sees no block
-- (migrations/0013_block_postings.sql) and reads its block postings through
-- agentdb_internal.principal_block_postings instead. Each of the two block branches is gated by the current
-- user's name, a one-time filter, so the other never runs (the application never calls the SECURITY DEFINER
-- function). A block's arrays are unnested in the select list, in lockstep (equal lengths), not
-- unnest(a, b, c) in FROM, which materialises each block's rows first.
create or replace function agentdb_internal.term_postings(source_id int, terms text[], weights float8[])
returns table (term text, chunk_id bigint, wk float8, tf int, dl int)
language sql stable as $$
select t.term, p.chunk_id, t.wk, p.tf, p.dl
from unnest($2, $3) as t(term, wk)
join agentdb.postings p on p.source_id = $1 and p.term = t.term
union all
select u.term, u.first_chunk + u.off, u.wk, u.tf::int, u.dl
from (select t.term, b.first_chunk, t.wk, unnest(agentdb_internal.block_ints(b.offs, b.narrow_offs)) as off,
             unnest(b.tfs) as tf, unnest(agentdb_internal.block_ints(b.dls, b.narrow_dls)) as dl
      from unnest($2, $3) as t(term, wk)
      join agentdb.posting_blocks b on b.source_id = $1 and b.term = t.term
      where left(current_user, 10) <> 'agentdb_p_') u
union all
select t.term, x.chunk_id, t.wk, x.tf, x.dl
from unnest($2, $3) as t(term, wk)
join agentdb_internal.principal_block_postings($1, $2) x on x.term = t.term
where left(current_user, 10) = 'agentdb_p_'
$$;

-- The statement text that turns relation `rel` of postings (term, chunk_id, tf, dl; at most one per term and
-- chunk), grouped by term and the expression `grp` over alias e ('' for none), into blocks of source $1
-- inserted into agentdb.posting_blocks, as a CTE list ending in `blocks` (term, first_chunk, last_chunk,
-- max_tf, min_dl, n): the caller adds its own final statement over `blocks`. Each group's postings are cut
-- into blocks of 128: in chunk order when `sorted` (a merge, a rebuild: blocks of narrow chunk ranges), else
-- in the order `rel` yields them (a write: its rows come in the order of their ids, so the same in practice,
-- without sorting, and hashing by term is cheaper than sorting). Nothing relies on that order but the width
-- of a block's chunk range (term_stats.max_span, which lookups read). A block's bounds and offsets unnest its
-- arrays in a select list, as term_postings does (in FROM each block's rows would be materialised first).
-- `keyed`: `rel` has a column shard_key too, the anchor key of each posting's shard (a distributed source's:
-- agentdb_internal.shard_anchor_keys), and a block holds the postings of one shard and carries its key.
create or replace function agentdb_internal.block_sql(rel text, grp text, sorted boolean, keyed boolean default false)
returns text
language sql immutable as $$
select format($q$
    per_term as (
        select e.term%4$s, array_agg(e.chunk_id %3$s) as ids, array_agg(e.tf::int2 %3$s) as tfs,
               array_agg(e.dl %3$s) as dls, count(*) as n
        from %1$s e group by e.term%4$s%2$s
    ), cut as (
        select p.term%5$s, p.ids[i * 128 + 1 : i * 128 + 128] as ids, p.tfs[i * 128 + 1 : i * 128 + 128] as tfs,
               p.dls[i * 128 + 1 : i * 128 + 128] as dls
        from per_term p cross join lateral generate_series(0, (p.n - 1) / 128) as i
    ), blocks as (
        insert into agentdb.posting_blocks (source_id, term, first_chunk, last_chunk, max_tf, min_dl, offs,
                                            narrow_offs, tfs, dls, narrow_dls, shard_key)
        select $1, c.term, m.lo, m.hi, m.max_tf, m.min_dl,
               case when m.hi - m.lo > 32767 then o.offs end, case when m.hi - m.lo <= 32767 then o.offs::int2[] end,
               c.tfs,
               case when m.max_dl > 32767 then c.dls end, case when m.max_dl <= 32767 then c.dls::int2[] end,
               %6$s
        from cut c cross join lateral (
            select min(u.id) as lo, max(u.id) as hi, max(u.tf) as max_tf, min(u.dl) as min_dl, max(u.dl) as max_dl
            from (select unnest(c.ids) as id, unnest(c.tfs) as tf, unnest(c.dls) as dl) u) m
        cross join lateral (select array_agg((u.id - m.lo)::int4) as offs from (select unnest(c.ids) as id) u) o
        returning term, first_chunk, last_chunk, max_tf, min_dl, cardinality(tfs) as n
    ) $q$, rel, case when grp = '' then '' else ', ' || grp end,
    case when sorted then 'order by e.chunk_id' else '' end,
    case when keyed then ', e.shard_key' else '' end, case when keyed then ', p.shard_key' else '' end,
    case when keyed then 'c.shard_key' else 'null' end)
$$;

-- The final select of agentdb.lexical_add_sql's statement: the rows of `rel` counted, their lengths summed from
-- the CTE lengths (chunk_id, dl; a chunk without lexemes may be left out), and the CTE term_delta (term, df,
-- max_tf, min_dl, max_span) folded into arrays: the fields of one agentdb_internal.lexical_delta, in order
-- (EXECUTE ... INTO a composite variable takes its fields as columns).
create or replace function agentdb_internal.lexical_delta_sql(rel text) returns text
language sql immutable as $$
select format($q$
    select (select count(*) from %s) as n, (select coalesce(sum(dl), 0) from lengths) as len,
           t.terms, t.dfs, t.max_tfs, t.min_dls, t.max_spans
    from (select array_agg(term order by term) as terms, array_agg(df::bigint order by term) as dfs,
                 array_agg(max_tf::int order by term) as max_tfs, array_agg(min_dl::int order by term) as min_dls,
                 array_agg(max_span::bigint order by term) as max_spans
          from term_delta) t $q$, rel)
$$;

-- The statement that adds the postings of the rows of relation `rel` (a transition table inside a trigger, or a
-- whole source table when rebuilding) to a source of layout `layout` and returns what they add to its
-- statistics, one agentdb_internal.lexical_delta, for agentdb_internal.lexical_apply. Returned as text because
-- only the trigger function itself can see its transition tables; $1 is the source id. It locks no shared row.
-- `sorted` cuts blocks in chunk order (agentdb_internal.block_sql): a rebuild's, because a table is not read
-- in chunk order (a row goes to whichever page has room for it), and one row out of place widens its block's
-- chunk range, hence its term's max_span and so the blocks every lookup of the term reads.
-- `doc_key` names the column of `rel` whose value each posting carries as its doc_id (a distributed source's
-- document id, the distribution column of its postings: agentdb_internal.lexical_write); null for none.
create or replace function agentdb.lexical_add_sql(rel text, layout text, sorted boolean default false,
                                                   doc_key text default null) returns text
language sql immutable as $$
select case when layout = 'rows' then format($q$
    with entries as (
        select n.agentdb_chunk_id as chunk_id, %3$s as doc_id, t.lexeme as term,
               coalesce(cardinality(t.positions), 1) as tf
        from %1$s n cross join lateral unnest(n.agentdb_tsv) as t
    ), lengths as (
        select chunk_id, sum(tf)::int as dl from entries group by chunk_id
    ), ins as (
        insert into agentdb.postings (source_id, term, chunk_id, tf, dl, doc_id)
        select $1, e.term, e.chunk_id, e.tf, l.dl, e.doc_id from entries e join lengths l using (chunk_id)
        returning term, tf, dl
    ), term_delta as (
        select term, count(*) as df, max(tf) as max_tf, min(dl) as min_dl, 0::bigint as max_span
        from ins group by term
    ) %2$s $q$, rel, agentdb_internal.lexical_delta_sql(rel), coalesce('n.' || quote_ident(doc_key), 'null::text'))
    else format($q$
    -- the rows' tsvectors read once (a virtual agentdb_tsv is parsed where it is read: agentdb_internal.lexeme_rows),
    -- each chunk's length once, for its postings and for the total
    -- (with `doc_key`, each chunk's shard, whose anchor key its postings' blocks carry)
    with batch as materialized (
        select n.agentdb_chunk_id as chunk_id, n.agentdb_tsv as tsv%4$s from %1$s n
    ), %5$slengths as (
        select r.chunk_id, (select sum(coalesce(cardinality(x.positions), 1)) from unnest(r.tsv) x)::int as dl
        from batch r
    ), postings as (
        select r.chunk_id, t.lexeme as term, coalesce(cardinality(t.positions), 1) as tf, l.dl%6$s
        from batch r join lengths l using (chunk_id)%7$s cross join lateral unnest(r.tsv) as t
    ), %2$s, term_delta as (
        select term, sum(n) as df, max(max_tf) as max_tf, min(min_dl) as min_dl, max(last_chunk - first_chunk) as max_span
        from blocks group by term
    ) %3$s $q$, rel, agentdb_internal.block_sql('postings', '', sorted, doc_key is not null),
    agentdb_internal.lexical_delta_sql(rel),
    case when doc_key is not null
         then format(', get_shard_id_for_distribution_column(''agentdb.postings'', n.%I) as shard', doc_key) end,
    case when doc_key is not null
         then 'anchors as materialized (select a.shard, a.key from agentdb_internal.shard_anchor_keys() a), ' end,
    case when doc_key is not null then ', a.key as shard_key' end,
    case when doc_key is not null then ' join anchors a on a.shard = r.shard' end)
    end
$$;

-- Whether the installed accelerator is one that reads and writes this schema's posting blocks: version 1.5 or
-- later (narrow blocks, migrations/0025_narrow_posting_blocks.sql). An older build (an external server's, built
-- by an older `agentdb accel build`) is left unused: the plain SQL path serves, and sql/025_accel.sql's
-- warning says why when its update fails.
create or replace function agentdb_internal.accel_current() returns boolean
language sql stable as $$
select coalesce((select string_to_array(x.extversion, '.')::int[] >= '{1,5}'
                 from pg_catalog.pg_extension x where x.extname = 'agentdb_accel'), false)
$$;

-- Whether this session's lexical writes to a source in the block layout take the accelerator's write path
-- through its function `fn` (ext/: agentdb_accel.tsv_blocks for a write, merged_blocks for a merge): the
-- extension offers it to the current user (the owner of the SECURITY DEFINER triggers) and
-- agentdb.lexical_path is not 'sql'. Else the plain SQL statements.
create or replace function agentdb_internal.lexical_write_accel(fn text default 'tsv_blocks') returns boolean
language sql stable as $$
select coalesce(current_setting('agentdb.lexical_path', true), '') <> 'sql'
       and agentdb_internal.accel_current()
       and coalesce((select has_function_privilege(x.oid, 'execute')
                     from pg_catalog.pg_proc x
                     where x.proname = fn and x.pronamespace = to_regnamespace('agentdb_accel')), false)
$$;

-- The insert of blocks the accelerator cut (ext/: tsv_blocks for a write, merged_blocks for a merge) into
-- source $1's posting_blocks: `from_list` names them as alias b, `cond` ('' for none) the condition on them; it
-- returns what agentdb_internal.block_sql's blocks return (term, first_chunk, last_chunk, max_tf, min_dl, n).
create or replace function agentdb_internal.cut_blocks_insert_sql(from_list text, cond text) returns text
language sql immutable as $$
select format($q$
        insert into agentdb.posting_blocks (source_id, term, first_chunk, last_chunk, max_tf, min_dl, offs,
                                            narrow_offs, tfs, dls, narrow_dls)
        select $1, b.term, b.first_chunk, b.last_chunk, b.max_tf, b.min_dl, b.offs, b.narrow_offs, b.tfs, b.dls,
               b.narrow_dls
        from %s %s
        returning term, first_chunk, last_chunk, max_tf, min_dl, cardinality(tfs) as n $q$, from_list, cond)
$$;

-- agentdb.lexical_add_sql's statement for the block layout on the accelerator's write path: the rows' ids and
-- tsvectors are gathered into two arrays, agentdb_accel.tsv_blocks cuts their blocks (each term's postings in
-- chunk order, 128 a block, with their bounds) and tsv_total_len sums their lengths; the blocks are inserted
-- and the delta is folded from them as on the SQL path. The same blocks as agentdb_internal.block_sql's when
-- the rows come in chunk order (a write of agentdb's ingestion; the SQL path cuts in the order they come), so
-- the same statistics. The arrays are one value each, which PostgreSQL bounds at 1 GB: the callers take this
-- path only for a statement whose tsvectors are well below it (agentdb_internal.lexical_add_stmt).
create or replace function agentdb_internal.lexical_add_accel_sql(rel text) returns text
language sql immutable as $$
select format($q$
    with batch as materialized (
        select array_agg(n.agentdb_chunk_id) as ids, array_agg(n.agentdb_tsv) as tsvs from %1$s n
    ), lengths as (
        select agentdb_accel.tsv_total_len(r.tsvs) as dl from batch r
    ), blocks as (%3$s
    ), term_delta as (
        select term, sum(n) as df, max(max_tf) as max_tf, min(min_dl) as min_dl, max(last_chunk - first_chunk) as max_span
        from blocks group by term
    ) %2$s $q$, rel, agentdb_internal.lexical_delta_sql(rel),
    agentdb_internal.cut_blocks_insert_sql('batch r cross join lateral agentdb_accel.tsv_blocks(r.ids, r.tsvs) b', ''))
$$;

-- The statement a lexical trigger runs to add the rows of `rel` (a transition table) to a source of layout
-- `layout`, whose delta it returns: the accelerator's (agentdb_internal.lexical_add_accel_sql) when the
-- source is in the block layout, the session takes that path and the rows' tsvectors, gathered into one
-- array, stay below the 1 GB of one value (`tsv_bytes`, agentdb_internal.tsv_bytes_sql's bound); else
-- agentdb.lexical_add_sql's.
create or replace function agentdb_internal.lexical_add_stmt(rel text, layout text, tsv_bytes bigint) returns text
language sql stable as $$
select case when layout = 'blocks' and tsv_bytes < 1073741824 and agentdb_internal.lexical_write_accel()
            then agentdb_internal.lexical_add_accel_sql(rel)
            else agentdb.lexical_add_sql(rel, layout) end
$$;

-- Add delta `d` (agentdb.lexical_add_sql's) to source `source_id`'s statistics: its corpus_stats row first
-- (the source's write lock, held to commit), then its terms' term_stats rows in term order.
create or replace function agentdb_internal.lexical_apply(source_id int, d agentdb_internal.lexical_delta)
returns void
language sql as $$
insert into agentdb.corpus_stats as c (source_id, n_chunks, total_len)
values (lexical_apply.source_id, d.n_chunks, d.total_len)
on conflict (source_id) do update
    set n_chunks = c.n_chunks + excluded.n_chunks, total_len = c.total_len + excluded.total_len;
insert into agentdb.term_stats as s (source_id, term, df, max_tf, min_dl, max_span)
select lexical_apply.source_id, u.term, u.df, u.max_tf, u.min_dl, u.max_span
from unnest(d.terms, d.dfs, d.max_tfs, d.min_dls, d.max_spans) as u(term, df, max_tf, min_dl, max_span)
order by u.term
on conflict (source_id, term) do update
    set df = s.df + excluded.df, max_tf = greatest(s.max_tf, excluded.max_tf),
        min_dl = least(s.min_dl, excluded.min_dl), max_span = greatest(s.max_span, excluded.max_span);
$$;

-- The lexical layout of source `source_id` for a write's triggers, read under a KEY SHARE lock on its
-- agentdb.sources row, held to commit: agentdb.lexical_set_layout (FOR UPDATE, then a rebuild from the rows
-- it sees) waits for the writers that read the old layout, and a writer that comes during a change waits for
-- it and reads the new one. Writers do not wait for each other (KEY SHARE locks do not conflict), nor for an
-- update of the source's other columns. (Read without the lock, a write during a change added its postings
-- in the old layout, which a block source's lookups do not read.)
create or replace function agentdb_internal.lexical_layout_for_write(source_id int) returns text
language sql volatile as $$
select s.lexical_layout from agentdb.sources s where s.id = $1 for key share
$$;

-- Source `source_id`'s agentdb_tsv when it is computed when read (a virtual column: agentdb/sources/ddl.py,
-- PostgreSQL 18 keeps it off disk): its generation expression and the columns the expression reads (its
-- dependencies); both null for a stored one. One catalog read for a lexical trigger's statements
-- (agentdb_internal.lexeme_rows, agentdb_internal.lexemes_changed_sql).
create or replace function agentdb_internal.lexemes_on_read(source_id int, out expr text, out inputs text[])
language sql stable as $$
select pg_get_expr(d.adbin, d.adrelid),
       array(select c.attname from pg_catalog.pg_depend p
             join pg_catalog.pg_attribute c on c.attrelid = a.attrelid and c.attnum = p.refobjsubid
             where p.classid = 'pg_catalog.pg_attrdef'::regclass and p.objid = d.oid and p.refobjid = a.attrelid
               and p.refobjsubid > 0 and p.refobjsubid <> a.attnum
             order by c.attnum)
from agentdb.sources s
join pg_catalog.pg_attribute a on a.attrelid = format('%I.%I', s.table_schema, s.table_name)::regclass
                              and a.attname = 'agentdb_tsv'
join pg_catalog.pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
where s.id = lexemes_on_read.source_id and a.attgenerated = 'v'
$$;

-- The rows of `rel` (a transition table, or a subquery of its rows with the table's columns) as the lexical
-- statements read them: agentdb_chunk_id and agentdb_tsv. A stored agentdb_tsv (a source made before
-- PostgreSQL 18 or distributed by Citus, a registered table, a memory store; `expr` null) is in the transition
-- table; a virtual one reads as null there, so its expression `expr` (agentdb_internal.lexemes_on_read's) is
-- computed over the rows here, once for each statement that reads them: the same lexemes as a read of the
-- table gives.
create or replace function agentdb_internal.lexeme_rows(expr text, rel text) returns text
language sql immutable as $$
select case when expr is null then rel else format('(select r.agentdb_chunk_id, %s as agentdb_tsv from %s r)', expr, rel) end
$$;

-- The condition under which an updated row (`o` its old version, `n` its new one) has other lexemes: its
-- stored agentdb_tsv differs; for a virtual one, one of the columns its expression reads (`inputs`,
-- agentdb_internal.lexemes_on_read's) differs, so that an update leaving the texts alone parses nothing.
create or replace function agentdb_internal.lexemes_changed_sql(inputs text[]) returns text
language sql immutable as $$
select coalesce((select string_agg(format('o.%1$I is distinct from n.%1$I', c), ' or ') from unnest(inputs) c),
                'o.agentdb_tsv is distinct from n.agentdb_tsv')
$$;

-- The statement that bounds the bytes of the tsvectors an addition gathers from transition table
-- `transition`, for agentdb_internal.lexical_add_stmt: stored (`expr` null), eight times their pg_column_size
-- (a stored tsvector is compressed at most about eightfold); computed when read (`expr`, a document source's
-- expression over its title and text), four times the text's bytes (a lexeme costs its bytes, a 4-byte entry
-- and 2 bytes a position: under three times its word's bytes with the space after it), without parsing the
-- rows twice.
create or replace function agentdb_internal.tsv_bytes_sql(expr text, transition text) returns text
language sql immutable as $$
select case when expr is null
            then format('select 8 * coalesce(sum(pg_column_size(n.agentdb_tsv)), 0) from %s n', transition)
            else format('select 4 * coalesce(sum(octet_length(n.title) + octet_length(n.text)), 0) from %s n',
                        transition) end
$$;

create or replace function agentdb.lexical_after_insert() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    stmt text;
    delta agentdb_internal.lexical_delta;
    tsv_bytes bigint;
    expr text := (agentdb_internal.lexemes_on_read(TG_ARGV[0]::int)).expr;
begin
    execute agentdb_internal.tsv_bytes_sql(expr, 'new_rows') into tsv_bytes;
    execute agentdb_internal.lexical_add_stmt(agentdb_internal.lexeme_rows(expr, 'new_rows'),
                                              agentdb_internal.lexical_layout_for_write(TG_ARGV[0]::int),
                                              tsv_bytes)
        into delta using TG_ARGV[0]::int;
    perform agentdb_internal.lexical_apply(TG_ARGV[0]::int, delta);
    foreach stmt in array agentdb_internal.index_sync_sql(TG_ARGV[0]::int, 'insert') loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    return null;
end;
$$;

-- The CTE of agentdb.lexical_remove_sql's postings statement that takes the removed postings' tfs (CTE `gone`'s
-- column tf) off source $1's total length.
create or replace function agentdb_internal.removed_length_sql(gone text) returns text
language sql immutable as $$
select format($q$removed_length as (
        update agentdb.corpus_stats c set total_len = c.total_len - (select coalesce(sum(g.tf), 0) from %s g)
        where c.source_id = $1
    )$q$, gone)
$$;

-- The CTE list that removes the postings of the rows of relation `rel` from source $1's blocks, ending in
-- `blocks`: `gone` (chunk_id, term, tf) the removed postings, `ranges` (term, shard_key, lo, hi, n) their chunk
-- ranges and counts by term, the blocks that held a removed chunk deleted (`hit`) and cut again without it
-- (their bounds recomputed; an emptied block goes). With `doc_key` (as in agentdb.lexical_add_sql) the source is
-- distributed: a removed chunk's blocks are those of its shard, by its anchor key, and each block is cut again
-- on its shard.
create or replace function agentdb_internal.block_removal_sql(rel text, doc_key text default null) returns text
language sql immutable as $$
select format($q$
    gone as materialized (
        select o.agentdb_chunk_id as chunk_id, t.lexeme as term, coalesce(cardinality(t.positions), 1) as tf%2$s
        from %1$s o cross join lateral unnest(o.agentdb_tsv) as t
    ), %3$sranges as (
        select g.term, %4$s as shard_key, min(g.chunk_id) as lo, max(g.chunk_id) as hi, count(*) as n
        from gone g%5$s group by 1, 2
    ), hit as (
        delete from agentdb.posting_blocks b using ranges r
        where b.source_id = $1 and b.term = r.term and b.first_chunk <= r.hi and b.last_chunk >= r.lo%6$s
        returning b.term, b.shard_key, b.first_chunk, b.offs, b.narrow_offs, b.tfs, b.dls, b.narrow_dls
    ), kept as (
        select u.term, u.shard_key, u.first_chunk + u.off as chunk_id, u.tf::int as tf, u.dl, u.first_chunk as old_first
        from (select h.term, h.shard_key, h.first_chunk, unnest(agentdb_internal.block_ints(h.offs, h.narrow_offs)) as off,
                     unnest(h.tfs) as tf, unnest(agentdb_internal.block_ints(h.dls, h.narrow_dls)) as dl
              from hit h) u
        where not exists (select 1 from gone g where g.term = u.term and g.chunk_id = u.first_chunk + u.off)
    ), %7$s $q$, rel,
    case when doc_key is not null
         then format(', get_shard_id_for_distribution_column(''agentdb.postings'', o.%I) as shard', doc_key) end,
    case when doc_key is not null
         then 'anchors as materialized (select a.shard, a.key from agentdb_internal.shard_anchor_keys() a), ' end,
    case when doc_key is not null then 'a.key' else 'null::text' end,
    case when doc_key is not null then ' join anchors a using (shard)' end,
    case when doc_key is not null then ' and b.shard_key = r.shard_key' end,
    agentdb_internal.block_sql('kept', 'e.old_first', false, doc_key is not null))
$$;

-- The statements that remove the postings and statistics of the rows of relation `rel` from a source of
-- layout `layout`; $1 is the source id. Blocks that held a removed chunk are rewritten without it
-- (agentdb_internal.block_removal_sql); the term bounds stay (still valid, maybe loose). With `doc_key`
-- (as in agentdb.lexical_add_sql) a posting is matched by its document too: on a distributed source that is
-- the join of co-located shards. The rows' tsvectors are read once (a virtual agentdb_tsv is parsed where it
-- is read: agentdb_internal.lexeme_rows): the first statement counts the rows, which reads none, and takes the
-- corpus_stats row, the source's write lock, before any other; the second takes the rows' lengths off as the
-- sum of the removed postings' tfs (a chunk's length is the sum of its terms' frequencies).
create or replace function agentdb.lexical_remove_sql(rel text, layout text, doc_key text default null)
returns text[]
language sql immutable as $$
select array[
    format($q$
    update agentdb.corpus_stats c set n_chunks = c.n_chunks - (select count(*) from %s r) where c.source_id = $1
    $q$, rel),
    case when layout = 'rows' then format($q$
    with gone as (
        delete from agentdb.postings p
        using %1$s o cross join lateral unnest(o.agentdb_tsv) as t
        where p.source_id = $1 and p.term = t.lexeme and p.chunk_id = o.agentdb_chunk_id%2$s
        returning p.term, p.tf
    ), %3$s
    update agentdb.term_stats s set df = s.df - g.n
    from (select term, count(*) as n from gone group by term order by term) g
    where s.source_id = $1 and s.term = g.term
    $q$, rel, ' and p.doc_id = o.' || quote_ident(doc_key), agentdb_internal.removed_length_sql('gone'))
    else format($q$
    with %s, %s
    update agentdb.term_stats s set df = s.df - r.n
    from (select term, sum(n) as n from ranges group by term order by term) r
    where s.source_id = $1 and s.term = r.term
    $q$, agentdb_internal.block_removal_sql(rel, doc_key), agentdb_internal.removed_length_sql('gone'))
    end,
    'delete from agentdb.term_stats where source_id = $1 and df <= 0'
];
$$;

create or replace function agentdb.lexical_after_delete() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
    stmt text;
begin
    foreach stmt in array agentdb.lexical_remove_sql(
        agentdb_internal.lexeme_rows((agentdb_internal.lexemes_on_read(TG_ARGV[0]::int)).expr, 'old_rows'),
        agentdb_internal.lexical_layout_for_write(TG_ARGV[0]::int)) loop
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
    layout text := agentdb_internal.lexical_layout_for_write(TG_ARGV[0]::int);
    expr text;
    changed text;
    delta agentdb_internal.lexical_delta;
    tsv_bytes bigint;
begin
    select l.expr, agentdb_internal.lexemes_changed_sql(l.inputs) into expr, changed
    from agentdb_internal.lexemes_on_read(TG_ARGV[0]::int) l;
    foreach stmt in array agentdb.lexical_remove_sql(agentdb_internal.lexeme_rows(expr, format(
        '(select o.* from old_rows o join new_rows n using (agentdb_chunk_id) where %s)', changed)), layout) loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    execute agentdb_internal.tsv_bytes_sql(expr, 'new_rows') into tsv_bytes;
    execute agentdb_internal.lexical_add_stmt(agentdb_internal.lexeme_rows(expr, format(
        '(select n.* from new_rows n join old_rows o using (agentdb_chunk_id) where %s)', changed)),
        layout, tsv_bytes) into delta using TG_ARGV[0]::int;
    perform agentdb_internal.lexical_apply(TG_ARGV[0]::int, delta);
    foreach stmt in array agentdb_internal.index_sync_sql(TG_ARGV[0]::int, 'update') loop
        execute stmt using TG_ARGV[0]::int;
    end loop;
    return null;
end;
$$;

-- The column of a distributed source's rows whose value its postings carry in their distribution column
-- (agentdb.postings.doc_id): the document id, or `agentdb_tenant` for a source distributed by its tenant field
-- (agentdb/db/distribute.py), so that a chunk's postings live on its shard. Null for a source on one node.
create or replace function agentdb_internal.route_column(src agentdb.sources) returns text
language sql immutable as $$
select case when not src.distributed then null
            when src.tenant_field is not null then 'agentdb_tenant' else 'doc_id' end
$$;

-- The lexical triggers' work, done by the writer of a source whose table cannot have triggers (a table
-- distributed by Citus: agentdb/db/distribute.py): op 'add' after the writer inserted the chunks of documents
-- `doc_ids`, 'remove' before it deletes them. The same statements as the triggers (agentdb.lexical_add_sql,
-- agentdb.lexical_remove_sql, agentdb_internal.lexical_apply), over those documents' rows instead of a
-- transition table, in the writer's transaction: the statistics (agentdb.term_stats, agentdb.corpus_stats, one
-- copy for the whole source) change with the rows, all or nothing (across the nodes, a two-phase commit), and
-- so do the field-derived edges of the source's indexes (agentdb_internal.index_write, the triggers' last step).
create or replace function agentdb_internal.lexical_write(source_id int, op text, doc_ids text[]) returns void
language plpgsql as $$
declare
    src agentdb.sources;
    rel text;
    layout text := agentdb_internal.lexical_layout_for_write(lexical_write.source_id);
    stmt text;
    delta agentdb_internal.lexical_delta;
    removed_chunks bigint;
    removed_len bigint;
    removed_terms text[];
    removed_dfs int[];
begin
    select * into strict src from agentdb.sources s where s.id = lexical_write.source_id;
    rel := format('(select * from %I.%I r where r.doc_id = any ($2))', src.table_schema, src.table_name);
    if op = 'remove' and src.distributed then
        -- Citus refuses a statement that reads a distributed table and writes a reference table when the
        -- read goes to one shard (all of doc_ids hash there). So the removed chunks' count and length are
        -- read first and their postings deleted on their shards (in the block layout, the blocks that held them
        -- cut again there), each statement touching one kind of table; then the statistics lose those values,
        -- as lexical_remove_sql's statements take them off.
        execute format($q$
            select count(*), coalesce(sum((select sum(coalesce(cardinality(t.positions), 1))
                                           from unnest(r.agentdb_tsv) t)), 0)
            from %s r$q$, rel) into removed_chunks, removed_len using src.id, doc_ids;
        execute case when layout = 'rows' then format($q$
            with gone as (
                delete from agentdb.postings p
                using %s o cross join lateral unnest(o.agentdb_tsv) as t
                where p.source_id = $1 and p.term = t.lexeme and p.chunk_id = o.agentdb_chunk_id
                  and p.doc_id = o.%I
                returning p.term
            )
            select coalesce(array_agg(term order by term), '{}'), coalesce(array_agg(n order by term), '{}')
            from (select term, count(*)::int as n from gone group by term) g$q$, rel, agentdb_internal.route_column(src))
            else format($q$
            with %s
            select coalesce(array_agg(term order by term), '{}'), coalesce(array_agg(n order by term), '{}')
            from (select term, sum(n)::int as n from ranges group by term) g$q$,
            agentdb_internal.block_removal_sql(rel, agentdb_internal.route_column(src))) end
            into removed_terms, removed_dfs using src.id, doc_ids;
        update agentdb.corpus_stats c set n_chunks = c.n_chunks - removed_chunks, total_len = c.total_len - removed_len
        where c.source_id = src.id;
        update agentdb.term_stats s set df = s.df - g.n
        from unnest(removed_terms, removed_dfs) g(term, n)
        where s.source_id = src.id and s.term = g.term;
        delete from agentdb.term_stats s where s.source_id = src.id and s.df <= 0;
    elsif op = 'remove' then
        foreach stmt in array agentdb.lexical_remove_sql(rel, layout, agentdb_internal.route_column(src)) loop
            execute stmt using src.id, doc_ids;
        end loop;
    else
        execute agentdb.lexical_add_sql(rel, layout, false, agentdb_internal.route_column(src))
            into delta using src.id, doc_ids;
        perform agentdb_internal.lexical_apply(src.id, delta);
    end if;
    -- As the triggers do after their own statements (the corpus_stats row, the write lock, is held by now).
    perform agentdb_internal.index_write(src.id, op, doc_ids);
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
    delete from agentdb.posting_blocks where source_id = src;
    delete from agentdb.term_stats where source_id = src;
    foreach stmt in array agentdb_internal.index_sync_sql(src, 'truncate') loop
        execute stmt using src;
    end loop;
    return null;
end;
$$;

-- Recompute a source's whole lexical index from its table (registration of a table with rows, repair), its
-- blocks cut in chunk order as a merge cuts them. The old postings stay behind as dead versions, and the
-- statistics the planner has are of before: agentdb.sources.rebuild_lexical vacuums and analyzes afterwards.
create or replace function agentdb.lexical_rebuild(source_name text) returns void
language plpgsql as $$
declare
    src agentdb.sources;
    delta agentdb_internal.lexical_delta;
begin
    select * into src from agentdb.sources where name = source_name for update;
    if not found then
        perform agentdb.raise_unknown_source(source_name);
    end if;
    delete from agentdb.corpus_stats where source_id = src.id;
    delete from agentdb.postings where source_id = src.id;
    delete from agentdb.posting_blocks where source_id = src.id;
    delete from agentdb.term_stats where source_id = src.id;
    execute agentdb.lexical_add_sql(format('%I.%I', src.table_schema, src.table_name), src.lexical_layout, true,
                                    agentdb_internal.route_column(src))
        into delta using src.id;
    perform agentdb_internal.lexical_apply(src.id, delta);
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
    keyed boolean;
begin
    select * into src from agentdb.sources where name = source_name;
    if not found then
        perform agentdb.raise_unknown_source(source_name);
    end if;
    rel := format('%I.%I', src.table_schema, src.table_name);
    -- A distributed source's block postings are checked with the block's shard key too: each chunk's postings
    -- must lie in a block that carries the anchor key of the chunk's shard (removals find them by it).
    keyed := src.distributed and src.lexical_layout = 'blocks';
    return query execute format($q$
        with entries as (
            select n.agentdb_chunk_id as chunk_id, t.lexeme as term, coalesce(cardinality(t.positions), 1) as tf,
                   %2$s as shard
            from %1$s n cross join lateral unnest(n.agentdb_tsv) as t
        ), anchors as materialized (%3$s
        ), expected as (
            select e.term, e.chunk_id, e.tf, sum(e.tf) over (partition by e.chunk_id)::int as dl, a.key as anchor
            from entries e left join anchors a on a.shard = e.shard
        ), actual as (
            select term, chunk_id, tf, dl, null::text as anchor from agentdb.postings where source_id = $1
            union all
            select u.term, u.first_chunk + u.off, u.tf, u.dl, u.shard_key
            from (select b.term, b.first_chunk, b.shard_key,
                         unnest(agentdb_internal.block_ints(b.offs, b.narrow_offs)) as off,
                         unnest(b.tfs) as tf, unnest(agentdb_internal.block_ints(b.dls, b.narrow_dls)) as dl
                  from agentdb.posting_blocks b where b.source_id = $1) u
        ), block_contents as (
            select b.term, b.first_chunk, b.last_chunk, b.max_tf, b.min_dl, x.offs, b.tfs, x.dls,
                   (select min(o) from unnest(x.offs) o) as min_off, (select max(o) from unnest(x.offs) o) as max_off,
                   (select max(t) from unnest(b.tfs) t) as top_tf, (select min(d) from unnest(x.dls) d) as low_dl
            from agentdb.posting_blocks b
            cross join lateral (select agentdb_internal.block_ints(b.offs, b.narrow_offs) as offs,
                                       agentdb_internal.block_ints(b.dls, b.narrow_dls) as dls) x
            where b.source_id = $1
        ), expected_df as (
            select term, count(*) as df, max(tf) as max_tf, min(dl) as min_dl from expected group by term
        ), actual_df as (
            select term, df, max_tf, min_dl from agentdb.term_stats where source_id = $1
        )
        select 'postings'::text, (select count(*) from (
            (select * from expected except all select * from actual)
            union all (select * from actual except all select * from expected)) d)
            -- Blocks must be well formed (offsets from 0 to the chunk range's end, arrays of one length) and a
            -- source's postings kept in its own layout only.
            + (select count(*) from block_contents b
               where b.min_off is distinct from 0 or b.first_chunk + b.max_off <> b.last_chunk
                  or cardinality(b.offs) <> cardinality(b.tfs) or cardinality(b.offs) <> cardinality(b.dls))
            + case when $2 = 'rows' then (select count(*) from block_contents)
                   else (select count(*) from agentdb.postings where source_id = $1) end
        union all
        select 'term_stats', count(*) from (
            (select term, df from expected_df except all select term, df from actual_df)
            union all (select term, df from actual_df except all select term, df from expected_df)) d
        union all
        -- The pruning bounds may be loose after deletions, never tighter than the postings; nor may a block's
        -- bounds be, nor its span exceed its term's max_span (lookups would miss the block).
        select 'term_bounds', (select count(*) from expected_df e join actual_df a using (term)
                               where a.max_tf < e.max_tf or a.min_dl > e.min_dl)
            + (select count(*) from block_contents b join agentdb.term_stats ts on ts.source_id = $1 and ts.term = b.term
               where b.max_tf < b.top_tf or b.min_dl > b.low_dl or b.last_chunk - b.first_chunk > ts.max_span)
        union all
        -- A chunk's length is the sum of its terms' frequencies: the rows are counted without reading their
        -- tsvectors again (a virtual agentdb_tsv is parsed where it is read).
        select 'corpus_stats', count(*) from (
            select (select count(*) from %1$s n) as n, (select coalesce(sum(e.tf), 0) from expected e) as len
            except select n_chunks, total_len from agentdb.corpus_stats where source_id = $1) d
    $q$, rel,
    case when keyed then format('get_shard_id_for_distribution_column(''agentdb.postings'', n.%I)',
                                agentdb_internal.route_column(src))
         else 'null::bigint' end,
    case when keyed then 'select a.shard, a.key from agentdb_internal.shard_anchor_keys() a'
         else 'select null::bigint as shard, null::text as key where false' end) using src.id, src.lexical_layout;
end;
$$;

-- Terms that cut source `source_id`'s vocabulary, in term order, into at most `slices` ranges of about equal
-- postings (term_stats.df): the first term of every range but the first. A term is never split, so a term
-- holding more than its share makes a range of its own (or fewer ranges).
create or replace function agentdb_internal.lexical_slice_bounds(source_id int, slices int) returns text[]
language sql stable as $$
select coalesce(array_agg(s.first_term order by s.first_term), '{}')
from (
    select min(t.term) as first_term
    from (select ts.term, floor((sum(ts.df) over (order by ts.term) - ts.df) * greatest(slices, 1)
                                / greatest(sum(ts.df) over (), 1)) as slice
          from agentdb.term_stats ts where ts.source_id = $1) t
    group by t.slice
) s
where s.first_term > (select min(ts.term) from agentdb.term_stats ts where ts.source_id = $1)
$$;

-- Merge the partly filled blocks of source `source_name` (layout 'blocks') whose terms lie in [term_from,
-- term_to) (a null bound: no bound) and, when `terms` is given, are among them (a small write's terms: the
-- ingestion merges them after it, agentdb.sources.merge.merge_written_terms): every term held in more than 5/4 of the blocks its postings need
-- (ceil(df / 128)) gets its postings cut again into full blocks in chunk order, and its bounds (max_tf,
-- min_dl, max_span) recomputed exactly. A term with fewer extra blocks is left as it is: a merge rewrites all
-- of a term's postings, and a bulk load leaves a partly filled block per term and batch, a few percent more
-- blocks for a frequent term (about 10 full blocks a batch) but several times too many for a rare one, and
-- only those terms' blocks are worth rewriting. Returns the number of the range's blocks before and after.
-- Nothing to do for the 'rows' layout. Runs under a share lock on the source's corpus_stats row: writers,
-- which update it, wait, and merges of disjoint term ranges run at once (two of overlapping ranges at once
-- may fail with a deadlock, nothing half-written; agentdb's callers merge disjoint ranges, one optimize of a
-- source at a time). A merge after a bulk load still rewrites many blocks (the rare terms' blocks), so
-- agentdb's callers merge term ranges (agentdb_internal.lexical_slice_bounds) in transactions of their own
-- with a plain VACUUM after each: later ranges' new blocks then take the space the ranges before them freed,
-- instead of growing the table's file by the whole rewritten index.
create or replace function agentdb.lexical_optimize(source_name text, term_from text default null,
                                                    term_to text default null, terms text[] default null,
                                                    out blocks_before bigint, out blocks_after bigint)
language plpgsql as $$
declare
    src agentdb.sources;
    range_sql text := concat(' and b.term >= ' || quote_literal(term_from), ' and b.term < ' || quote_literal(term_to),
                             case when terms is not null then ' and b.term = any ($2)' end);
    -- A distributed source's blocks live on the workers: the accelerator, on the coordinator, reads none of them.
    accel boolean;
    terms_cut text[];
    max_tfs int[];
    min_dls int[];
    max_spans bigint[];
begin
    select * into src from agentdb.sources where name = source_name;
    if not found then
        perform agentdb.raise_unknown_source(source_name);
    end if;
    accel := agentdb_internal.lexical_write_accel('merged_blocks') and not src.distributed;
    perform 1 from agentdb.corpus_stats c where c.source_id = src.id for share;
    execute 'select count(*) from agentdb.posting_blocks b where b.source_id = $1' || range_sql
        into blocks_before using src.id, terms;
    -- The terms whose blocks number a quarter more than their postings need are cut again: by the
    -- accelerator's agentdb_accel.merged_blocks from the blocks as they stand (the statement's snapshot, which
    -- its delete does not change), or in SQL from the deleted blocks' postings, a row each
    -- (agentdb_internal.block_sql). The same blocks either way. The insert waits for the whole delete (the
    -- count of `hit`, evaluated before its first row): a term's new first block keeps its old key. On a
    -- distributed source a block holds one shard's chunks: the postings a term needs are counted shard by
    -- shard, and a term is cut again on every shard (its bounds are then exact, from all of its blocks). The
    -- terms' new bounds go to term_stats in a statement of their own (Citus writes no reference table in a
    -- statement that wrote the distributed blocks).
    execute format($q$
        with terms as (
            select x.term
            from (select b.term, count(*) as n, ceil(sum(cardinality(b.tfs)) / 128.0) as need
                  from agentdb.posting_blocks b where b.source_id = $1 %s
                  group by b.term, b.shard_key) x
            group by x.term having sum(x.n) * 4 > sum(x.need) * 5
        ), hit as (
            delete from agentdb.posting_blocks b using terms t where b.source_id = $1 and b.term = t.term
            returning %s
        ), %s
        select coalesce(array_agg(n.term order by n.term), '{}'), coalesce(array_agg(n.max_tf order by n.term), '{}'),
               coalesce(array_agg(n.min_dl order by n.term), '{}'), coalesce(array_agg(n.max_span order by n.term), '{}')
        from (select term, max(max_tf) as max_tf, min(min_dl) as min_dl, max(last_chunk - first_chunk) as max_span
              from blocks group by term) n $q$, range_sql,
        -- the SQL cut reads the deleted blocks' arrays; merged_blocks reads the blocks itself
        case when accel then 'b.term'
             else 'b.term, b.shard_key, b.first_chunk, b.offs, b.narrow_offs, b.tfs, b.dls, b.narrow_dls' end,
        case when accel then format('blocks as (%s) ', agentdb_internal.cut_blocks_insert_sql(
            'agentdb_accel.merged_blocks($1, (select array_agg(t.term order by t.term) from terms t)) b',
            'where (select count(*) from hit) > 0'))
        else $c$
        kept as (
            select u.term, u.shard_key, u.first_chunk + u.off as chunk_id, u.tf::int as tf, u.dl
            from (select h.term, h.shard_key, h.first_chunk, unnest(agentdb_internal.block_ints(h.offs, h.narrow_offs)) as off,
                         unnest(h.tfs) as tf, unnest(agentdb_internal.block_ints(h.dls, h.narrow_dls)) as dl
                  from hit h) u
        ), $c$ || agentdb_internal.block_sql('kept', '', true, src.distributed) end)
        into terms_cut, max_tfs, min_dls, max_spans using src.id, terms;
    update agentdb.term_stats s set max_tf = n.max_tf, min_dl = n.min_dl, max_span = n.max_span
    from unnest(terms_cut, max_tfs, min_dls, max_spans) as n(term, max_tf, min_dl, max_span)
    where s.source_id = src.id and s.term = n.term;
    execute 'select count(*) from agentdb.posting_blocks b where b.source_id = $1' || range_sql
        into blocks_after using src.id, terms;
end;
$$;

-- Move source `source_name`'s lexical index to layout `layout` ('rows' or 'blocks'): rebuilt from its rows in
-- the new layout, in the caller's transaction. A source read by principals moves to blocks only while its table
-- has no row security policies but agentdb's principal policies: principals read blocks through
-- agentdb_internal.principal_block_postings, which applies those alone.
create or replace function agentdb.lexical_set_layout(source_name text, layout text) returns void
language plpgsql as $$
declare
    src agentdb.sources;
    foreign_policies text[];
begin
    select * into src from agentdb.sources where name = source_name for update;
    if not found then
        perform agentdb.raise_unknown_source(source_name);
    end if;
    if layout is null or layout not in ('rows', 'blocks') then
        perform agentdb.invalid_param(
            format('lexical layout must be ''rows'' or ''blocks'', not %L', layout), 'layout');
    end if;
    -- On a Citus coordinator blocks are distributed by shard (agentdb/db/distribute.py): only the chunks of a
    -- source whose table is distributed by shard have one (a memory store's records are a reference table, a
    -- copy on every node). (Nested: pg_dist_partition exists only where Citus does.)
    if layout = 'blocks' and agentdb_internal.on_citus() then
        if not exists (select 1 from pg_dist_partition d
                       where d.logicalrelid = format('%I.%I', src.table_schema, src.table_name)::regclass
                         and d.partmethod = 'h') then
            perform agentdb.invalid_param(
                format('source %L is not distributed by shard, and on a coordinator only sources distributed by'
                       ' shard keep block postings', src.name), 'layout', 'keep the ''rows'' layout');
        end if;
    end if;
    if layout = 'blocks'
       and (exists (select 1 from agentdb.principals p where src.name = any (p.tables))
            or exists (select 1 from agentdb.memory_stores m where m.source_id = src.id and m.owner is not null)) then
        foreign_policies := agentdb.principal_foreign_policies(format('%I.%I', src.table_schema, src.table_name)::regclass);
        if cardinality(foreign_policies) > 0 then
            perform agentdb.invalid_param(
                format('source %L is read by principals and its table has row security policies that are not'
                       ' agentdb''s (%s), which principals'' block reads cannot apply', src.name,
                       array_to_string(foreign_policies, ', ')),
                'layout', 'drop those policies first, or keep the ''rows'' layout, whose postings follow every policy');
        end if;
    end if;
    if layout = src.lexical_layout then
        return;
    end if;
    update agentdb.sources set lexical_layout = layout where id = src.id;
    perform agentdb.lexical_rebuild(source_name);
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
