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
    perform agentdb.raise_error(3010, 'StorageFileNotFound',
                                format('no source named %L; `agentdb sources` or GET /sources lists them', source_name),
                                'source');
end;
$$;
