-- Metadata filters: one compiler for every door (SQL, Python, HTTP). A filter written in any of three
-- surface syntaxes (operator objects, Bleve-style query objects, Tryll op nodes) is validated against
-- the source's field schema, normalised to one AST, then compiled to a predicate over the row alias `c`.
-- Every user value goes into a jsonb array of parameters; the predicate text names only validated
-- fields (quoted with %I or %L) and refers to values as (params_ref->N).
--
-- The AST (jsonb) has combinators {"t": "const", "v": bool}, {"t": "and"|"or", "args": [..]},
-- {"t": "not", "arg": ..}, {"t": "atleast", "n": int, "args": [..]} and leaves
-- {"t": "cmp", "op": "eq|ne|lt|le|gt|ge", "f": field, "v": value}, {"t": "in", "f", "v": [values], "neg"},
-- {"t": "contains"|"prefix", "f", "v"}, {"t": "exists", "f"}, {"t": "ids", "v": [ids]}.
--
-- Semantics (Tryll): a comparison on a missing optional field is false. A field is missing when its key
-- is absent, JSON null, SQL NULL, or holds a value of the wrong JSON type; a field with a default is
-- never missing (the default stands in). Every leaf compiles to a two-valued expression (wrapped in
-- coalesce(..., false), or `expr and x is not null` where an index must stay usable), so `not`,
-- `$not` and `must_not` of a comparison on a missing field are TRUE, while `$ne`/`$nin` on it are FALSE.
-- Strings order by code point; timestamps compare as instants (filter values without an offset are UTC;
-- stored ones are read in the session's time zone, so store them with an offset).
--
-- Limits, so that any filter compiles in a few tens of milliseconds (a filter is user input on every door,
-- and compiling it holds a pooled connection). Each is inclusive and each is 3007 InvalidParamValue at the
-- path where it is crossed:
--   depth 16 (`too_deep`); 256 nodes (`too_many_nodes`); 1,000 items in any one array (`too_many_items`);
--   10,000 items in all the value lists of one filter together ($in, $nin, terms, in haystacks, ids;
--   `too_many_values`, at the list that crosses the total); 1 MiB (1,048,576 bytes) for the whole filter
--   as jsonb (`too_large`, at the root; about the size of its JSON text, twice that for lists of small
--   numbers), which bounds long strings.
-- Compiling is linear in the filter's size: a value list is checked (and timestamps normalised) by one
-- set-based statement, the items being walked one by one only to name the first bad one; children and
-- parameters are gathered in plpgsql arrays (appended in place) and made jsonb once; each subtree returns
-- its own parameters to its parent instead of threading all of them through every call; and the hot
-- paths run no query per node where an operator will do. bench/filter_compile.py times the largest
-- filters these limits allow.

-- Raise 3007 InvalidParamValue with the message `filter.<kind>: at <path>: <detail>`; the error's path is
-- the caller's prefix joined to the path inside the filter (`$` and the bare prefix at the root).
create or replace function agentdb_internal.filter_fail(ctx jsonb, kind text, path text, detail text, hint text default null)
returns void language plpgsql stable as $$
declare
    prefix text := coalesce(ctx->>'prefix', '');
begin
    perform agentdb.invalid_param(
        format('filter.%s: at %s: %s', kind, coalesce(nullif(path, ''), '$'), detail),
        case
            when coalesce(path, '') = '' then coalesce(nullif(prefix, ''), '$')
            when prefix = '' then path
            else prefix || '.' || path
        end,
        hint);
end;
$$;

-- The JSON path of `key` inside the object at `path` ('' is the root).
create or replace function agentdb_internal.filter_key(path text, key text) returns text
language sql immutable as $$
select case when path = '' then key else path || '.' || key end
$$;

-- The first key of the object `node`, in sorted order, that is not in `allowed`, or null. The key set
-- difference is a plain expression; the keys are only listed (a query) when there is an extra one.
create or replace function agentdb_internal.filter_extra_key(node jsonb, allowed text[]) returns text
language plpgsql immutable as $$
begin
    if node - allowed = '{}'::jsonb then
        return null;
    end if;
    return (select k from jsonb_object_keys(node) k where k <> all(allowed) order by k limit 1);
end;
$$;

-- Count one more node at `path`, enforcing the limits (depth 16, 256 nodes); returns the new count.
create or replace function agentdb_internal.filter_enter(ctx jsonb, path text, depth int, nodes int) returns int
language plpgsql stable as $$
begin
    if depth > 16 then
        perform agentdb_internal.filter_fail(ctx, 'too_deep', path, 'the filter is nested deeper than 16 levels');
    end if;
    if nodes >= 256 then
        perform agentdb_internal.filter_fail(ctx, 'too_many_nodes', path, 'the filter has more than 256 nodes');
    end if;
    return nodes + 1;
end;
$$;

-- The kind of a JSON value as error messages name it: int, float, string, bool, null, array, object.
create or replace function agentdb_internal.filter_kind(v jsonb) returns text
language sql immutable as $$
select case jsonb_typeof(v)
    when 'number' then case when v::text ~ '[.eE]' then 'float' else 'int' end
    when 'boolean' then 'bool'
    when 'string' then 'string'
    when 'array' then 'array'
    when 'object' then 'object'
    else 'null'
end
$$;

-- A JSON array of ISO 8601 dates or date-times in canonical UTC form (YYYY-MM-DDTHH:MI:SS.USZ), or null
-- when any item of `list` is not one. Values without an offset are read as UTC, whatever the session's
-- time zone. The format is checked by one regular expression over the array's text (an item that
-- matches is a plain JSON string, with nothing escaped) and the dates (2020-02-30) by pg_input_is_valid,
-- so there is neither a per-item regular expression nor an exception block (a subtransaction) per item.
create or replace function agentdb_internal.filter_timestamps(list jsonb) returns jsonb
language plpgsql stable set timezone = 'UTC' as $$
declare
    items text[];
begin
    if list::text !~ ('^\[("\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}(:?\d{2})?)?)?"'
                      '(, "\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}(:?\d{2})?)?)?")*)?\]$') then
        return null;
    end if;
    select array_agg(case when pg_input_is_valid(e, 'timestamptz')
                          then to_char(e::timestamptz, 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') end order by o)
    into items
    from jsonb_array_elements_text(list) with ordinality x(e, o);
    if array_position(items, null) is not null then
        return null;
    end if;
    return coalesce(to_jsonb(items), '[]');
end;
$$;

-- One ISO 8601 date or date-time in canonical UTC form, or null when `value` is not one.
create or replace function agentdb_internal.filter_timestamp(value text) returns text
language sql stable as $$
select agentdb_internal.filter_timestamps(jsonb_build_array(value))->>0
$$;

-- The spec of the field named by the JSON value `name`: unknown, non-filterable or unsupported -> 3007.
create or replace function agentdb_internal.filter_field(ctx jsonb, name jsonb, path text) returns jsonb
language plpgsql stable as $$
declare
    spec jsonb;
begin
    if jsonb_typeof(name) is distinct from 'string' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, 'a field name must be a string');
    end if;
    spec := ctx->'fields'->(name #>> '{}');
    if spec is null then
        perform agentdb_internal.filter_fail(ctx, 'unknown_field', path, format('unknown field %s', name::text),
            'filterable fields: ' || coalesce((
                select string_agg(k, ', ' order by k) from jsonb_each(ctx->'fields') as e(k, s)
                where (s->>'filterable')::boolean and agentdb.principal_field_granted(k)  -- never a hidden name
            ), '(none)'));
    end if;
    if not (spec->>'filterable')::boolean then
        perform agentdb_internal.filter_fail(ctx, 'not_filterable', path, format('field %s is not filterable', name::text));
    end if;
    if (spec->>'type') not in ('int', 'float', 'string', 'bool', 'string_set', 'timestamp') then
        perform agentdb_internal.filter_fail(ctx, 'not_filterable', path,
            format('field %s has the unsupported type %s', name::text, spec->>'type'));
    end if;
    return spec;
end;
$$;

-- Check one literal against a field's type and return it normalised (timestamps in canonical UTC form).
-- int and float promote to each other; string_set fields compare with strings.
create or replace function agentdb_internal.filter_value(ctx jsonb, spec jsonb, v jsonb, path text) returns jsonb
language plpgsql stable as $$
declare
    kind text := agentdb_internal.filter_kind(v);
    ftype text := spec->>'type';
    ts text;
begin
    if kind = 'array' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path,
            'an array literal is only allowed as a list of values ($in, $nin, terms, ids or an in haystack)');
    elsif kind = 'object' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, 'an object is not a value');
    end if;
    if ftype in ('int', 'float') and kind in ('int', 'float') then
        -- Values beyond float8 could not be compared with float columns.
        if abs(v::numeric) >= 1e308 or (v::numeric <> 0 and abs(v::numeric) < 1e-300) then
            perform agentdb_internal.filter_fail(ctx, 'type_mismatch', path, format('the number is out of range for %s', ftype));
        end if;
        return v;
    elsif ftype in ('string', 'string_set') and kind = 'string' then
        return v;
    elsif ftype = 'bool' and kind = 'bool' then
        return v;
    elsif ftype = 'timestamp' and kind = 'string' then
        ts := agentdb_internal.filter_timestamp(v #>> '{}');
        if ts is null then
            perform agentdb_internal.filter_fail(ctx, 'type_mismatch', path,
                'cannot compare string with timestamp: expected an ISO 8601 date-time such as 2020-01-01T00:00:00Z');
        end if;
        return to_jsonb(ts);
    end if;
    perform agentdb_internal.filter_fail(ctx, 'type_mismatch', path, format('cannot compare %s with %s', kind, ftype));
    return null;
end;
$$;

-- Count the `n` items of the list at `path` against the filter's budget of 10,000 list items (`vals` is the
-- count so far); returns the new count.
create or replace function agentdb_internal.filter_spend(ctx jsonb, path text, vals int, n int) returns int
language plpgsql stable as $$
begin
    if vals + n > 10000 then
        perform agentdb_internal.filter_fail(ctx, 'too_many_values', path, 'the filter has more than 10000 list items');
    end if;
    return vals + n;
end;
$$;

-- Check a list literal ($in, $nin, terms, an in haystack) and each of its items; returns the normalised list
-- and the filter's list items counted so far. The items are checked by one jsonpath (or, for timestamps,
-- normalised by one call); only when that fails are they walked one by one, so that the first bad item is
-- reported exactly as agentdb_internal.filter_value reports a single value.
create or replace function agentdb_internal.filter_list(
    ctx jsonb, spec jsonb, v jsonb, path text, label text, inout vals int, out list jsonb
) language plpgsql stable as $$
declare
    ftype text := spec->>'type';
    n int;
    i int;
begin
    if jsonb_typeof(v) is distinct from 'array' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, format('%s needs an array of values', label));
    end if;
    n := jsonb_array_length(v);
    if n > 1000 then
        perform agentdb_internal.filter_fail(ctx, 'too_many_items', path, format('%s has more than 1000 items', label));
    end if;
    vals := agentdb_internal.filter_spend(ctx, path, vals, n);
    list := case
        when ftype = 'timestamp' then agentdb_internal.filter_timestamps(v)
        -- The same range as filter_value: values beyond float8 could not be compared with float columns.
        when ftype in ('int', 'float') then case
            when jsonb_path_exists(v, 'strict $[*] ? (@.type() != "number")')
              or jsonb_path_exists(v, 'strict $[*] ? (@ >= 1e308 || @ <= -1e308 || (@ != 0 && @ < 1e-300 && @ > -1e-300))')
            then null else v end
        when ftype in ('string', 'string_set') then case
            when jsonb_path_exists(v, 'strict $[*] ? (@.type() != "string")') then null else v end
        when ftype = 'bool' then case
            when jsonb_path_exists(v, 'strict $[*] ? (@.type() != "boolean")') then null else v end
    end;
    if list is null then
        -- Raises at the first bad item.
        for i in 0 .. n - 1 loop
            perform agentdb_internal.filter_value(ctx, spec, v->i, path || '[' || i || ']');
        end loop;
        list := to_jsonb(array(
            select agentdb_internal.filter_value(ctx, spec, e, path) from jsonb_array_elements(v) with ordinality x(e, o)
            order by o));
    end if;
end;
$$;

-- One leaf of the AST: `op` (eq ne lt le gt ge in nin contains prefix) applied to a field and a literal.
-- `label` is the operator as the user wrote it; `op_path` and `value_path` locate errors; `vals` counts
-- the filter's list items.
create or replace function agentdb_internal.filter_leaf(
    ctx jsonb, op text, spec jsonb, v jsonb, op_path text, value_path text, label text, inout vals int, out ast jsonb
) language plpgsql stable as $$
declare
    ftype text := spec->>'type';
    name text := spec->>'name';
    r record;
begin
    if op in ('lt', 'le', 'gt', 'ge') and ftype in ('bool', 'string_set') then
        perform agentdb_internal.filter_fail(ctx, 'bad_operator', op_path,
            format('%s does not apply to %s field %s', label, ftype, to_jsonb(name)));
    elsif op in ('contains', 'prefix') and ftype not in ('string', 'string_set') then
        perform agentdb_internal.filter_fail(ctx, 'bad_operator', op_path,
            format('%s does not apply to %s field %s', label, ftype, to_jsonb(name)));
    end if;
    if op in ('in', 'nin') then
        r := agentdb_internal.filter_list(ctx, spec, v, value_path, label, vals);
        vals := r.vals;
        ast := jsonb_build_object('t', 'in', 'f', name, 'neg', op = 'nin', 'v', r.list);
    elsif op in ('contains', 'prefix') then
        ast := jsonb_build_object('t', op, 'f', name, 'v', agentdb_internal.filter_value(ctx, spec, v, value_path));
    else
        ast := jsonb_build_object('t', 'cmp', 'op', op, 'f', name, 'v', agentdb_internal.filter_value(ctx, spec, v, value_path));
    end if;
end;
$$;

-- AND of a list of AST nodes, simplified: [] is true, a single node stands alone.
create or replace function agentdb_internal.filter_and(items jsonb[]) returns jsonb
language sql immutable as $$
select case coalesce(cardinality(items), 0)
    when 0 then '{"t": "const", "v": true}'::jsonb
    when 1 then items[1]
    else jsonb_build_object('t', 'and', 'args', items)
end
$$;

-- At least `n` of the nodes `items`: folded to true, false, or and/or when it can be.
create or replace function agentdb_internal.filter_atleast(n int, items jsonb[]) returns jsonb
language sql immutable as $$
select case
    when n <= 0 then '{"t": "const", "v": true}'::jsonb
    when n > coalesce(cardinality(items), 0) then '{"t": "const", "v": false}'::jsonb
    when cardinality(items) = 1 then items[1]
    when n = 1 then jsonb_build_object('t', 'or', 'args', items)
    when n = cardinality(items) then jsonb_build_object('t', 'and', 'args', items)
    else jsonb_build_object('t', 'atleast', 'n', n, 'args', items)
end
$$;

-- A non-negative integer parameter (disjuncts.min, minimum_should_match), or 3007 bad_operand.
create or replace function agentdb_internal.filter_count(ctx jsonb, v jsonb, path text, label text) returns int
language plpgsql stable as $$
begin
    if jsonb_typeof(v) is distinct from 'number' or v::numeric <> trunc(v::numeric)
       or v::numeric < 0 or v::numeric > 1000000 then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, format('%s must be a non-negative integer', label));
    end if;
    return v::numeric::int;
end;
$$;

-- Parse any filter node: detects its syntax (Tryll op node, query object, or operator object), per
-- object, so the syntaxes may also be nested inside each other. An object with `op` is a Tryll node;
-- one with a query key that is not also a field name is a query object (so a stray key in a query is
-- reported as such); anything else is an operator object, so a field may be named like a query key.
-- Depth counts nested nodes (the root is 1; in operator objects, each field condition and each
-- field-level $not is a node too).
create or replace function agentdb_internal.filter_parse(
    ctx jsonb, node jsonb, path text, depth int, inout nodes int, inout vals int, out ast jsonb
) language plpgsql stable as $$
declare
    query_keys constant text[] := array[
        'term', 'terms', 'prefix', 'field', 'min', 'max', 'inclusive_min', 'inclusive_max', 'numeric_range',
        'start', 'end', 'inclusive_start', 'inclusive_end', 'date_range', 'conjuncts', 'disjuncts', 'bool',
        'must', 'should', 'must_not', 'filter', 'minimum_should_match', 'match_all', 'match_none', 'ids',
        'doc_id'];
    r record;
    is_query boolean;
begin
    nodes := agentdb_internal.filter_enter(ctx, path, depth, nodes);
    if jsonb_typeof(node) is distinct from 'object' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path,
            format('expected a filter object, got %s', agentdb_internal.filter_kind(node)));
    end if;
    if node ? 'op' then
        r := agentdb_internal.filter_parse_tryll(ctx, node, path, depth, nodes, vals);
    else
        is_query := node ?| query_keys;
        if is_query and (ctx->'fields') ?| query_keys then
            -- Some field is named like a query key: only the other query keys make this a query object.
            is_query := exists (
                select 1 from jsonb_object_keys(node) k where k = any(query_keys) and not (ctx->'fields') ? k);
        end if;
        if is_query then
            r := agentdb_internal.filter_parse_query(ctx, node, path, depth, nodes, vals);
        else
            r := agentdb_internal.filter_parse_object(ctx, node, path, depth, nodes, vals);
        end if;
    end if;
    nodes := r.nodes;
    vals := r.vals;
    ast := r.ast;
end;
$$;

-- The children of and/or/$and/$or/conjuncts/disjuncts: a non-empty array of at most 1,000 nodes.
create or replace function agentdb_internal.filter_parse_list(
    ctx jsonb, v jsonb, path text, depth int, label text, inout nodes int, inout vals int, out asts jsonb[]
) language plpgsql stable as $$
declare
    i int;
    r record;
begin
    asts := '{}';
    if jsonb_typeof(v) is distinct from 'array' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, format('%s needs an array of filters', label));
    end if;
    if jsonb_array_length(v) = 0 then
        perform agentdb_internal.filter_fail(ctx, 'empty', path, format('%s needs at least one filter', label));
    end if;
    if jsonb_array_length(v) > 1000 then
        perform agentdb_internal.filter_fail(ctx, 'too_many_items', path, format('%s has more than 1000 items', label));
    end if;
    for i in 0 .. jsonb_array_length(v) - 1 loop
        r := agentdb_internal.filter_parse(ctx, v->i, path || '[' || i || ']', depth + 1, nodes, vals);
        nodes := r.nodes;
        vals := r.vals;
        asts := array_append(asts, r.ast);
    end loop;
end;
$$;

-- A Tryll operand: {"knowledge": "<field>"} -> {"field": spec}, {"value": literal} -> {"value": literal}.
create or replace function agentdb_internal.filter_operand(ctx jsonb, o jsonb, path text) returns jsonb
language plpgsql stable as $$
begin
    -- Exactly one key, and it is knowledge or value.
    if jsonb_typeof(o) is distinct from 'object'
       or (case when jsonb_typeof(o) = 'object'
                then o - array['knowledge', 'value'] <> '{}'::jsonb or (o ? 'knowledge') = (o ? 'value') end) then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path,
            'an operand is {"knowledge": "<field>"} or {"value": <literal>}');
    end if;
    if o ? 'knowledge' then
        return jsonb_build_object('field', agentdb_internal.filter_field(ctx, o->'knowledge', path));
    end if;
    return jsonb_build_object('value', o->'value');
end;
$$;

-- Tryll op nodes: and/or (args), not (arg), eq ne lt le gt ge (lhs, rhs), in (needle, haystack).
create or replace function agentdb_internal.filter_parse_tryll(
    ctx jsonb, node jsonb, path text, depth int, inout nodes int, inout vals int, out ast jsonb
) language plpgsql stable as $$
declare
    op text;
    allowed text[];
    extra text;
    l jsonb;
    r jsonb;
    x record;
    op_path text := agentdb_internal.filter_key(path, 'op');
begin
    if jsonb_typeof(node->'op') is distinct from 'string' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operator', op_path, 'op must be a string');
    end if;
    op := node->>'op';
    allowed := case
        when op in ('and', 'or') then array['op', 'args']
        when op = 'not' then array['op', 'arg']
        when op in ('eq', 'ne', 'lt', 'le', 'gt', 'ge') then array['op', 'lhs', 'rhs']
        when op = 'in' then array['op', 'needle', 'haystack']
    end;
    if allowed is null then
        perform agentdb_internal.filter_fail(ctx, 'bad_operator', op_path,
            format('unknown op %s: use and, or, not, eq, ne, lt, le, gt, ge or in', to_jsonb(op)));
    end if;
    extra := agentdb_internal.filter_extra_key(node, allowed);
    if extra is not null then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', agentdb_internal.filter_key(path, extra),
            format('unexpected key %s in an %s node', to_jsonb(extra), op));
    end if;
    if not (node ?& allowed) then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path,
            format('%s needs %s', op, array_to_string(allowed[2:], ' and ')));
    end if;

    if op in ('and', 'or') then
        x := agentdb_internal.filter_parse_list(ctx, node->'args', agentdb_internal.filter_key(path, 'args'), depth, op, nodes, vals);
        nodes := x.nodes;
        vals := x.vals;
        ast := case when cardinality(x.asts) = 1 then x.asts[1] else jsonb_build_object('t', op, 'args', x.asts) end;
        return;
    elsif op = 'not' then
        x := agentdb_internal.filter_parse(ctx, node->'arg', agentdb_internal.filter_key(path, 'arg'), depth + 1, nodes, vals);
        nodes := x.nodes;
        vals := x.vals;
        ast := jsonb_build_object('t', 'not', 'arg', x.ast);
        return;
    elsif op = 'in' then
        l := agentdb_internal.filter_operand(ctx, node->'needle', agentdb_internal.filter_key(path, 'needle'));
        r := agentdb_internal.filter_operand(ctx, node->'haystack', agentdb_internal.filter_key(path, 'haystack'));
        if l ? 'field' and r ? 'value' then
            if jsonb_typeof(r->'value') is distinct from 'array' then
                perform agentdb_internal.filter_fail(ctx, 'bad_operand', agentdb_internal.filter_key(path, 'haystack'),
                    'the haystack must be an array literal or a string_set field');
            end if;
            x := agentdb_internal.filter_leaf(ctx, 'in', l->'field', r->'value', op_path,
                                     agentdb_internal.filter_key(path, 'haystack'), 'in', vals);
        elsif l ? 'value' and r ? 'field' then
            if r->'field'->>'type' <> 'string_set' then
                perform agentdb_internal.filter_fail(ctx, 'bad_operand', agentdb_internal.filter_key(path, 'haystack'),
                    'the haystack must be an array literal or a string_set field');
            end if;
            x := agentdb_internal.filter_leaf(ctx, 'contains', r->'field', l->'value', op_path,
                                     agentdb_internal.filter_key(path, 'needle'), 'in', vals);
        elsif l ? 'field' then
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', agentdb_internal.filter_key(path, 'haystack'),
                'compare a field with values, not with another field');
        else
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', agentdb_internal.filter_key(path, 'needle'),
                'the needle or the haystack must be a field: {"knowledge": "<field>"}');
        end if;
    else
        l := agentdb_internal.filter_operand(ctx, node->'lhs', agentdb_internal.filter_key(path, 'lhs'));
        r := agentdb_internal.filter_operand(ctx, node->'rhs', agentdb_internal.filter_key(path, 'rhs'));
        if l ? 'field' and r ? 'value' then
            x := agentdb_internal.filter_leaf(ctx, op, l->'field', r->'value', op_path,
                                     agentdb_internal.filter_key(path, 'rhs'), op, vals);
        elsif l ? 'value' and r ? 'field' then
            -- `value op field` is `field op' value` with the comparison mirrored.
            x := agentdb_internal.filter_leaf(ctx,
                case op when 'lt' then 'gt' when 'le' then 'ge' when 'gt' then 'lt' when 'ge' then 'le' else op end,
                r->'field', l->'value', op_path, agentdb_internal.filter_key(path, 'lhs'), op, vals);
        elsif l ? 'field' then
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', agentdb_internal.filter_key(path, 'rhs'),
                'compare a field with a value, not with another field');
        else
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', agentdb_internal.filter_key(path, 'lhs'),
                'one side must be a field: {"knowledge": "<field>"}');
        end if;
    end if;
    -- A comparison or an in leaf.
    vals := x.vals;
    ast := x.ast;
end;
$$;

-- Document ids for {"ids": [...]}: an array of at most 1,000 strings, counted in the filter's list items.
create or replace function agentdb_internal.filter_ids(ctx jsonb, v jsonb, path text, inout vals int, out ast jsonb)
language plpgsql stable as $$
declare
    i int;
    bad jsonb;
begin
    if jsonb_typeof(v) is distinct from 'array' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, 'ids needs an array of document ids');
    end if;
    if jsonb_array_length(v) > 1000 then
        perform agentdb_internal.filter_fail(ctx, 'too_many_items', path, 'ids has more than 1000 items');
    end if;
    vals := agentdb_internal.filter_spend(ctx, path, vals, jsonb_array_length(v));
    if jsonb_path_exists(v, 'strict $[*] ? (@.type() != "string")') then
        select o - 1, e into i, bad
        from jsonb_array_elements(v) with ordinality x(e, o) where jsonb_typeof(e) <> 'string' order by o limit 1;
        perform agentdb_internal.filter_fail(ctx, 'type_mismatch', path || '[' || i || ']',
            format('cannot compare %s with a document id (string)', agentdb_internal.filter_kind(bad)));
    end if;
    ast := jsonb_build_object('t', 'ids', 'v', v);
end;
$$;

-- A numeric range {"field", "min", "max", "inclusive_min" (default true), "inclusive_max" (default false)}
-- or a date range {"field", "start", "end", "inclusive_start" (true), "inclusive_end" (false)}, as in Bleve.
create or replace function agentdb_internal.filter_parse_range(ctx jsonb, node jsonb, path text, is_numeric boolean)
returns jsonb language plpgsql stable as $$
declare
    label text := case when is_numeric then 'numeric range' else 'date range' end;
    lo_key text := case when is_numeric then 'min' else 'start' end;
    hi_key text := case when is_numeric then 'max' else 'end' end;
    allowed text[] := array['field', lo_key, hi_key, 'inclusive_' || lo_key, 'inclusive_' || hi_key];
    extra text;
    spec jsonb;
    k text;
    lo_inc boolean := true;
    hi_inc boolean := false;
    items jsonb[] := '{}';
begin
    extra := agentdb_internal.filter_extra_key(node, allowed);
    if extra is not null then
        perform agentdb_internal.filter_fail(ctx, 'bad_operator', agentdb_internal.filter_key(path, extra),
            format('unexpected key %s in a %s query', to_jsonb(extra), label));
    end if;
    if not node ? 'field' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, format('a %s needs a field', label));
    end if;
    spec := agentdb_internal.filter_field(ctx, node->'field', agentdb_internal.filter_key(path, 'field'));
    if is_numeric and spec->>'type' not in ('int', 'float') or not is_numeric and spec->>'type' <> 'timestamp' then
        perform agentdb_internal.filter_fail(ctx, 'type_mismatch', agentdb_internal.filter_key(path, 'field'),
            format('a %s needs %s field; %s is %s', label,
                   case when is_numeric then 'an int or float' else 'a timestamp' end,
                   to_jsonb(spec->>'name'), spec->>'type'));
    end if;
    foreach k in array allowed[4:5] loop
        if coalesce(jsonb_typeof(node->k), 'null') not in ('null', 'boolean') then
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', agentdb_internal.filter_key(path, k),
                format('%s must be true or false', k));
        end if;
    end loop;
    lo_inc := coalesce((node->>allowed[4])::boolean, true);
    hi_inc := coalesce((node->>allowed[5])::boolean, false);
    if coalesce(jsonb_typeof(node->lo_key), 'null') = 'null' and coalesce(jsonb_typeof(node->hi_key), 'null') = 'null' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, format('a %s needs %s or %s', label, lo_key, hi_key));
    end if;
    if coalesce(jsonb_typeof(node->lo_key), 'null') <> 'null' then
        -- A bound is a single value, not a list: no list items to count.
        items := items || (agentdb_internal.filter_leaf(ctx, case when lo_inc then 'ge' else 'gt' end,
            spec, node->lo_key, agentdb_internal.filter_key(path, lo_key), agentdb_internal.filter_key(path, lo_key), lo_key, 0)).ast;
    end if;
    if coalesce(jsonb_typeof(node->hi_key), 'null') <> 'null' then
        items := items || (agentdb_internal.filter_leaf(ctx, case when hi_inc then 'le' else 'lt' end,
            spec, node->hi_key, agentdb_internal.filter_key(path, hi_key), agentdb_internal.filter_key(path, hi_key), hi_key, 0)).ast;
    end if;
    return agentdb_internal.filter_and(items);
end;
$$;

-- One clause of a bool query: a query or a list of queries (at most 1,000; an empty list is no clause).
create or replace function agentdb_internal.filter_parse_clause(
    ctx jsonb, v jsonb, path text, depth int, inout nodes int, inout vals int, out asts jsonb[]
) language plpgsql stable as $$
declare
    i int;
    r record;
begin
    asts := '{}';
    if v is null then
        return;
    elsif jsonb_typeof(v) = 'object' then
        r := agentdb_internal.filter_parse(ctx, v, path, depth + 1, nodes, vals);
        nodes := r.nodes;
        vals := r.vals;
        asts := array[r.ast];
    elsif jsonb_typeof(v) = 'array' then
        if jsonb_array_length(v) > 1000 then
            perform agentdb_internal.filter_fail(ctx, 'too_many_items', path, 'the clause has more than 1000 items');
        end if;
        for i in 0 .. jsonb_array_length(v) - 1 loop
            r := agentdb_internal.filter_parse(ctx, v->i, path || '[' || i || ']', depth + 1, nodes, vals);
            nodes := r.nodes;
            vals := r.vals;
            asts := array_append(asts, r.ast);
        end loop;
    else
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, 'expected a query or a list of queries');
    end if;
end;
$$;

-- A bool query {must, should, must_not, filter, minimum_should_match}. As in Elasticsearch, `should`
-- needs at least one match when there is no must/filter clause and minimum_should_match is not given.
create or replace function agentdb_internal.filter_parse_bool(
    ctx jsonb, node jsonb, path text, depth int, inout nodes int, inout vals int, out ast jsonb
) language plpgsql stable as $$
declare
    allowed constant text[] := array['must', 'should', 'must_not', 'filter', 'minimum_should_match'];
    extra text;
    r record;
    must jsonb[];
    filt jsonb[];
    should jsonb[];
    must_not jsonb[];
    items jsonb[];
    child jsonb;
    n int;
begin
    extra := agentdb_internal.filter_extra_key(node, allowed);
    if extra is not null then
        perform agentdb_internal.filter_fail(ctx, 'bad_operator', agentdb_internal.filter_key(path, extra),
            format('unexpected key %s in a bool query', to_jsonb(extra)));
    end if;
    r := agentdb_internal.filter_parse_clause(ctx, node->'must', agentdb_internal.filter_key(path, 'must'), depth, nodes, vals);
    nodes := r.nodes;
    vals := r.vals;
    must := r.asts;
    r := agentdb_internal.filter_parse_clause(ctx, node->'filter', agentdb_internal.filter_key(path, 'filter'), depth, nodes, vals);
    nodes := r.nodes;
    vals := r.vals;
    filt := r.asts;
    r := agentdb_internal.filter_parse_clause(ctx, node->'should', agentdb_internal.filter_key(path, 'should'), depth, nodes, vals);
    nodes := r.nodes;
    vals := r.vals;
    should := r.asts;
    r := agentdb_internal.filter_parse_clause(ctx, node->'must_not', agentdb_internal.filter_key(path, 'must_not'), depth, nodes, vals);
    nodes := r.nodes;
    vals := r.vals;
    must_not := r.asts;
    if coalesce(jsonb_typeof(node->'minimum_should_match'), 'null') <> 'null' then
        n := agentdb_internal.filter_count(ctx, node->'minimum_should_match',
                                  agentdb_internal.filter_key(path, 'minimum_should_match'), 'minimum_should_match');
    else
        n := case when cardinality(should) > 0 and cardinality(must) + cardinality(filt) = 0 then 1 else 0 end;
    end if;
    items := must || filt;
    foreach child in array must_not loop
        items := array_append(items, jsonb_build_object('t', 'not', 'arg', child));
    end loop;
    if n > 0 then
        items := array_append(items, agentdb_internal.filter_atleast(n, should));
    end if;
    ast := agentdb_internal.filter_and(items);
end;
$$;

-- Query objects (Antfly/Bleve style): term, terms, prefix, numeric and date ranges, conjuncts,
-- disjuncts (at least `min`, default 1), bool (wrapped or not), match_all, match_none, ids, doc_id.
create or replace function agentdb_internal.filter_parse_query(
    ctx jsonb, node jsonb, path text, depth int, inout nodes int, inout vals int, out ast jsonb
) language plpgsql stable as $$
declare
    kind text;
    allowed text[];
    extra text;
    spec jsonb;
    r record;
    n int;
    kp text;
begin
    kind := case
        when node ? 'match_all' then 'match_all'
        when node ? 'match_none' then 'match_none'
        when node ? 'ids' then 'ids'
        when node ? 'doc_id' then 'doc_id'
        when node ? 'conjuncts' then 'conjuncts'
        when node ? 'disjuncts' then 'disjuncts'
        when node ? 'bool' then 'bool'
        when node ?| array['must', 'should', 'must_not', 'filter', 'minimum_should_match'] then 'bool_inline'
        when node ? 'term' then 'term'
        when node ? 'terms' then 'terms'
        when node ? 'prefix' then 'prefix'
        when node ? 'numeric_range' then 'numeric_range'
        when node ? 'date_range' then 'date_range'
        when node ?| array['min', 'max', 'inclusive_min', 'inclusive_max'] then 'numeric'
        when node ?| array['start', 'end', 'inclusive_start', 'inclusive_end'] then 'date'
    end;
    if kind is null then
        perform agentdb_internal.filter_fail(ctx, 'bad_operator', path,
            'unknown query: expected term, terms, prefix, a numeric or date range, conjuncts, disjuncts, bool,'
            ' match_all, match_none or ids');
    end if;
    if kind in ('numeric', 'date', 'bool_inline') then
        -- These check their own keys.
        allowed := null;
    else
        allowed := case kind
            when 'disjuncts' then array['disjuncts', 'min']
            when 'term' then array['term', 'field']
            when 'terms' then array['terms', 'field']
            when 'prefix' then array['prefix', 'field']
            else array[kind]
        end;
        extra := agentdb_internal.filter_extra_key(node, allowed);
        if extra is not null then
            perform agentdb_internal.filter_fail(ctx, 'bad_operator', agentdb_internal.filter_key(path, extra),
                format('unexpected key %s in a %s query', to_jsonb(extra), kind));
        end if;
    end if;
    kp := agentdb_internal.filter_key(path, kind);

    if kind in ('match_all', 'match_none') then
        if jsonb_typeof(node->kind) <> 'object' then
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', kp, format('%s takes an empty object {}', kind));
        end if;
        ast := jsonb_build_object('t', 'const', 'v', kind = 'match_all');
    elsif kind = 'ids' then
        r := agentdb_internal.filter_ids(ctx, node->'ids', kp, vals);
        vals := r.vals;
        ast := r.ast;
    elsif kind = 'doc_id' then
        if jsonb_typeof(node->'doc_id') is distinct from 'object' or not node->'doc_id' ? 'ids'
           or (select count(*) from jsonb_object_keys(node->'doc_id')) <> 1 then
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', kp, 'doc_id takes {"ids": ["<id>", ...]}');
        end if;
        r := agentdb_internal.filter_ids(ctx, node->'doc_id'->'ids', agentdb_internal.filter_key(kp, 'ids'), vals);
        vals := r.vals;
        ast := r.ast;
    elsif kind = 'conjuncts' then
        r := agentdb_internal.filter_parse_list(ctx, node->'conjuncts', kp, depth, 'conjuncts', nodes, vals);
        nodes := r.nodes;
        vals := r.vals;
        ast := agentdb_internal.filter_and(r.asts);
    elsif kind = 'disjuncts' then
        r := agentdb_internal.filter_parse_list(ctx, node->'disjuncts', kp, depth, 'disjuncts', nodes, vals);
        nodes := r.nodes;
        vals := r.vals;
        n := 1;
        if coalesce(jsonb_typeof(node->'min'), 'null') <> 'null' then
            n := agentdb_internal.filter_count(ctx, node->'min', agentdb_internal.filter_key(path, 'min'), 'min');
        end if;
        ast := agentdb_internal.filter_atleast(n, r.asts);
    elsif kind = 'bool' then
        if jsonb_typeof(node->'bool') <> 'object' then
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', kp, 'bool takes an object {must, should, must_not, filter}');
        end if;
        r := agentdb_internal.filter_parse_bool(ctx, node->'bool', kp, depth, nodes, vals);
        nodes := r.nodes;
        vals := r.vals;
        ast := r.ast;
    elsif kind = 'bool_inline' then
        r := agentdb_internal.filter_parse_bool(ctx, node, path, depth, nodes, vals);
        nodes := r.nodes;
        vals := r.vals;
        ast := r.ast;
    elsif kind in ('term', 'terms', 'prefix') then
        if not node ? 'field' then
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', path, format('a %s query needs a field', kind));
        end if;
        spec := agentdb_internal.filter_field(ctx, node->'field', agentdb_internal.filter_key(path, 'field'));
        r := agentdb_internal.filter_leaf(ctx, case kind when 'term' then 'eq' when 'terms' then 'in' else 'prefix' end,
                                 spec, node->kind, kp, kp, kind, vals);
        vals := r.vals;
        ast := r.ast;
    elsif kind in ('numeric_range', 'date_range') then
        if jsonb_typeof(node->kind) is distinct from 'object' then
            perform agentdb_internal.filter_fail(ctx, 'bad_operand', kp, format('%s takes an object with a field', kind));
        end if;
        ast := agentdb_internal.filter_parse_range(ctx, node->kind, kp, kind = 'numeric_range');
    else
        ast := agentdb_internal.filter_parse_range(ctx, node, path, kind = 'numeric');
    end if;
end;
$$;

-- Operator objects (vector-store style): keys are field names or $and/$or/$not, all ANDed.
create or replace function agentdb_internal.filter_parse_object(
    ctx jsonb, node jsonb, path text, depth int, inout nodes int, inout vals int, out ast jsonb
) language plpgsql stable as $$
declare
    k text;
    v jsonb;
    kp text;
    spec jsonb;
    r record;
    items jsonb[] := '{}';
begin
    for k, v in select e.key, e.value from jsonb_each(node) e loop
        kp := agentdb_internal.filter_key(path, k);
        if k in ('$and', '$or') then
            r := agentdb_internal.filter_parse_list(ctx, v, kp, depth, k, nodes, vals);
            nodes := r.nodes;
            vals := r.vals;
            items := array_append(items, case
                when cardinality(r.asts) = 1 then r.asts[1]
                else jsonb_build_object('t', substr(k, 2), 'args', r.asts) end);
        elsif k = '$not' then
            if jsonb_typeof(v) is distinct from 'object' then
                perform agentdb_internal.filter_fail(ctx, 'bad_operand', kp, '$not needs a filter object');
            end if;
            r := agentdb_internal.filter_parse(ctx, v, kp, depth + 1, nodes, vals);
            nodes := r.nodes;
            vals := r.vals;
            items := array_append(items, jsonb_build_object('t', 'not', 'arg', r.ast));
        elsif left(k, 1) = '$' then
            if k in ('$eq', '$ne', '$gt', '$gte', '$lt', '$lte', '$in', '$nin', '$exists', '$contains') then
                perform agentdb_internal.filter_fail(ctx, 'bad_operator', kp,
                    format('%s needs a field: {"<field>": {"%s": ...}}', k, k));
            end if;
            perform agentdb_internal.filter_fail(ctx, 'bad_operator', kp,
                format('unknown operator %s: use $and, $or, $not or a field name', to_jsonb(k)));
        else
            spec := agentdb_internal.filter_field(ctx, to_jsonb(k), kp);
            nodes := agentdb_internal.filter_enter(ctx, kp, depth + 1, nodes);
            r := agentdb_internal.filter_parse_condition(ctx, spec, v, kp, depth + 1, nodes, vals);
            nodes := r.nodes;
            vals := r.vals;
            items := array_append(items, r.ast);
        end if;
    end loop;
    ast := agentdb_internal.filter_and(items);
end;
$$;

-- The condition on one field in an operator object: a bare value ($eq) or an object of operators
-- ($eq $ne $gt $gte $lt $lte $in $nin $exists $contains $not), ANDed.
create or replace function agentdb_internal.filter_parse_condition(
    ctx jsonb, spec jsonb, v jsonb, path text, depth int, inout nodes int, inout vals int, out ast jsonb
) language plpgsql stable as $$
declare
    op text;
    ov jsonb;
    op_path text;
    child jsonb;
    r record;
    items jsonb[] := '{}';
begin
    if jsonb_typeof(v) = 'array' then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path,
            'an array literal is only allowed as the list of $in or $nin');
    elsif jsonb_typeof(v) is distinct from 'object' then
        ast := (agentdb_internal.filter_leaf(ctx, 'eq', spec, v, path, path, '$eq', vals)).ast;
        return;
    end if;
    if v = '{}'::jsonb then
        perform agentdb_internal.filter_fail(ctx, 'empty', path, 'the condition has no operator');
    end if;
    if jsonb_path_exists(v, 'strict $.keyvalue() ? (!(@.key starts with "$"))') then
        perform agentdb_internal.filter_fail(ctx, 'bad_operand', path,
            'an object value must hold operators such as {"$eq": ...}');
    end if;
    for op, ov in select e.key, e.value from jsonb_each(v) e loop
        op_path := agentdb_internal.filter_key(path, op);
        if op in ('$eq', '$ne', '$gt', '$gte', '$lt', '$lte') then
            child := (agentdb_internal.filter_leaf(ctx,
                case op when '$eq' then 'eq' when '$ne' then 'ne' when '$gt' then 'gt' when '$gte' then 'ge'
                        when '$lt' then 'lt' else 'le' end,
                spec, ov, op_path, op_path, op, vals)).ast;
        elsif op in ('$in', '$nin') then
            r := agentdb_internal.filter_leaf(ctx, substr(op, 2), spec, ov, op_path, op_path, op, vals);
            vals := r.vals;
            child := r.ast;
        elsif op = '$contains' then
            child := (agentdb_internal.filter_leaf(ctx, 'contains', spec, ov, op_path, op_path, op, vals)).ast;
        elsif op = '$exists' then
            if jsonb_typeof(ov) is distinct from 'boolean' then
                perform agentdb_internal.filter_fail(ctx, 'bad_operand', op_path, '$exists takes true or false');
            end if;
            child := jsonb_build_object('t', 'exists', 'f', spec->>'name');
            if not (ov::text)::boolean then
                child := jsonb_build_object('t', 'not', 'arg', child);
            end if;
        elsif op = '$not' then
            nodes := agentdb_internal.filter_enter(ctx, op_path, depth + 1, nodes);
            r := agentdb_internal.filter_parse_condition(ctx, spec, ov, op_path, depth + 1, nodes, vals);
            nodes := r.nodes;
            vals := r.vals;
            child := jsonb_build_object('t', 'not', 'arg', r.ast);
        elsif op in ('$and', '$or') then
            perform agentdb_internal.filter_fail(ctx, 'bad_operator', op_path,
                format('%s is not allowed inside a field condition; put it at the filter level', op));
        else
            perform agentdb_internal.filter_fail(ctx, 'bad_operator', op_path, format('unknown operator %s', to_jsonb(op)));
        end if;
        items := array_append(items, child);
    end loop;
    ast := agentdb_internal.filter_and(items);
end;
$$;

-- Compile one leaf to SQL, appending its values to `params`. Metadata fields (no column) are read from
-- c.metadata; equality and $in on them compile to `c.metadata @> ...` (or `@> any (...)`), which the GIN
-- jsonb_path_ops index serves (EXPLAIN shows a Bitmap Index Scan once the index's pending list has been
-- flushed by VACUUM; right after a bulk insert the planner may prefer a seq scan). Containment compares
-- numbers numerically (3 = 3.0), and it is not wrapped in coalesce: c.metadata is NOT NULL in document
-- tables, so it is already two-valued, and coalesce() would hide it from the index. It is used only when
-- a row lacking the key cannot match (no default, or the default is not among the values), so it agrees
-- with the default-aware comparison. Every other metadata leaf is coalesce(<typed test>, false).
-- Column fields compare c.<column>; `x op v and x is not null` keeps them two-valued and indexable.
create or replace function agentdb_internal.filter_leaf_sql(
    ctx jsonb, ast jsonb, params_ref text, base int, out pred text, out params jsonb[]
) language plpgsql stable as $$
declare
    t text := ast->>'t';
    op text := ast->>'op';
    spec jsonb := ctx->'fields'->(ast->>'f');
    name text := spec->>'name';
    ftype text := spec->>'type';
    col text := spec->>'column';
    v jsonb := ast->'v';
    dflt jsonb := spec->'default';
    has_default boolean := coalesce(jsonb_typeof(spec->'default'), 'null') <> 'null';
    neg boolean := coalesce((ast->>'neg')::boolean, false);
    sqlop text := case op when 'eq' then '=' when 'ne' then '<>' when 'lt' then '<' when 'le' then '<='
                          when 'gt' then '>' when 'ge' then '>=' end;
    val text;       -- the field's value: jsonb for metadata, typed for a column
    txt text;       -- metadata only: the value as text
    guard text;     -- metadata only: the value is present with the field's JSON type
    typ text;       -- column only: the SQL type values are cast to
    default_listed boolean := false;  -- metadata in leaf only: the default is one of the values
    p text;         -- this leaf's parameter (jsonb)
    pt text;        -- the same, as text
    n int;
begin
    params := '{}';
    if t = 'exists' and has_default then
        pred := 'true';
        return;
    end if;

    if col is null then
        val := format('(c.metadata->%L)', name);
        if has_default then
            n := base + cardinality(params);
            params := array_append(params, dflt);
            val := format('coalesce(nullif(c.metadata->%L, ''null''::jsonb), (%s->%s))', name, params_ref, n);
        end if;
        txt := format('(%s #>> ''{}'')', val);
        guard := format('jsonb_typeof(%s) = %L', val,
            case ftype when 'int' then 'number' when 'float' then 'number' when 'bool' then 'boolean'
                       when 'string_set' then 'array' else 'string' end);
        if t = 'exists' then
            pred := format('coalesce(%s, false)', guard);
            return;
        end if;
        -- Is the default among the values of an in leaf? (v @> [dflt] compares numbers by value, as = does.)
        if t = 'in' and has_default then
            if ftype = 'string_set' then
                default_listed := exists (select 1 from jsonb_array_elements(v) e where dflt @> jsonb_build_array(e));
            else
                default_listed := v @> jsonb_build_array(dflt);
            end if;
        end if;
        -- The parameter: a containment document where the index can serve the leaf, else the value(s).
        n := base + cardinality(params);
        p := format('(%s->%s)', params_ref, n);
        pt := format('(%s->>%s)', params_ref, n);
        if (t = 'cmp' and op = 'eq' or t = 'contains') and ftype = 'string_set' then
            if not has_default or not dflt @> jsonb_build_array(v) then
                params := array_append(params, jsonb_build_object(name, jsonb_build_array(v)));
                pred := format('(c.metadata @> %s)', p);
            else
                params := array_append(params, jsonb_build_array(v));
                pred := format('coalesce(%s and %s @> %s, false)', guard, val, p);
            end if;
        elsif t = 'cmp' and op = 'eq' and ftype <> 'timestamp' and (not has_default or dflt <> v) then
            params := array_append(params, jsonb_build_object(name, v));
            pred := format('(c.metadata @> %s)', p);
        elsif t = 'in' and not neg and ftype <> 'timestamp' and not default_listed then
            params := array_append(params, to_jsonb(array(
                select jsonb_build_object(name, case when ftype = 'string_set' then jsonb_build_array(e) else e end)
                from jsonb_array_elements(v) e)));
            pred := format('(c.metadata @> any (array(select jsonb_array_elements(%s))))', p);
        elsif t = 'cmp' and ftype = 'string_set' then
            -- Only eq (handled above) and ne apply to a set: ne is "present and does not contain".
            params := array_append(params, jsonb_build_array(v));
            pred := format('coalesce(%s and not (%s @> %s), false)', guard, val, p);
        elsif t = 'cmp' and ftype = 'timestamp' then
            params := array_append(params, v);
            pred := format('coalesce(case when %s then %s::timestamptz %s %s::timestamptz end, false)',
                           guard, txt, sqlop, pt);
        elsif t = 'cmp' and ftype = 'string' and op not in ('eq', 'ne') then
            -- Strings order by code point (collation "C"), the same in every database.
            params := array_append(params, v);
            pred := format('coalesce(%s and %s collate "C" %s %s, false)', guard, txt, sqlop, pt);
        elsif t = 'cmp' then
            -- jsonb compares numbers numerically (int and float promote) and strings and booleans exactly.
            params := array_append(params, v);
            pred := format('coalesce(%s and %s %s %s, false)', guard, val, sqlop, p);
        elsif t = 'in' and ftype = 'string_set' then
            params := array_append(params, v);
            pred := format('coalesce(%s and %s(%s ?| array(select jsonb_array_elements_text(%s))), false)',
                           guard, case when neg then 'not ' else '' end, val, p);
        elsif t = 'in' and ftype = 'timestamp' then
            params := array_append(params, v);
            pred := format('coalesce(case when %s then %s(%s::timestamptz = any (array('
                           'select e::timestamptz from jsonb_array_elements_text(%s) e))) end, false)',
                           guard, case when neg then 'not ' else '' end, txt, p);
        elsif t = 'in' then
            params := array_append(params, v);
            pred := format('coalesce(%s and %s(%s = any (array(select jsonb_array_elements(%s)))), false)',
                           guard, case when neg then 'not ' else '' end, val, p);
        elsif t = 'contains' then
            params := array_append(params, v);
            pred := format('coalesce(%s and strpos(%s, %s) > 0, false)', guard, txt, pt);
        elsif t = 'prefix' and ftype = 'string_set' then
            params := array_append(params, v);
            pred := format('coalesce(case when %s then exists (select 1 from jsonb_array_elements_text(%s) e'
                           ' where starts_with(e, %s)) end, false)', guard, val, pt);
        elsif t = 'prefix' then
            params := array_append(params, v);
            pred := format('coalesce(%s and starts_with(%s, %s), false)', guard, txt, pt);
        else
            raise exception 'agentdb_internal.filter_leaf_sql: unexpected leaf %', ast;
        end if;
        return;
    end if;

    -- A column of a registered table.
    typ := case ftype
        when 'int' then 'numeric' when 'float' then 'float8' when 'bool' then 'boolean'
        when 'timestamp' then 'timestamptz' else 'text' end;
    -- Whole numbers compare with an int column as bigint, so that its btree index stays usable.
    if ftype = 'int' and not jsonb_path_exists(case when t = 'in' then v else jsonb_build_array(v) end,
            'strict $[*] ? (@ != @.floor() || @ > 9223372036854775807 || @ < -9223372036854775807)') then
        typ := 'numeric::bigint';
    end if;
    val := format('c.%I', col) || case when ftype = 'string_set' then '::text[]' else '' end;
    if has_default then
        n := base + cardinality(params);
        params := array_append(params, dflt);
        val := format('coalesce(%s, %s)', val, case when ftype = 'string_set'
            then format('array(select jsonb_array_elements_text(%s->%s))', params_ref, n)
            else format('(%s->>%s)::%s', params_ref, n, case when ftype = 'int' then 'numeric' else typ end) end);
    end if;
    if t = 'exists' then
        pred := format('(%s is not null)', val);
        return;
    end if;
    n := base + cardinality(params);
    params := array_append(params, v);
    p := format('(%s->%s)', params_ref, n);
    pt := format('(%s->>%s)', params_ref, n);
    if ftype = 'string_set' and (t = 'contains' or t = 'cmp' and op = 'eq') then
        pred := format('(%s @> array[%s] and %s is not null)', val, pt, val);
    elsif ftype = 'string_set' and t = 'cmp' then
        pred := format('(not (%s @> array[%s]) and %s is not null)', val, pt, val);
    elsif ftype = 'string_set' and t = 'in' then
        pred := format('(%s(%s && array(select jsonb_array_elements_text(%s))) and %s is not null)',
                       case when neg then 'not ' else '' end, val, p, val);
    elsif ftype = 'string_set' and t = 'prefix' then
        pred := format('(exists (select 1 from unnest(%s) e where starts_with(e, %s)) and %s is not null)',
                       val, pt, val);
    elsif t = 'cmp' and ftype = 'string' and op not in ('eq', 'ne') then
        pred := format('(%s collate "C" %s %s and %s is not null)', val, sqlop, pt, val);
    elsif t = 'cmp' then
        pred := format('(%s %s %s::%s and %s is not null)', val, sqlop, pt, typ, val);
    elsif t = 'in' then
        pred := format('(%s(%s = any (array(select e::%s from jsonb_array_elements_text(%s) e))) and %s is not null)',
                       case when neg then 'not ' else '' end, val, typ, p, val);
    elsif t = 'contains' then
        pred := format('(strpos(%s, %s) > 0 and %s is not null)', val, pt, val);
    elsif t = 'prefix' then
        pred := format('(starts_with(%s, %s) and %s is not null)', val, pt, val);
    else
        raise exception 'agentdb_internal.filter_leaf_sql: unexpected leaf %', ast;
    end if;
end;
$$;

-- Compile an AST to SQL over the row alias `c`. Returns the values of this subtree only, which the
-- predicate reads as (params_ref->N) from N = `base` on: the caller appends them after its own `base`
-- values, so each value is copied once per level above it rather than once per leaf of the whole filter.
create or replace function agentdb_internal.filter_sql(
    ctx jsonb, ast jsonb, params_ref text, id_expr text, base int, out pred text, out params jsonb[]
) language plpgsql stable as $$
declare
    t text := ast->>'t';
    parts text[] := '{}';
    args jsonb;
    v jsonb;
    r record;
    i int;
begin
    params := '{}';
    if t = 'const' then
        pred := case when (ast->>'v')::boolean then 'true' else 'false' end;
    elsif t in ('and', 'or', 'atleast') then
        args := ast->'args';
        for i in 0 .. jsonb_array_length(args) - 1 loop
            r := agentdb_internal.filter_sql(ctx, args->i, params_ref, id_expr, base + cardinality(params));
            parts := array_append(parts, r.pred);
            foreach v in array r.params loop
                params := array_append(params, v);
            end loop;
        end loop;
        if t = 'atleast' then
            pred := format('((%s) >= %s)',
                           array_to_string(array(select format('(%s)::int', x) from unnest(parts) x), ' + '),
                           (ast->>'n')::int);
        else
            pred := '(' || array_to_string(parts, ' ' || t || ' ') || ')';
        end if;
    elsif t = 'not' then
        r := agentdb_internal.filter_sql(ctx, ast->'arg', params_ref, id_expr, base);
        pred := format('(not %s)', r.pred);
        params := r.params;
    elsif t = 'ids' then
        params := array[ast->'v'];
        pred := format('((%1$s) = any (array(select jsonb_array_elements_text(%2$s->%3$s))) and (%1$s) is not null)',
                       id_expr, params_ref, base);
    else
        r := agentdb_internal.filter_leaf_sql(ctx, ast, params_ref, base);
        pred := r.pred;
        params := r.params;
    end if;
end;
$$;

-- What the filter parser knows of a source: its `fields` by name, and the prefix of error paths.
create or replace function agentdb_internal.filter_context(fields jsonb, path_prefix text) returns jsonb
language sql immutable as $$
select jsonb_build_object(
    'prefix', coalesce(path_prefix, ''),
    'fields', coalesce((
        select jsonb_object_agg(f->>'name', jsonb_build_object(
            'name', f->>'name',
            'type', f->>'type',
            'filterable', coalesce((f->>'filterable')::boolean, true),
            'column', f->'column',
            'default', f->'default'))
        from jsonb_array_elements(coalesce(fields, '[]'::jsonb)) f
        where jsonb_typeof(f->'name') = 'string'), '{}'::jsonb))
$$;

-- The string that `filter` (any syntax agentdb_internal.compile_filter takes, over `fields`) requires field
-- `field` to equal, or null: agentdb_internal.filter_node_fixed_value of its parsed form. A source distributed by
-- its tenant field reads one shard under it (agentdb.retrieve's tenant routing).
create or replace function agentdb_internal.filter_fixed_value(fields jsonb, filter jsonb, field text) returns text
language plpgsql stable as $$
begin
    if filter is null or filter in ('null'::jsonb, '{}'::jsonb, '""'::jsonb) then
        return null;
    end if;
    return agentdb_internal.filter_node_fixed_value(
        (agentdb_internal.filter_parse(agentdb_internal.filter_context(fields, ''), filter, '', 1, 0, 0)).ast, field);
end;
$$;

-- The string that the parsed filter `node` requires field `field` to equal, so every row it keeps has that
-- value, or null: an equality on it ({"F": "x"}, {"F": {"$eq": "x"}}), an `$in` whose values are all that
-- one string, a conjunction with one such condition among its terms, or a disjunction of which every term
-- requires the same string. Anything else (a negation, a range, an `$in` of two values) fixes nothing.
create or replace function agentdb_internal.filter_node_fixed_value(node jsonb, field text) returns text
language plpgsql immutable as $$
declare
    arg jsonb;
    each text;
    found text;
begin
    case node->>'t'
    when 'cmp' then
        if node->>'op' = 'eq' and node->>'f' = field and jsonb_typeof(node->'v') = 'string' then
            return node->>'v';
        end if;
    when 'in' then
        if not coalesce((node->>'neg')::boolean, false) and node->>'f' = field
           and (select bool_and(jsonb_typeof(x) = 'string') and count(distinct x) = 1
                from jsonb_array_elements(node->'v') x) then
            return node->'v'->>0;
        end if;
    when 'and' then
        for arg in select jsonb_array_elements(node->'args') loop
            found := agentdb_internal.filter_node_fixed_value(arg, field);
            if found is not null then
                return found;
            end if;
        end loop;
    when 'or' then
        for arg in select jsonb_array_elements(node->'args') loop
            each := agentdb_internal.filter_node_fixed_value(arg, field);
            if each is null or each is distinct from coalesce(found, each) then
                return null;
            end if;
            found := each;
        end loop;
        return found;
    else
        null;
    end case;
    return null;
end;
$$;

-- Compile a metadata filter against a source's field schema (agentdb.sources.fields) into a predicate
-- over the row alias `c` and the jsonb array of values it reads as (params_ref->N): the caller binds
-- `params` as `params_ref` in its statement. `id_expr` is trusted SQL naming the document id. An empty
-- filter (SQL NULL, JSON null, {} or "") is `true`. A filter that does not validate raises 3007
-- InvalidParamValue with the path `path_prefix.<path inside the filter>`, before any row is read.
create or replace function agentdb_internal.compile_filter(
    fields jsonb, filter jsonb, params_ref text, id_expr text, path_prefix text default 'filter'
) returns table (predicate text, params jsonb) language plpgsql stable as $$
declare
    ctx jsonb;
    parsed record;
    compiled record;
begin
    if filter is null or filter in ('null'::jsonb, '{}'::jsonb, '""'::jsonb) then
        predicate := 'true';
        params := '[]'::jsonb;
        return next;
        return;
    end if;
    ctx := agentdb_internal.filter_context(compile_filter.fields, path_prefix);
    -- The size as jsonb (pg_column_size reads the header, whatever the size): long strings are user input too.
    if pg_column_size(filter) > 1048576 then
        perform agentdb_internal.filter_fail(ctx, 'too_large', '', 'the filter is larger than 1048576 bytes');
    end if;
    parsed := agentdb_internal.filter_parse(ctx, filter, '', 1, 0, 0);
    compiled := agentdb_internal.filter_sql(ctx, parsed.ast, params_ref, id_expr, 0);
    predicate := compiled.pred;
    params := to_jsonb(compiled.params);
    return next;
end;
$$;
