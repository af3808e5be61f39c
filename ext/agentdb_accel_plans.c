/*
 * agentdb_accel plans: a statement prepared once per backend and executed with bound values.
 *
 * agentdb.retrieve (sql/040_retrieve.sql) builds one statement whose text depends only on the shape of the
 * request (mode, fusion, filter shape, the relation read) and binds every value as $1..$n. Run by PL/pgSQL's
 * EXECUTE, that text is parsed, analysed and planned on every call. execute_cached keeps it prepared instead:
 * SPI_prepare_cursor + SPI_keepplan, in a backend-local table keyed by the text, the argument types and the plan
 * choice, and executes it with SPI_execute_plan under the caller's snapshot and role, returning its one row. The
 * caller chooses the plan: generic (planned once for all values: CURSOR_OPT_GENERIC_PLAN), or PostgreSQL's
 * choice under plan_cache_mode (by default custom plans for the values of each call, until a generic plan is
 * estimated to cost no more than they did).
 *
 * What a kept plan depends on is PostgreSQL's plan cache's to track, as for any prepared statement: a change to
 * a table, a view, a policy or a function the statement uses (DDL, from any session), a different search_path,
 * and for a statement under row-level security a different role, each makes the next execution analyse and
 * plan the text again. Privileges are checked at every execution. Planner settings are not part of a plan's
 * identity: a caller that plans the same text under different settings must put them in the text.
 *
 * The table is bounded: at most MAX_PLANS statements and MAX_PLAN_BYTES of plan memory (each statement's
 * queries and generic plan, measured after each execution); beyond either the least recently executed
 * statements are dropped, and a statement whose key collides with another's replaces it. A statement being
 * executed (a nested call) is never dropped. An error while preparing keeps nothing; an error while executing
 * leaves the statement prepared and unchanged (the plan cache revalidates it at its next use).
 */
#include "postgres.h"

#include "catalog/pg_type_d.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "executor/spi_priv.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/ilist.h"
#include "nodes/parsenodes.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/plancache.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(agentdb_accel_execute_cached);
PG_FUNCTION_INFO_V1(agentdb_accel_cached_plans);

/* The bounds of the table (cached_plans() shows each statement's memory). */
#define MAX_PLANS 64
#define MAX_PLAN_BYTES (32 * 1024 * 1024)

/* The longest statement kept (a longer one is executed without being kept). */
#define MAX_TEXT_BYTES (1024 * 1024)

typedef struct PlanEntry
{
	uint64		key;			/* hash of the text, the argument types and the plan choice (the table's key) */
	char	   *text;			/* the statement, in PlanContext */
	bool		generic;		/* planned once for all values (CURSOR_OPT_GENERIC_PLAN) */
	int			nargs;
	Oid		   *argtypes;		/* in PlanContext */
	SPIPlanPtr	plan;			/* kept (SPI_keepplan): a child of CacheMemoryContext */
	Size		bytes;			/* its memory as last measured */
	int64		executions;
	int			active;			/* executions under way (nested calls) */
	dlist_node	lru;			/* in Lru, the most recently executed first */
} PlanEntry;

static MemoryContext PlanContext = NULL;
static HTAB *Plans = NULL;
static dlist_head Lru = DLIST_STATIC_INIT(Lru);
static int	NPlans = 0;
static Size PlanBytes = 0;

static void
init_table(void)
{
	HASHCTL		ctl;

	if (Plans != NULL)
		return;
	PlanContext = AllocSetContextCreate(TopMemoryContext, "agentdb_accel plans", ALLOCSET_SMALL_SIZES);
	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(PlanEntry);
	ctl.hcxt = PlanContext;
	Plans = hash_create("agentdb_accel plans", MAX_PLANS * 2, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

static uint64
plan_key(const char *text, int len, bool generic, int nargs, const Oid *argtypes)
{
	uint64		key = hash_bytes_extended((const unsigned char *) text, len, generic ? 1 : 0);

	if (nargs > 0)
		key ^= hash_bytes_extended((const unsigned char *) argtypes, nargs * sizeof(Oid), key);
	return key;
}

/* The memory a kept plan holds: each query's source (its parse trees) and generic plan if built. */
static Size
plan_bytes(SPIPlanPtr plan)
{
	Size		bytes = MemoryContextMemAllocated(plan->plancxt, true);
	ListCell   *lc;

	foreach(lc, plan->plancache_list)
	{
		CachedPlanSource *source = (CachedPlanSource *) lfirst(lc);

		bytes += MemoryContextMemAllocated(source->context, true);
		if (source->gplan != NULL)
			bytes += MemoryContextMemAllocated(source->gplan->context, true);
	}
	return bytes;
}

static void
drop_entry(PlanEntry *entry)
{
	Assert(entry->active == 0);
	dlist_delete(&entry->lru);
	NPlans--;
	PlanBytes -= entry->bytes;
	SPI_freeplan(entry->plan);
	pfree(entry->text);
	if (entry->argtypes != NULL)
		pfree(entry->argtypes);
	hash_search(Plans, &entry->key, HASH_REMOVE, NULL);
}

/* Drop the least recently executed statements not under way while the table is over its bounds. */
static void
evict(void)
{
	dlist_node *node = dlist_is_empty(&Lru) ? NULL : dlist_tail_node(&Lru);

	while (node != NULL && (NPlans > MAX_PLANS || PlanBytes > MAX_PLAN_BYTES))
	{
		PlanEntry  *entry = dlist_container(PlanEntry, lru, node);

		node = dlist_has_prev(&Lru, node) ? dlist_prev_node(&Lru, node) : NULL;
		if (entry->active == 0)
			drop_entry(entry);
	}
}

/*
 * The kept statement for `text` with these argument types and plan choice, prepared and kept now if it is not there. Null when it
 * cannot be kept (too long, or its key's place is held by another statement under way): the caller then executes
 * it unkept.
 */
static PlanEntry *
lookup_or_prepare(const char *text, int len, bool generic, int nargs, Oid *argtypes)
{
	uint64		key = plan_key(text, len, generic, nargs, argtypes);
	PlanEntry  *entry;
	SPIPlanPtr	plan;
	bool		found;

	if (len > MAX_TEXT_BYTES)
		return NULL;
	entry = (PlanEntry *) hash_search(Plans, &key, HASH_FIND, NULL);
	if (entry != NULL)
	{
		if (entry->generic == generic && entry->nargs == nargs && strcmp(entry->text, text) == 0
			&& (nargs == 0 || memcmp(entry->argtypes, argtypes, nargs * sizeof(Oid)) == 0))
			return entry;
		if (entry->active > 0)
			return NULL;
		drop_entry(entry);		/* a collision: the newer statement takes the place */
	}

	/* Prepared (the text parsed and analysed) before anything is recorded: an error here keeps nothing. */
	plan = SPI_prepare_cursor(text, nargs, argtypes,
							  CURSOR_OPT_PARALLEL_OK | (generic ? CURSOR_OPT_GENERIC_PLAN : 0));
	if (plan == NULL)
		elog(ERROR, "SPI_prepare_cursor failed: %s", SPI_result_code_string(SPI_result));
	if (list_length(plan->plancache_list) != 1)
		ereport(ERROR, (errcode(ERRCODE_SYNTAX_ERROR), errmsg("execute_cached runs exactly one statement")));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");

	PG_TRY();
	{
		char	   *text_copy = MemoryContextStrdup(PlanContext, text);
		Oid		   *types_copy = NULL;

		if (nargs > 0)
		{
			types_copy = MemoryContextAlloc(PlanContext, nargs * sizeof(Oid));
			memcpy(types_copy, argtypes, nargs * sizeof(Oid));
		}
		entry = (PlanEntry *) hash_search(Plans, &key, HASH_ENTER, &found);
		Assert(!found);
		entry->text = text_copy;
		entry->generic = generic;
		entry->nargs = nargs;
		entry->argtypes = types_copy;
	}
	PG_CATCH();
	{
		SPI_freeplan(plan);
		PG_RE_THROW();
	}
	PG_END_TRY();
	entry->plan = plan;
	entry->bytes = plan_bytes(plan);
	entry->executions = 0;
	entry->active = 0;
	dlist_push_head(&Lru, &entry->lru);
	NPlans++;
	PlanBytes += entry->bytes;
	return entry;
}

/*
 * execute_cached(statement text, generic_plan boolean, VARIADIC args "any") returns record: the one row of
 * `statement` with args bound as $1..$n (typed as they are passed; an unknown literal as text), prepared once per
 * backend, with a generic plan when generic_plan, else as plan_cache_mode chooses. The caller names the row's
 * columns and their types (a column definition list), which must be the statement's.
 */
Datum
agentdb_accel_execute_cached(PG_FUNCTION_ARGS)
{
	MemoryContext callcxt = CurrentMemoryContext;
	TupleDesc	want;
	text	   *stmt_text;
	char	   *stmt;
	bool		generic;
	int			nargs = PG_NARGS() - 2;
	Oid		   *argtypes;
	Datum	   *values;
	char	   *nulls;
	PlanEntry  *entry;
	HeapTuple	row;
	TupleDesc	got;
	int			rc;
	int			i;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						errmsg("the statement and the plan choice must not be null")));
	if (get_fn_expr_variadic(fcinfo->flinfo))
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						errmsg("execute_cached takes its values as separate arguments, not a VARIADIC array")));
	if (get_call_result_type(fcinfo, NULL, &want) != TYPEFUNC_COMPOSITE)
		ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						errmsg("execute_cached must be called with a column definition list")));
	stmt_text = PG_GETARG_TEXT_PP(0);
	stmt = text_to_cstring(stmt_text);
	generic = PG_GETARG_BOOL(1);

	argtypes = palloc(Max(nargs, 1) * sizeof(Oid));
	values = palloc(Max(nargs, 1) * sizeof(Datum));
	nulls = palloc(Max(nargs, 1) * sizeof(char));
	for (i = 0; i < nargs; i++)
	{
		Oid			type = get_fn_expr_argtype(fcinfo->flinfo, i + 2);

		if (!OidIsValid(type))
			elog(ERROR, "could not determine the type of argument %d", i + 3);
		nulls[i] = PG_ARGISNULL(i + 2) ? 'n' : ' ';
		values[i] = PG_ARGISNULL(i + 2) ? (Datum) 0 : PG_GETARG_DATUM(i + 2);
		if (type == UNKNOWNOID)
		{
			/* as PL/pgSQL's EXECUTE ... USING binds an untyped literal */
			type = TEXTOID;
			if (!PG_ARGISNULL(i + 2))
				values[i] = CStringGetTextDatum(DatumGetCString(values[i]));
		}
		argtypes[i] = type;
	}

	init_table();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	entry = lookup_or_prepare(stmt, strlen(stmt), generic, nargs, argtypes);
	if (entry == NULL)
		rc = SPI_execute_with_args(stmt, nargs, argtypes, values, nulls, false, 0);
	else
	{
		dlist_move_head(&Lru, &entry->lru);
		entry->active++;
		PG_TRY();
		{
			rc = SPI_execute_plan(entry->plan, values, nulls, false, 0);
		}
		PG_FINALLY();
		{
			entry->active--;
		}
		PG_END_TRY();
		entry->executions++;
		PlanBytes -= entry->bytes;
		entry->bytes = plan_bytes(entry->plan);
		PlanBytes += entry->bytes;
	}
	if (rc != SPI_OK_SELECT && rc != SPI_OK_INSERT_RETURNING && rc != SPI_OK_UPDATE_RETURNING
		&& rc != SPI_OK_DELETE_RETURNING && rc != SPI_OK_MERGE_RETURNING)
		ereport(ERROR, (errcode(ERRCODE_WRONG_OBJECT_TYPE), errmsg("execute_cached runs a statement returning rows"),
						errdetail("SPI returned %s.", SPI_result_code_string(rc))));
	if (SPI_processed != 1)
		ereport(ERROR, (errcode(ERRCODE_CARDINALITY_VIOLATION),
						errmsg("execute_cached expects one row, the statement returned %llu",
							   (unsigned long long) SPI_processed)));
	got = SPI_tuptable->tupdesc;
	if (got->natts != want->natts)
		ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
						errmsg("the statement returns %d columns, the column definition list names %d", got->natts,
							   want->natts)));
	for (i = 0; i < want->natts; i++)
		if (TupleDescAttr(got, i)->atttypid != TupleDescAttr(want, i)->atttypid)
			ereport(ERROR, (errcode(ERRCODE_DATATYPE_MISMATCH),
							errmsg("column %d of the statement is of type %s, the column definition list says %s",
								   i + 1, format_type_be(TupleDescAttr(got, i)->atttypid),
								   format_type_be(TupleDescAttr(want, i)->atttypid))));
	row = SPI_copytuple(SPI_tuptable->vals[0]);	/* in the caller's context: it outlives SPI_finish */
	SPI_finish();
	evict();

	MemoryContextSwitchTo(callcxt);
	return heap_copy_tuple_as_datum(row, BlessTupleDesc(want));
}

/* cached_plans(): this backend's kept statements, the most recently executed first, with their plan's state. */
Datum
agentdb_accel_cached_plans(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	dlist_iter	iter;

	InitMaterializedSRF(fcinfo, 0);
	if (Plans == NULL)
		return (Datum) 0;
	dlist_foreach(iter, &Lru)
	{
		PlanEntry  *entry = dlist_container(PlanEntry, lru, iter.cur);
		CachedPlanSource *source = linitial(entry->plan->plancache_list);
		Datum		values[6];
		bool		nulls[6] = {0};

		values[0] = CStringGetTextDatum(entry->text);
		values[1] = Int64GetDatum(entry->executions);
		values[2] = Int64GetDatum(source->num_custom_plans);
		values[3] = BoolGetDatum(source->gplan != NULL);
		values[4] = BoolGetDatum(source->is_valid);
		values[5] = Int64GetDatum((int64) entry->bytes);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
