-- Principals in the database: each one has its own NOLOGIN role with only the grants its reads need and
-- row-level security policies compiled from its row filter, so that a read agentdb runs under that role
-- (agentdb.auth.principal_scope: SET LOCAL ROLE) cannot see a row, a field or a posting outside its grant,
-- even if the request handling forgot the filter or the projection. The table owner (the application
-- itself, ingestion) bypasses RLS as usual.
--
-- What a principal role may read:
--   * USAGE on the schemas agentdb and agentdb_docs (and that of any registered table it may read), and on
--     agentdb_internal with EXECUTE on its functions, which agentdb's reads call under the role;
--   * on each of its source tables, under a policy `for select to <role> using (<row filter>)`, SELECT on
--     only the columns of its field grant (column privileges): the row key, the chunk position, the
--     embedding, `title` and `text` when granted; of a document table's `metadata` either the whole column
--     (no field grant) or a virtual generated column agentdb_meta_<md5 of the keys> holding just the granted
--     keys (stored on a source distributed by Citus); of a registered table the columns of the granted
--     fields and, with "text", the text columns.
--     agentdb.source_relation(src) gives the reads agentdb makes (retrieve, expand, similar, the document
--     fetch) the relation with the table's usual column names in which what the role may not read is null;
--     Never agentdb_tsv, nor any column of a registered table that is not a granted field, text or key;
--   * SELECT on agentdb.postings, limited by a restrictive policy to the postings of chunks it may read
--     (an exists over agentdb.principal_chunks_<id>, which reads its tables under its own row security).
--     These are the bags of words of its rows, even without "text" in its grant: lexical search needs
--     them, and its results would tell as much;
--   * of a source kept in blocks (agentdb.posting_blocks, whose rows hold postings of up to 128 chunks, some
--     of which it may not read) no block at all (a restrictive policy, migrations/0013): the postings of
--     the chunks it may read come one a row from agentdb_internal.principal_block_postings, and the C
--     cursor's best chunks it may read from agentdb_internal.principal_bm25_topk (both SECURITY DEFINER),
--     which apply the predicate of its policy on the source table (agentdb.principal_block_predicate, from
--     principal_policy_sql, the same compiler). That is the only row security they can apply, so a block source whose table has other
--     policies (agentdb.principal_foreign_policies) is not granted, a source read by principals with such
--     policies does not move to blocks, and a policy added later makes the principal's lexical reads of the
--     source fail (9002) rather than show more than its rows;
--   * SELECT on agentdb.sources (every source's name and field schema) and agentdb.corpus_stats;
--     agentdb.term_stats only through agentdb.principal_term_stats (the named terms of a source it may
--     read, never the vocabulary);
--   * EXECUTE on its own params and chunks functions; nothing on agentdb.principals or principal_grants.
--
-- Global BM25 statistics (N = corpus_stats.n_chunks, df = term_stats.df, avgdl) stay shared across
-- principals, as in Elasticsearch document-level security: a score then means the same thing whoever asks
-- and the statistics need no per-principal copy that every write would have to maintain. The price is a
-- weak aggregate side channel: the document frequency over all rows of a term the caller names can be
-- learnt (from scores, or from principal_term_stats), as can each source's chunk count and total length.
-- Hits, texts, fields, postings and every count in the diagnostics come from rows read under the role,
-- so they never include a row outside the filter.
--
-- Nothing here refers to a source table from another object that would depend on it (a view, a policy on
-- another table): `drop table` of a source must keep working. Column privileges, the projection column
-- and the policy belong to the table itself; the chunks function refers to it only in its body text and is
-- rewritten when a source is released.

-- The role of principal `principal_id` in this database. Roles are shared by the whole cluster while
-- principals belong to one database, so the database oid keeps two agentdb databases apart.
create or replace function agentdb.principal_role(principal_id int) returns name
language sql stable as $$
select format('agentdb_p_%s_%s', (select oid from pg_database where datname = current_database()), principal_id)::name
$$;

-- The name of principal `principal_id`'s policies (one per table, so one name serves them all).
create or replace function agentdb.principal_object(principal_id int) returns text
language sql immutable as $$
select format('agentdb_p_%s', principal_id)
$$;

-- The name of principal `principal_id`'s params function, agentdb.principal_params_<id>(source_id):
-- the values of its row filter compiled for that source, for its policies only (SECURITY DEFINER over a
-- table the role cannot read; only that role may execute it, so no principal reads another's values).
create or replace function agentdb.principal_params_function(principal_id int) returns text
language sql immutable as $$
select format('principal_params_%s', principal_id)
$$;

-- The name of principal `principal_id`'s row function for distributed source `source_id`,
-- agentdb.principal_row_<id>_<source>(doc_id, metadata): whether a row passes its row filter there (the body
-- agentdb.principal_policy_sql gives for such a source; principal_grant makes it).
create or replace function agentdb.principal_row_function(principal_id int, source_id int) returns text
language sql immutable as $$
select format('principal_row_%s_%s', principal_id, source_id)
$$;

-- The row filter of a principal as a policy expression on `src`'s table: agentdb_internal.compile_filter's
-- predicate over the alias `c`, evaluated on a one-row subquery aliased `c` that takes the columns the
-- compiler may read from the policy's own row, and whose values come from the principal's params
-- function (an uncorrelated sub-select, so it runs once per statement). Also returns the values.
create or replace function agentdb.principal_policy_sql(principal_id int, src agentdb.sources, row_filter jsonb)
returns table (expr text, params jsonb)
language plpgsql stable as $$
declare
    r record;
    pred text;
    cols text;
    params_ref text := format('(select agentdb.%I(%s))', agentdb.principal_params_function(principal_id), src.id);
begin
    select * into r from agentdb_internal.source_row_sql(src);
    select c.predicate, c.params into pred, params
    from agentdb_internal.compile_filter(src.fields, row_filter, params_ref, r.doc_id, 'row_filter') c;
    if pred in ('true', 'false') then
        expr := pred;
        return next;
        return;
    end if;
    if src.kind = 'documents' and src.distributed then
        -- A source distributed by Citus, whose policies take no subquery: this is the body of the principal's
        -- row function (principal_grant), called with the row's doc_id and metadata.
        cols := '$1 as doc_id, $2 as metadata';
    elsif src.kind = 'documents' then
        cols := format('%1$I.%2$I.doc_id, %1$I.%2$I.metadata', src.table_schema, src.table_name);
    else
        select string_agg(format('%I.%I.%I', src.table_schema, src.table_name, col), ', ')
        into cols
        from (select src.id_column as col
              union
              select f->>'column' from jsonb_array_elements(src.fields) f where f->>'column' is not null) x;
    end if;
    expr := format('(select (%s) from (select %s) c)', pred, cols);
    return next;
end;
$$;

-- The name of principal `principal_id`'s chunks function, agentdb.principal_chunks_<id>(source_id): the ids
-- of the chunks of that source which the calling role can read. LANGUAGE sql and not SECURITY DEFINER, so
-- that the planner inlines it into the postings policy, where it reads the source table with the role's own
-- column privileges and row security (one index probe per posting). Its body names the tables as text, so
-- no dependency keeps a source table from being dropped; principal_install_postings rewrites it then.
create or replace function agentdb.principal_chunks_function(principal_id int) returns text
language sql immutable as $$
select format('principal_chunks_%s', principal_id)
$$;

-- The id of the principal whose role is the current user, or null (the application, an analyst). The name's
-- prefix is looked at first, so that a caller outside a principal's scope pays one string comparison.
create or replace function agentdb.current_principal() returns int
language plpgsql stable as $$
begin
    if left(current_user, 10) <> 'agentdb_p_' then
        return null;
    end if;
    return (regexp_match(current_user, format('^agentdb_p_%s_(\d+)$',
            (select oid from pg_database where datname = current_database()))))[1]::int;
end;
$$;

-- The virtual generated column of a document table that holds only the metadata keys `keys` (sorted and
-- distinct): its name and its generation expression, built from immutable built-in functions only (as
-- PostgreSQL requires of a virtual column). A key missing from a row stays missing; a JSON null stays.
-- Principals with the same metadata grant share the column; it stores nothing.
create or replace function agentdb.metadata_projection(keys text[], out column_name text, out expr text)
language sql immutable as $$
select 'agentdb_meta_' || md5(array_to_string(keys, ',')),
       coalesce(string_agg(format('coalesce(jsonb_set(''{}''::jsonb, %L::text[], metadata -> %L), ''{}''::jsonb)',
                                  array[k], k), ' || ' order by n), '''{}''::jsonb')
from unnest(keys) with ordinality u(k, n)
$$;

-- The columns of `src`'s table that a principal with field grant `fields` (null = every field) may read,
-- besides a document table's metadata projection: the row key, the chunk position and the embedding
-- always; title and text when granted; a document table's whole metadata without a field grant; a
-- registered table's granted field columns, with "text" its text columns and with "title" its title column.
create or replace function agentdb.principal_columns(src agentdb.sources, fields text[]) returns text[]
language sql immutable as $$
select case when src.kind = 'documents' then
    array['agentdb_chunk_id', 'doc_id', 'chunk', 'agentdb_embedding']
    -- the tenant column of a source distributed by its tenant field, with or without that field: it is the
    -- distribution column every co-located join of a read names (hits never carry it, and a filter on a field
    -- outside the grant still reads that field as null), and its values are the postings' distribution column
    -- (agentdb.postings.doc_id), which the role reads already
    || case when agentdb_internal.route_column(src) = 'agentdb_tenant' then array['agentdb_tenant']
            else '{}'::text[] end
    || case when fields is null or 'title' = any(fields) then array['title'] else '{}'::text[] end
    || case when fields is null or 'text' = any(fields) then array['text'] else '{}'::text[] end
    || case when fields is null then array['metadata'] else '{}'::text[] end
else
    array(select distinct c from unnest(
        array[src.id_column, 'agentdb_chunk_id', 'agentdb_embedding']
        || case when fields is null or 'text' = any(fields) then src.text_columns else '{}'::text[] end
        || case when src.title_column is not null and (fields is null or 'title' = any(fields))
                then array[src.title_column] else '{}'::text[] end
        || array(select f->>'column' from jsonb_array_elements(src.fields) f
                 where f->>'column' is not null and (fields is null or f->>'name' = any(fields)))) c
          order by c)
end
$$;

-- The relation agentdb reads source `src` through for the current role: the table itself for anyone but a
-- principal; for a principal's role, a subquery over the table (aliased t) with the table's usual columns
-- (documents: agentdb_chunk_id, doc_id, chunk, title, text, agentdb_embedding, metadata; registered tables:
-- the key, text and field columns, agentdb_chunk_id, agentdb_embedding) in which every column the role may
-- not read is a typed null and `metadata` is the role's projection column ('{}' without one). Rows are left
-- to the table's row security. The planner flattens the subquery, so indexes serve it as they serve the table.
create or replace function agentdb.source_relation(src agentdb.sources) returns text
language plpgsql stable as $$
declare
    rel regclass;
    cols text;
    meta text;
begin
    if agentdb.current_principal() is null then
        return format('%I.%I', src.table_schema, src.table_name);
    end if;
    rel := to_regclass(format('%I.%I', src.table_schema, src.table_name));
    if rel is null then
        return format('%I.%I', src.table_schema, src.table_name);
    end if;
    select string_agg(case when has_column_privilege(rel, a.attnum, 'SELECT') then format('t.%I', a.attname)
                           else format('null::%s as %I', format_type(a.atttypid, a.atttypmod), a.attname) end,
                      ', ' order by a.attnum)
    into cols
    from pg_attribute a
    where a.attrelid = rel and a.attnum > 0 and not a.attisdropped
      and a.attname = any (case when src.kind = 'documents'
                                then array['agentdb_chunk_id', 'doc_id', 'chunk', 'title', 'text', 'agentdb_embedding',
                                           'agentdb_tenant']
                                else array[src.id_column, 'agentdb_chunk_id', 'agentdb_embedding'] || src.text_columns
                                     || case when src.title_column is null then '{}'::text[] else array[src.title_column] end
                                     || array(select f->>'column' from jsonb_array_elements(src.fields) f) end);
    if src.kind = 'documents' then
        meta := case when has_column_privilege(rel, 'metadata', 'SELECT') then 't.metadata'
                     else coalesce((select format('t.%I', a.attname) from pg_attribute a
                                    where a.attrelid = rel and a.attname like 'agentdb\_meta\_%' and not a.attisdropped
                                      and has_column_privilege(rel, a.attnum, 'SELECT')
                                    order by a.attnum limit 1), '''{}''::jsonb') end;
        cols := cols || format(', %s as metadata', meta);
    end if;
    return format('(select %s from %I.%I t)', cols, src.table_schema, src.table_name);
end;
$$;

-- Whether `row_filter` is the row filter of the principal whose role is active: its row security policies
-- apply it already, so a read under the role need not (and, when it reads a field outside the field grant,
-- could not) apply it again. SECURITY DEFINER over agentdb.principals, which the role cannot read; it tells
-- the caller about its own filter only. The active role is the `role` setting (SET ROLE), which a role can
-- only set to a role it is a member of.
create or replace function agentdb.principal_row_filter_applies(row_filter jsonb) returns boolean
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
select exists (select 1 from agentdb.principals p
               where p.role = current_setting('role')::name and p.row_filter is not distinct from $1)
$$;

-- The row filter of the principal whose role is active (the `role` setting, as above), or null. SECURITY
-- DEFINER over agentdb.principals; it tells the caller about its own filter only.
create or replace function agentdb.principal_row_filter() returns jsonb
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
select p.row_filter from agentdb.principals p where p.role = current_setting('role')::name
$$;

-- Whether the active role may see field `field`: not when it is a principal's role whose field grant leaves
-- the field out (null: yes). The filter compiler's hints and the index readers name or show only such
-- fields. SECURITY DEFINER over agentdb.principals; it tells the caller about its own grant only.
create or replace function agentdb.principal_field_granted(field text) returns boolean
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
select field is null or not exists (
    select 1 from agentdb.principals p
    where p.role = coalesce(nullif(current_setting('role'), 'none'), session_user::text)::name
      and p.fields is not null and not field = any (p.fields))
$$;

-- What the active principal (the `role` setting, as in agentdb.principal_row_filter_applies) may read of the
-- block postings of source `source_id`: `rel`, the source table (schema.table, quoted), and `pred`, the
-- predicate of the principal's policy on it over that table's name, compiled by agentdb.principal_policy_sql
-- ('true' for an open grant and for its own memory stores: every chunk). Both null, nothing, for anyone else,
-- for a source outside its grant, or one not in the block layout. A block holds postings of up to 128 chunks,
-- visible or not, so principals' roles cannot read agentdb.posting_blocks (migrations/0013, 0015): their
-- readers (agentdb_internal.principal_block_postings for the SQL path, agentdb_internal.principal_bm25_topk
-- for the C cursor) read blocks with their owner's rights and keep a chunk only when it passes this
-- predicate. That is all the row security they can apply, so a source table with policies that are not
-- agentdb's principal policies fails closed (9002): the grant and the move to blocks refuse such tables
-- (principal_grant below, agentdb.lexical_set_layout), but a policy may be added later. SECURITY DEFINER over
-- agentdb.principals; it tells the caller about its own policy only.
create or replace function agentdb.principal_block_predicate(source_id int, out rel text, out pred text)
language plpgsql stable security definer set search_path = pg_catalog, pg_temp as $$
declare
    p agentdb.principals;
    src agentdb.sources;
begin
    -- The `role` setting (SET ROLE), else the session's user: on a Citus worker the coordinator's connection
    -- logs in as the principal's role.
    select * into p from agentdb.principals x
    where x.role = coalesce(nullif(current_setting('role'), 'none'), session_user::text)::name;
    select * into src from agentdb.sources s where s.id = principal_block_predicate.source_id
                                                and s.lexical_layout = 'blocks';
    if p.id is null or src.id is null then
        return;
    end if;
    rel := format('%I.%I', src.table_schema, src.table_name);
    if exists (select 1 from agentdb.memory_stores m where m.source_id = src.id and m.owner = p.id) then
        pred := 'true';
    elsif src.name = any (p.tables) and has_any_column_privilege(p.role, rel, 'SELECT') then
        pred := (select x.expr from agentdb.principal_policy_sql(p.id, src, p.row_filter) x);
        if src.distributed and pred not in ('true', 'false') then
            -- there the policy's expression is the body of the principal's row function (principal_grant)
            pred := format('agentdb.%I(%2$s.doc_id, %2$s.metadata)',
                           agentdb.principal_row_function(p.id, src.id), rel);
        end if;
    else
        rel := null;
        return;
    end if;
    if cardinality(agentdb.principal_foreign_policies(rel::regclass)) > 0 then
        perform agentdb.raise_error(9002, 'DatabaseSetupError',
            format('source %L keeps block postings and its table has row security policies that are not'
                   ' agentdb''s, which principals'' block reads cannot apply', src.name), 'source',
            format('drop those policies, or move the source to row postings: agentdb optimize %s --layout rows',
                   src.name));
    end if;
end;
$$;

-- On a Citus coordinator the readers of a distributed source's blocks call it on the workers (in a shard's
-- statement), where reading the catalog, reference tables with a copy on that node, counts as a nested
-- distributed query, which Citus refuses unless allowed (as for a principal's params function).
do $$
begin
    if agentdb_internal.on_citus() then
        alter function agentdb.principal_block_predicate(int) set citus.allow_nested_distributed_execution = on;
    end if;
end;
$$;

-- Whether the current role can see source `source_id`'s catalog row (under the policies of agentdb.sources):
-- on a Citus coordinator, the policy of agentdb.corpus_stats, a reference table whose policies take no
-- subquery (agentdb/db/distribute.py). PL/pgSQL so that it is called, not inlined into the policy.
create or replace function agentdb_internal.source_visible(source_id int) returns boolean
language plpgsql stable as $$
begin
    return exists (select 1 from agentdb.sources s where s.id = source_visible.source_id);
end;
$$;

-- The term statistics of the named `terms` of source `source_id` (rows of agentdb.term_stats), for a
-- principal's role, which cannot read agentdb.term_stats itself: a lookup and never a listing, so the role
-- learns the document frequency of a term it names (as scores would tell it) but not the vocabulary of rows
-- it cannot read. Empty unless the active role (the `role` setting, else the session user) may read a
-- column of the source's table. SECURITY DEFINER.
create or replace function agentdb.principal_term_stats(source_id int, terms text[]) returns setof agentdb.term_stats
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
select ts.* from agentdb.term_stats ts
where ts.source_id = $1 and ts.term = any ($2)
  and exists (select 1 from agentdb.sources s
              where s.id = $1
                and has_any_column_privilege(coalesce(nullif(current_setting('role'), 'none'), session_user::text)::name,
                                             format('%I.%I', s.table_schema, s.table_name), 'SELECT'))
$$;

-- The names of the row security policies on table `rel` that are not agentdb's principal policies (those that
-- principal_grant creates: agentdb_p_<id>, _insert and _delete of an existing principal, to its role alone).
-- Principals read block postings through agentdb_internal.principal_block_postings and
-- agentdb_internal.principal_bm25_topk, which apply their own policy's predicate and cannot apply any other
-- policy (one that reads current_user, say, would see the function's owner), so a source with such policies
-- is not read in blocks by principals.
create or replace function agentdb.principal_foreign_policies(rel regclass) returns text[]
language sql stable as $$
select coalesce(array_agg(x.polname::text order by x.polname), '{}')
from pg_catalog.pg_policy x
where x.polrelid = $1
  and not exists (select 1 from agentdb.principals p join pg_catalog.pg_roles r on r.rolname = p.role
                  where x.polname in (agentdb.principal_object(p.id), agentdb.principal_object(p.id) || '_insert',
                                      agentdb.principal_object(p.id) || '_delete')
                    and x.polroles = array[r.oid])
$$;

-- (Re)create principal `principal_id`'s chunks function and its restrictive policy on agentdb.postings for
-- the sources in its table list now: the role sees a posting only when it can read the posting's chunk.
-- Sources whose row filter lets every row through ("open") skip the per-posting probe while no restrictive
-- policy is on their tables (checked once per statement, by table oid, which records no dependency): the
-- role can then read every row, so every posting of the source is one of its chunks'.
create or replace function agentdb.principal_install_postings(principal_id int) returns void
language plpgsql as $$
declare
    p agentdb.principals;
    src agentdb.sources;
    obj text := agentdb.principal_object(principal_id);
    fn text := agentdb.principal_chunks_function(principal_id);
    branches text[] := '{}';
    source_ids int[] := '{}';
    open_ids int[] := '{}';
    open_tables oid[] := '{}';
begin
    select * into p from agentdb.principals where id = principal_id;
    -- Its granted sources, and its own memory stores (sql/080_memory.sql), whose whole tables it may read.
    for src in select * from agentdb.sources s
               where s.name = any(p.tables)
                  or s.id in (select m.source_id from agentdb.memory_stores m where m.owner = principal_id)
               order by s.id loop
        branches := branches || format('select t.agentdb_chunk_id from %I.%I t where $1 = %s',
                                       src.table_schema, src.table_name, src.id);
        source_ids := source_ids || src.id;
        if exists (select 1 from agentdb.memory_stores m where m.source_id = src.id)
           or (select expr from agentdb.principal_policy_sql(principal_id, src, p.row_filter)) = 'true' then
            open_ids := open_ids || src.id;
            open_tables := open_tables || format('%I.%I', src.table_schema, src.table_name)::regclass::oid;
        end if;
    end loop;
    execute format('drop policy if exists %I on agentdb.postings', obj);
    if agentdb_internal.on_citus() then
        -- On a Citus coordinator the postings are distributed and their policy can take no subquery: the role
        -- sees the postings of its sources only, and the lexical leg of a principal's read joins them to the
        -- rows the role can read (agentdb.retrieve), so no hit, score or count comes from another row.
        execute format('create policy %I on agentdb.postings as restrictive for select to %I'
                       ' using (postings.source_id = any (%L::int[]))', obj, p.role, source_ids);
        return;
    end if;
    execute format($f$
        create or replace function agentdb.%I(source_id int) returns table (visible_chunk bigint)
        language sql stable as %L
        $f$, fn, coalesce(nullif(array_to_string(branches, ' union all '), ''), 'select null::bigint where false'));
    execute format('comment on function agentdb.%I(int) is %L', fn,
                   format('chunks principal %s can read, for its policy on agentdb.postings', p.name));
    execute format('revoke all on function agentdb.%I(int) from public', fn);
    execute format('grant execute on function agentdb.%I(int) to %I', fn, p.role);
    -- Source ids are never reused, so the lists need no update when a source is dropped.
    execute format($f$
        create policy %I on agentdb.postings as restrictive for select to %I
        using (postings.source_id = any (%L::int[])
               and ((postings.source_id = any (%L::int[])
                     and not exists (select 1 from pg_catalog.pg_policy x
                                     where x.polrelid = any (%L::oid[]) and not x.polpermissive))
                    or exists (select 1 from agentdb.%I(postings.source_id) v where v.visible_chunk = postings.chunk_id)))
        $f$, obj, p.role, source_ids, open_ids, open_tables, fn);
end;
$$;

-- Create the role of principal `principal_id` (a row of agentdb.principals whose sources exist) with its
-- grants, functions and policies (principal_grant). Runs in the caller's transaction.
create or replace function agentdb.principal_install(principal_id int) returns void
language plpgsql as $$
declare
    p agentdb.principals;
begin
    select * into p from agentdb.principals where id = principal_id;
    if not found then
        perform agentdb.not_found(format('unknown principal id %s', principal_id), 'name');
    end if;
    -- On a Citus coordinator the role's reads open connections to the workers as the role, so it may log in;
    -- it has no password, so a server that asks for one (every door but the cluster's trusted local
    -- sockets, or an authinfo entry in pg_dist_authinfo) still lets no one in as it.
    execute format('create role %I %s noinherit', p.role,
                   case when agentdb_internal.on_citus() then 'login' else 'nologin' end);
    -- The application must be able to SET ROLE to it; a superuser always can. Membership without
    -- inheritance (PostgreSQL 16+) keeps the application's own privileges unchanged.
    if not (select rolsuper from pg_roles where rolname = current_user) then
        if current_setting('server_version_num')::int >= 160000 then
            execute format('grant %I to %I with inherit false, set true', p.role, current_user);
        else
            execute format('grant %I to %I', p.role, current_user);
        end if;
    end if;
    perform agentdb.principal_grant(principal_id);
end;
$$;

-- Give the existing role of principal `principal_id` what its reads need (see the top of this file): schema
-- usage, the catalog tables, its params function, and per source the column privileges of its field grant,
-- a document table's metadata projection column, row-level security with the row filter's policy; then
-- the chunks function and the postings policy. Records install_version 2.
create or replace function agentdb.principal_grant(principal_id int) returns void
language plpgsql as $$
declare
    p agentdb.principals;
    src agentdb.sources;
    obj text := agentdb.principal_object(principal_id);
    fn text := agentdb.principal_params_function(principal_id);
    pol record;
    proj record;
    rel text;
    keys text[];
    foreign_policies text[];
    row_fn text;
begin
    select * into p from agentdb.principals where id = principal_id;
    -- A GRANT rewrites the table's pg_class row without locking the table, and a policy created on it later
    -- in this transaction takes its ACCESS EXCLUSIVE lock. An autovacuum of the table running meanwhile ends
    -- by updating that row in place, which waits for this transaction: a deadlock, in which PostgreSQL 18
    -- aborts the grant (seen in CI: create policy on agentdb.postings). So each such table is locked before
    -- its grant: an autovacuum holding it is then cancelled, as for any lock it blocks. (On a Citus
    -- coordinator the postings are distributed, and its shell table holds no rows to vacuum.)
    if not agentdb_internal.on_citus() then
        lock table agentdb.postings in access exclusive mode;
    end if;
    execute format('grant usage on schema agentdb, agentdb_docs, agentdb_internal to %I', p.role);
    execute format('grant execute on all functions in schema agentdb_internal to %I', p.role);
    -- agentdb.posting_blocks too, so that the readers of either layout (agentdb_internal.term_postings) run
    -- under the role; its restrictive policy shows principals' roles no block (migrations/0013), and they read
    -- block postings through agentdb_internal.principal_block_postings.
    execute format('grant select on agentdb.sources, agentdb.corpus_stats, agentdb.postings, agentdb.posting_blocks'
                   ' to %I', p.role);
    execute format($f$
        create or replace function agentdb.%I(source_id int) returns jsonb
        language sql stable security definer set search_path = pg_catalog, pg_temp%s as
        $b$ select g.params from agentdb.principal_grants g where g.principal_id = %s and g.source_id = $1 $b$
        $f$, fn,
        -- On a Citus coordinator the policies of a distributed source call it on the shards, where a read of
        -- agentdb.principal_grants (a reference table, with a copy on that node) counts as a nested
        -- distributed query, which Citus refuses unless allowed.
        case when agentdb_internal.on_citus()
             then ' set citus.allow_nested_distributed_execution = on' else '' end,
        principal_id);
    execute format('comment on function agentdb.%I(int) is %L', fn,
                   format('row filter values of principal %s, for its row-level security policies', p.name));
    execute format('revoke all on function agentdb.%I(int) from public', fn);
    execute format('grant execute on function agentdb.%I(int) to %I', fn, p.role);

    for src in select * from agentdb.sources s where s.name = any(p.tables) order by s.id loop
        rel := format('%I.%I', src.table_schema, src.table_name);
        -- Block postings are read through agentdb_internal.principal_block_postings, which applies the
        -- principal's own policy and no other.
        if src.lexical_layout = 'blocks' then
            foreign_policies := agentdb.principal_foreign_policies(rel::regclass);
            if cardinality(foreign_policies) > 0 then
                perform agentdb.invalid_param(
                    format('source %L keeps block postings and its table has row security policies that are not'
                           ' agentdb''s (%s), which principals'' block reads cannot apply', src.name,
                           array_to_string(foreign_policies, ', ')), 'tables',
                    format('drop those policies, or move the source to row postings first: agentdb optimize %s'
                           ' --layout rows', src.name));
            end if;
        end if;
        select * into pol from agentdb.principal_policy_sql(principal_id, src, p.row_filter);
        -- Citus refuses a subquery in a policy of a distributed table ("unexpected non-SELECT command in
        -- SubLink"): there the policy calls the principal's row function for the source, whose body is the
        -- policy's subquery over its arguments (Citus creates it on every node).
        if src.distributed and pol.expr not in ('true', 'false') then
            row_fn := agentdb.principal_row_function(principal_id, src.id);
            execute format('create or replace function agentdb.%I(doc_id text, metadata jsonb) returns boolean'
                           ' language sql stable as %L', row_fn, 'select ' || pol.expr);
            execute format('revoke all on function agentdb.%I(text, jsonb) from public', row_fn);
            execute format('grant execute on function agentdb.%I(text, jsonb) to %I', row_fn, p.role);
            pol.expr := format('agentdb.%I(doc_id, metadata)', row_fn);
        end if;
        insert into agentdb.principal_grants (principal_id, source_id, params) values (principal_id, src.id, pol.params);
        if not src.distributed then  -- before its grant (above)
            execute format('lock table %s in access exclusive mode', rel);
        end if;
        execute format('grant usage on schema %I to %I', src.table_schema, p.role);
        execute format('grant select (%s) on %s to %I',
                       (select string_agg(format('%I', c), ', ') from unnest(agentdb.principal_columns(src, p.fields)) c),
                       rel, p.role);
        keys := array(select distinct f from unnest(p.fields) f where f not in ('title', 'text') order by 1);
        if src.kind = 'documents' and cardinality(keys) > 0 then
            select * into proj from agentdb.metadata_projection(keys);
            -- Kept when the last principal using it goes (it stores nothing): a dropped column's number is
            -- never reused and a table has at most 1600, so dropping and re-adding it at every key rotation
            -- would exhaust them.
            -- Stored on a source distributed by Citus: Citus sends a shard a virtual column's expression in its
            -- place, which reads `metadata`, a column the role may not read there (a dense leg filtered on a
            -- granted key was refused, "permission denied for table <shard>").
            if not exists (select 1 from pg_attribute
                           where attrelid = rel::regclass and attname = proj.column_name and not attisdropped) then
                execute format('alter table %s add column %I jsonb generated always as (%s) %s',
                               rel, proj.column_name, proj.expr,
                               case when src.distributed then 'stored' else 'virtual' end);
                execute format('comment on column %s.%I is %L', rel, proj.column_name,
                               format('the metadata keys %s only, for principals granted just those fields', keys));
            end if;
            execute format('grant select (%I) on %s to %I', proj.column_name, rel, p.role);
        end if;
        if not (select relrowsecurity from pg_class where oid = rel::regclass) then
            execute format('alter table %s enable row level security', rel);
            insert into agentdb.rls_tables (relid) values (rel::regclass) on conflict do nothing;
        end if;
        execute format('create policy %I on %s as permissive for select to %I using (%s)', obj, rel, p.role, pol.expr);
        -- A writer (the `ingest` tool) inserts and deletes chunks of a document table under the same row
        -- filter, and writes only the metadata keys of its field grant (title and text only when granted).
        -- Not a distributed source's: a principal's writes there run as the application, after the same
        -- checks (agentdb.auth.writes_under_role), so its role needs no write privilege on it (and Citus
        -- takes no subquery in a policy: "unexpected non-SELECT command in SubLink").
        if 'ingest' = any(p.tools) and src.kind = 'documents' and not src.distributed then
            execute format('grant insert (%s), delete on %s to %I',
                           (select string_agg(format('%I', c), ', ') from unnest(array['doc_id', 'chunk', 'metadata', 'agentdb_embedding']
                               || array(select f from unnest(array['title', 'text']) f where p.fields is null or f = any(p.fields))) c),
                           rel, p.role);
            execute format('create policy %I on %s as permissive for insert to %I with check (%s and %s)',
                           obj || '_insert', rel, p.role, pol.expr,
                           case when p.fields is null then 'true'
                                else format('not exists (select 1 from jsonb_object_keys(%s.metadata) k where k <> all (%L::text[]))',
                                            rel, keys) end);
            execute format('create policy %I on %s as permissive for delete to %I using (%s)',
                           obj || '_delete', rel, p.role, pol.expr);
        end if;
    end loop;
    perform agentdb.principal_install_postings(principal_id);
    update agentdb.principals set install_version = 2 where id = principal_id;
end;
$$;

-- Take principal `principal_id`'s policy and privileges (column privileges too) off the table
-- `schema_name.table_name` (when it still exists), and turn row-level security off again when agentdb
-- turned it on and no policy is left.
create or replace function agentdb.principal_release_table(principal_id int, role_name name, schema_name text, table_name text)
returns void language plpgsql as $$
declare
    rel regclass := to_regclass(format('%I.%I', schema_name, table_name));
begin
    delete from agentdb.rls_tables r where not exists (select 1 from pg_class c where c.oid = r.relid);
    if rel is null then
        return;
    end if;
    execute format('drop policy if exists %I on %s', agentdb.principal_object(principal_id), rel);
    execute format('drop policy if exists %I on %s', agentdb.principal_object(principal_id) || '_insert', rel);
    execute format('drop policy if exists %I on %s', agentdb.principal_object(principal_id) || '_delete', rel);
    if exists (select 1 from pg_roles where rolname = role_name) then
        execute format('revoke all on %s from %I', rel, role_name);
    end if;
    if not exists (select 1 from pg_policy where polrelid = rel)
       and exists (select 1 from agentdb.rls_tables where relid = rel) then
        execute format('alter table %s disable row level security', rel);
        delete from agentdb.rls_tables where relid = rel;
    end if;
end;
$$;

-- Remove what principal_grant gave principal `principal_id`, keeping its role: policies, privileges, its
-- functions and filter values. Also removes what earlier versions granted (table-wide SELECT on its
-- sources, SELECT on agentdb.term_stats), so that it serves re-installation too.
create or replace function agentdb.principal_revoke(principal_id int) returns void
language plpgsql as $$
declare
    p agentdb.principals;
    src record;
    nsp text;
    obj text := agentdb.principal_object(principal_id);
begin
    select * into p from agentdb.principals where id = principal_id;
    if not found then
        return;
    end if;
    -- On a Citus coordinator: one connection per node for the rest of the transaction, since it drops
    -- policies of distributed tables and then functions (which Citus drops on every node over one connection).
    if agentdb_internal.on_citus() then
        perform set_config('citus.multi_shard_modify_mode', 'sequential', true);
    end if;
    for src in
        select s.table_schema, s.table_name from agentdb.sources s where s.name = any(p.tables)
    loop
        perform agentdb.principal_release_table(principal_id, p.role, src.table_schema, src.table_name);
    end loop;
    execute format('drop policy if exists %I on agentdb.postings', obj);
    execute format('drop function if exists agentdb.%I(int)', agentdb.principal_params_function(principal_id));
    execute format('drop function if exists agentdb.%I(int)', agentdb.principal_chunks_function(principal_id));
    for nsp in
        select x.proname from pg_proc x
        where x.pronamespace = 'agentdb'::regnamespace and x.proname like format('principal\_row\_%s\_%%', principal_id)
    loop
        execute format('drop function if exists agentdb.%I(text, jsonb)', nsp);
    end loop;
    delete from agentdb.principal_grants g where g.principal_id = principal_revoke.principal_id;
    if not exists (select 1 from pg_roles where rolname = p.role) then
        return;
    end if;
    execute format('revoke all on agentdb.sources, agentdb.corpus_stats, agentdb.term_stats, agentdb.postings,'
                   ' agentdb.posting_blocks from %I', p.role);
    execute format('revoke all on all functions in schema agentdb_internal from %I', p.role);
    for nsp in
        select n.nspname from pg_namespace n, aclexplode(n.nspacl) a
        where a.grantee = (select r.oid from pg_roles r where r.rolname = p.role)
    loop
        execute format('revoke all on schema %I from %I', nsp, p.role);
    end loop;
end;
$$;

-- Re-install principal `principal_id` with the current grants; its role, name and key stay.
create or replace function agentdb.principal_reinstall(principal_id int) returns void
language plpgsql as $$
begin
    if exists (select 1 from agentdb.principals p join pg_roles r on r.rolname = p.role where p.id = principal_id) then
        perform agentdb.principal_revoke(principal_id);
        perform agentdb.principal_grant(principal_id);
    else
        perform agentdb.principal_install(principal_id);
    end if;
end;
$$;

-- Remove everything principal_install made for principal `principal_id`: policies, privileges, its
-- functions and the role. The role is kept (with nothing left in this database) when another database
-- still holds privileges for it, e.g. a copy made with CREATE DATABASE ... TEMPLATE. A metadata projection
-- column stays on its table (see principal_grant).
create or replace function agentdb.principal_uninstall(principal_id int) returns void
language plpgsql as $$
declare
    p agentdb.principals;
begin
    select * into p from agentdb.principals where id = principal_id;
    if not found then
        return;
    end if;
    perform agentdb.principal_revoke(principal_id);
    if not exists (select 1 from pg_roles where rolname = p.role) then
        return;
    end if;
    -- DROP OWNED also catches anything granted to the role by hand, but needs the privileges of the role
    -- (always true for a superuser).
    if pg_has_role(current_user, p.role, 'USAGE') then
        execute format('drop owned by %I', p.role);
    end if;
    begin
        execute format('drop role %I', p.role);
    exception when dependent_objects_still_exist then
        raise notice 'role % is still used in another database; it is kept (NOLOGIN, no privileges here)', p.role;
    end;
end;
$$;

-- When a source is removed, its principals lose it: policy, privileges and filter values go, the source's
-- name leaves their table lists (so a new source of the same name is not granted by accident), and their
-- chunks functions and postings policies are rewritten without it.
create or replace function agentdb.principal_release_source() returns trigger
language plpgsql as $$
declare
    p agentdb.principals;
begin
    for p in select * from agentdb.principals where old.name = any(tables) loop
        perform agentdb.principal_release_table(p.id, p.role, old.table_schema, old.table_name);
        delete from agentdb.principal_grants g where g.principal_id = p.id and g.source_id = old.id;
        update agentdb.principals set tables = array_remove(tables, old.name) where id = p.id;
        perform agentdb.principal_install_postings(p.id);
    end loop;
    return null;
end;
$$;

select agentdb_internal.catalog_delete_trigger('principals_release_source', 'agentdb.sources',
                                              'agentdb.principal_release_source()');

-- Principals installed before the grants above (install_version < 2: table-wide SELECT on their sources, all
-- postings of a source, the whole of agentdb.term_stats) are re-installed. migrate re-applies this file after
-- the migrations, so this converts each database once (migration 0006 added the column).
do $$
declare
    pid int;
begin
    for pid in select id from agentdb.principals where install_version < 2 order by id loop
        perform agentdb.principal_reinstall(pid);
    end loop;
end;
$$;
