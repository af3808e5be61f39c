-- Raise an agentdb error: SQLSTATE ADB00 with {"code", "name", "path"} as JSON detail, so every door
-- (SQL, Python, HTTP) reports the same code, name, message and path.
create or replace function agentdb.raise_error(
    code int, name text, message text, path text default null, hint text default null
) returns void language plpgsql as $$
begin
    raise exception using
        errcode = 'ADB00',
        message = message,
        detail = jsonb_build_object('code', code, 'name', name, 'path', path)::text,
        hint = coalesce(hint, '');
end;
$$;

-- 3010 for a source that does not exist. The code and name are the reference's ("StorageFileNotFound"), and
-- say "file": the message says plainly that no source has that name, and where the names are listed
-- (agentdb.sources.unknown_source says the same in Python).
create or replace function agentdb.raise_unknown_source(source_name text) returns void language plpgsql as $$
begin
    perform agentdb.not_found(format('no source named %L; `agentdb sources` or GET /sources lists them', source_name),
                              'source');
end;
$$;

-- The catalog row of the source named `source_name`, or 3010 at `source`: how a function taking a source by
-- name starts.
create or replace function agentdb_internal.source_named(source_name text) returns agentdb.sources
language plpgsql stable as $$
declare
    src agentdb.sources;
begin
    select * into src from agentdb.sources s where s.name = source_name;
    if not found then
        perform agentdb.raise_unknown_source(source_name);
    end if;
    return src;
end;
$$;

-- One helper per code used often, so a call names the error once and cannot pair a code with the wrong
-- name: 3007 for a parameter with an invalid value, 3010 for a named thing that does not exist, 8003 for
-- stored content that does not fit the request (an embedding of another model or dimension).
create or replace function agentdb.invalid_param(message text, path text default null, hint text default null)
returns void language sql as $$ select agentdb.raise_error(3007, 'InvalidParamValue', message, path, hint) $$;
create or replace function agentdb.not_found(message text, path text default null, hint text default null)
returns void language sql as $$ select agentdb.raise_error(3010, 'StorageFileNotFound', message, path, hint) $$;
create or replace function agentdb.content_mismatch(message text, path text default null, hint text default null)
returns void language sql as $$ select agentdb.raise_error(8003, 'StorageContentError', message, path, hint) $$;

-- 3007 at `path` unless `value` lies between `lo` and `hi`, both included (null and NaN do not): the check of
-- a bounded numeric parameter, saying "<path> must be between <lo> and <hi>".
create or replace function agentdb_internal.check_between(value float8, lo float8, hi float8, path text)
returns void language plpgsql as $$
begin
    if value is null or not (value >= lo and value <= hi) then
        perform agentdb.invalid_param(format('%s must be between %s and %s', path, lo, hi), path);
    end if;
end;
$$;
