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
