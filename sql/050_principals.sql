-- Principals in the database: each one has its own NOLOGIN role with only the grants its reads need and
-- row-level security policies compiled from its row filter, so that a read agentdb runs under that role
-- (agentdb.auth.principal_scope: SET LOCAL ROLE) cannot see a row outside the filter, even if the request
-- handling forgot the filter. The table owner (the application itself, ingestion) bypasses RLS as usual.
--
-- What a principal role may read:
--   * USAGE on the schemas agentdb and agentdb_docs (and that of any registered table it may read);
--   * SELECT on agentdb.sources, agentdb.corpus_stats, agentdb.term_stats and agentdb.postings (the last
--     limited by a restrictive policy to the sources it is granted);
--   * SELECT on exactly its source tables, through a policy `for select to <role> using (<row filter>)`;
--   * EXECUTE on its own params function; nothing on agentdb.principals or agentdb.principal_grants.
--
-- Global BM25 statistics (N = corpus_stats.n_chunks, df = term_stats.df, avgdl) stay shared across
-- principals, as in Elasticsearch document-level security: a score then means the same thing whoever asks
-- and the statistics need no per-principal copy that every write would have to maintain. The price is a
-- weak aggregate side channel (a term's document frequency over all rows can be inferred from scores).
-- Hits, texts, fields and every count in the diagnostics come from rows read under the role, so they
-- never include a row outside the filter.

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

-- The row filter of a principal as a policy expression on `src`'s table: agentdb.compile_filter's
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
    select * into r from agentdb.source_row_sql(src);
    select c.predicate, c.params into pred, params
    from agentdb.compile_filter(src.fields, row_filter, params_ref, r.doc_id, 'row_filter') c;
    if pred in ('true', 'false') then
        expr := pred;
        return next;
        return;
    end if;
    if src.kind = 'documents' then
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

-- Create the role of principal `principal_id` (a row of agentdb.principals whose sources exist) with
-- its grants, its params function and its policies. Runs in the caller's transaction.
create or replace function agentdb.principal_install(principal_id int) returns void
language plpgsql as $$
declare
    p agentdb.principals;
    src agentdb.sources;
    obj text := agentdb.principal_object(principal_id);
    fn text := agentdb.principal_params_function(principal_id);
    pol record;
    source_ids int[] := '{}';
begin
    select * into p from agentdb.principals where id = principal_id;
    if not found then
        perform agentdb.raise_error(3010, 'StorageFileNotFound', format('unknown principal id %s', principal_id), 'name');
    end if;
    execute format('create role %I nologin noinherit', p.role);
    -- The application must be able to SET ROLE to it; a superuser always can. Membership without
    -- inheritance (PostgreSQL 16+) keeps the application's own privileges unchanged.
    if not (select rolsuper from pg_roles where rolname = current_user) then
        if current_setting('server_version_num')::int >= 160000 then
            execute format('grant %I to %I with inherit false, set true', p.role, current_user);
        else
            execute format('grant %I to %I', p.role, current_user);
        end if;
    end if;
    execute format('grant usage on schema agentdb, agentdb_docs to %I', p.role);
    execute format('grant select on agentdb.sources, agentdb.corpus_stats, agentdb.term_stats, agentdb.postings to %I',
                   p.role);
    execute format($f$
        create function agentdb.%I(source_id int) returns jsonb
        language sql stable security definer set search_path = pg_catalog, pg_temp as
        $b$ select g.params from agentdb.principal_grants g where g.principal_id = %s and g.source_id = $1 $b$
        $f$, fn, principal_id);
    execute format('comment on function agentdb.%I(int) is %L', fn,
                   format('row filter values of principal %s, for its row-level security policies', p.name));
    execute format('revoke all on function agentdb.%I(int) from public', fn);
    execute format('grant execute on function agentdb.%I(int) to %I', fn, p.role);

    for src in select * from agentdb.sources s where s.name = any(p.tables) order by s.id loop
        select * into pol from agentdb.principal_policy_sql(principal_id, src, p.row_filter);
        insert into agentdb.principal_grants (principal_id, source_id, params) values (principal_id, src.id, pol.params);
        execute format('grant usage on schema %I to %I', src.table_schema, p.role);
        execute format('grant select on %I.%I to %I', src.table_schema, src.table_name, p.role);
        if not (select relrowsecurity from pg_class where oid = format('%I.%I', src.table_schema, src.table_name)::regclass) then
            execute format('alter table %I.%I enable row level security', src.table_schema, src.table_name);
            insert into agentdb.rls_tables (relid) values (format('%I.%I', src.table_schema, src.table_name)::regclass)
            on conflict do nothing;
        end if;
        execute format('create policy %I on %I.%I as permissive for select to %I using (%s)',
                       obj, src.table_schema, src.table_name, p.role, pol.expr);
        source_ids := source_ids || src.id;
    end loop;
    -- Source ids are never reused, so this list needs no update when a source is dropped.
    execute format('create policy %I on agentdb.postings as restrictive for select to %I using (source_id = any (%L::int[]))',
                   obj, p.role, source_ids);
end;
$$;

-- Take principal `principal_id`'s policy and grant off the table `schema_name.table_name` (when it still
-- exists), and turn row-level security off again when agentdb turned it on and no policy is left.
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

-- Remove everything principal_install made for principal `principal_id`: policies, grants, the params
-- function and the role. The role is kept (with nothing left in this database) when another database
-- still holds privileges for it, e.g. a copy made with CREATE DATABASE ... TEMPLATE.
create or replace function agentdb.principal_uninstall(principal_id int) returns void
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
    for src in
        select s.table_schema, s.table_name from agentdb.sources s where s.name = any(p.tables)
    loop
        perform agentdb.principal_release_table(principal_id, p.role, src.table_schema, src.table_name);
    end loop;
    execute format('drop policy if exists %I on agentdb.postings', obj);
    execute format('drop function if exists agentdb.%I(int)', agentdb.principal_params_function(principal_id));
    delete from agentdb.principal_grants g where g.principal_id = principal_uninstall.principal_id;
    if not exists (select 1 from pg_roles where rolname = p.role) then
        return;
    end if;
    -- Revoke what principal_install granted; DROP OWNED also catches anything granted to the role by hand,
    -- but needs the privileges of the role (always true for a superuser).
    execute format('revoke all on agentdb.sources, agentdb.corpus_stats, agentdb.term_stats, agentdb.postings from %I',
                   p.role);
    for nsp in
        select n.nspname from pg_namespace n, aclexplode(n.nspacl) a
        where a.grantee = (select r.oid from pg_roles r where r.rolname = p.role)
    loop
        execute format('revoke all on schema %I from %I', nsp, p.role);
    end loop;
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

-- When a source is removed, its principals lose it: policy, grant and filter values go, and the source's
-- name leaves their table lists (so a new source of the same name is not granted by accident).
create or replace function agentdb.principal_release_source() returns trigger
language plpgsql as $$
declare
    p agentdb.principals;
begin
    for p in select * from agentdb.principals where old.name = any(tables) loop
        perform agentdb.principal_release_table(p.id, p.role, old.table_schema, old.table_name);
        delete from agentdb.principal_grants g where g.principal_id = p.id and g.source_id = old.id;
        update agentdb.principals set tables = array_remove(tables, old.name) where id = p.id;
    end loop;
    return null;
end;
$$;

create or replace trigger principals_release_source after delete on agentdb.sources
for each row execute function agentdb.principal_release_source();
