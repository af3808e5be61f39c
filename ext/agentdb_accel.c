/*
 * agentdb_accel: the exact Okapi BM25 top k of a query over agentdb's own postings, as a cursor in C.
 *
 * It reads the table the plain SQL path reads for a source in the block layout (agentdb.posting_blocks) through
 * its primary key index, under the caller's snapshot: the same rows, crash safety and transactional visibility
 * as every other reader, with no structure of its own to keep equal to them. A source in the row layout takes
 * the plain SQL path (sql/040_retrieve.sql): a cursor reading one index entry and heap tuple a posting was
 * slower than the SQL path's sums there (SciFact, bench/LOG.md).
 *
 * The caller (agentdb_internal.bm25_accel, sql/025_accel.sql) passes each query term with its weight
 * wk = idf x (k1 + 1) and its statistics as the SQL side read them, so both paths score with one definition:
 * a chunk holding term t adds wk_t * tf / (tf + k1 * (1 - b) + k1 * b / avgdl * dl), evaluated in that order,
 * and a chunk's contributions are summed in descending order of the terms' bounds.
 *
 * Top k by MaxScore over windows of chunk ids, as Lucene's MaxScore scorer runs it. Each term's contribution
 * is at most ub_t (at its max_tf and min_dl). Sorted by ub, the terms whose bounds sum below theta (the k-th
 * best full score so far) are non-essential: a chunk holding none of the others cannot rank. The chunk ids are
 * taken a window of WINDOW consecutive ids at a time, from the lowest id an essential term still holds: every
 * posting of the essential terms in the window is summed into a dense array of partial scores (which stays in
 * cache however large the corpus); the chunks whose partial score plus the non-essential bounds reaches theta
 * are candidates; each non-essential term, highest bound first, is added to the candidates still able to reach
 * theta, reading only the blocks where one could reach theta with the block's bound (judged on the block's index
 * tuple: the key index includes its last chunk, max_tf and min_dl, migration 0026; on an older key, on its first
 * chunk and the term's max_span and bound until its row is read); the candidates then hold full
 * scores and offer themselves to the best k, theta rises, and terms leave the essential set. Each term is read
 * forward only, in chunk order: its first READ_AHEAD blocks through one index scan all terms share, the rest
 * (a frequent term's) through a scan of its own. A block whose postings all lie in the window is read in place
 * from its row, in whatever order it holds its postings (those a term sums, or the few at the candidates a
 * left-out term adds: the window marks its candidates by chunk id); only a block reaching into later windows is
 * decoded, sorted and kept. Against summing term at a time into an accumulator over the
 * whole id space, theta is a full score from the first window on, and no posting is a cache miss
 * (bench/LOG.md, 2026-12-04, night). The result is the k best chunks by (score desc, chunk id) among every
 * chunk holding a query term, visible to the caller's filters or not: the caller applies them.
 *
 * Everything is allocated in a memory context of the call, deleted before it returns; nothing outlives it.
 */
#include "postgres.h"

#include <math.h>

#include "access/genam.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "catalog/pg_type_d.h"
#include "common/hashfn.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "port/pg_bitutils.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"
#include "tsearch/ts_type.h"

PG_MODULE_MAGIC_EXT(.name = "agentdb_accel", .version = "1.6");

PG_FUNCTION_INFO_V1(agentdb_accel_bm25_topk_blocks);
PG_FUNCTION_INFO_V1(agentdb_accel_tsv_blocks);
PG_FUNCTION_INFO_V1(agentdb_accel_tsv_total_len);
PG_FUNCTION_INFO_V1(agentdb_accel_merged_blocks);

/* A block holds the postings of up to this many chunks of one term. */
#define BLOCK 128

/*
 * The cursor scores up to WINDOW consecutive chunk ids at a time (their partial scores take 128 KB); the first
 * window takes FIRST_WINDOW ids, and each next one twice as many up to WINDOW: theta, nothing while fewer than k
 * chunks have full scores, rises after the first few chunks, before most postings are summed.
 */
#define WINDOW_BITS 14
#define WINDOW (1 << WINDOW_BITS)
#define FIRST_WINDOW 1024

/*
 * A term's first blocks are met through the scan shared by all terms, up to this many; only a term with more
 * opens a scan of its own (a btree scan's setup and first descent cost more than a short term's whole read).
 */
#define READ_AHEAD 64

typedef struct QueryTerm
{
	Datum		term;			/* text */
	double		wk;				/* idf x (k1 + 1), the caller's */
	double		ub;				/* the largest contribution it can make */
	int64		df;
	int64		max_span;		/* block layout: the widest chunk range of its blocks */
} QueryTerm;

/* The postings of one block: chunk ids in ascending order, with their tf and dl. */
typedef struct PostingBlock
{
	int			n;
	int64		cid[BLOCK];
	int32		tf[BLOCK];
	int32		dl[BLOCK];
} PostingBlock;

/* The block postings of one source, read through the table's primary key. */
typedef struct Postings
{
	int32		source_id;
	Relation	heap;
	Relation	index;
	Oid			term_collation;
	Snapshot	snapshot;
	TupleTableSlot *slot;
	IndexScanDesc term_scan;	/* source_id = and term = */
	IndexFetchTableData *fetch; /* a block's row by its TID */
	bool		key_bounds;		/* the key index includes last_chunk, max_tf and min_dl (migration 0026) */
	AttrNumber	itup_last;		/* with key_bounds: last_chunk's position in an index tuple, then max_tf, min_dl */
	AttrNumber	att_first;
	AttrNumber	att_last;
	AttrNumber	att_max_tf;
	AttrNumber	att_min_dl;
	AttrNumber	att_tfs;
	AttrNumber	att_dls;
	AttrNumber	att_narrow_dls;
	AttrNumber	att_offs;
	AttrNumber	att_narrow_offs;
	MemoryContext scratch;		/* detoasted arrays of one block */
	double		k_len;			/* the BM25 denominator: tf + k_len + k_dl * dl */
	double		k_dl;
} Postings;

/* Table `relid`, or agentdb.`name` when it is invalid, opened for the current role's reads. */
static Relation
open_table(Oid relid, const char *name)
{
	AclResult	acl;

	if (!OidIsValid(relid))
		relid = get_relname_relid(name, get_namespace_oid("agentdb", false));
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("agentdb.%s does not exist", name)));
	acl = pg_class_aclcheck(relid, GetUserId(), ACL_SELECT);
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_TABLE, get_rel_name(relid));
	/* The cursor reads the heap directly: refuse a role whose reads row security would filter. */
	if (check_enable_rls(relid, InvalidOid, false) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("row security applies to %s for the current role", get_rel_name(relid)),
				 errhint("Such roles read postings through the plain SQL path.")));
	return table_open(relid, AccessShareLock);
}

static AttrNumber
column(Relation rel, const char *name)
{
	AttrNumber	att = get_attnum(RelationGetRelid(rel), name);

	if (att == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("%s has no column %s", RelationGetRelationName(rel), name)));
	return att;
}

/*
 * Open the posting blocks: agentdb.posting_blocks, or the table `blocks` (one shard of it on a Citus worker,
 * whose key has the shard key after first_chunk) when valid.
 */
static void
postings_open(Postings *p, Oid blocks, int32 source_id, double k_len, double k_dl)
{
	Oid			index_oid;
	int			nkeys;

	memset(p, 0, sizeof(Postings));
	p->source_id = source_id;
	p->k_len = k_len;
	p->k_dl = k_dl;
	p->heap = open_table(blocks, "posting_blocks");
	index_oid = RelationGetPrimaryKeyIndex(p->heap, false);
	if (!OidIsValid(index_oid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("the key index of %s is missing", RelationGetRelationName(p->heap))));
	p->index = index_open(index_oid, AccessShareLock);
	p->att_first = column(p->heap, "first_chunk");
	p->att_last = column(p->heap, "last_chunk");
	p->att_max_tf = column(p->heap, "max_tf");
	p->att_min_dl = column(p->heap, "min_dl");
	p->att_tfs = column(p->heap, "tfs");
	p->att_dls = column(p->heap, "dls");
	p->att_narrow_dls = column(p->heap, "narrow_dls");
	p->att_offs = column(p->heap, "offs");
	p->att_narrow_offs = column(p->heap, "narrow_offs");
	/* The scans key on the index's first three columns: (source_id, term, first_chunk). */
	if (p->index->rd_index->indnkeyatts < 3 ||
		p->index->rd_index->indkey.values[0] != column(p->heap, "source_id") ||
		p->index->rd_index->indkey.values[1] != column(p->heap, "term") ||
		p->index->rd_index->indkey.values[2] != p->att_first)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the key index of %s is not on (source_id, term, first_chunk)",
						RelationGetRelationName(p->heap))));
	/* The bounds are the index's first three included columns, after its key columns. */
	nkeys = p->index->rd_index->indnkeyatts;
	p->key_bounds = p->index->rd_index->indnatts >= nkeys + 3 &&
		p->index->rd_index->indkey.values[nkeys] == p->att_last &&
		p->index->rd_index->indkey.values[nkeys + 1] == p->att_max_tf &&
		p->index->rd_index->indkey.values[nkeys + 2] == p->att_min_dl;
	p->itup_last = nkeys + 1;
	p->term_collation = p->index->rd_indcollation[1];
	p->snapshot = GetActiveSnapshot();
	p->slot = table_slot_create(p->heap, NULL);
	p->term_scan = index_beginscan(p->heap, p->index, p->snapshot, NULL, 2, 0);
	p->term_scan->xs_want_itup = true;	/* the cursors meet a block on its index tuple */
	p->fetch = table_index_fetch_begin(p->heap);
	p->scratch = AllocSetContextCreate(CurrentMemoryContext, "agentdb_accel block", ALLOCSET_SMALL_SIZES);
}

static void
postings_close(Postings *p)
{
	table_index_fetch_end(p->fetch);
	index_endscan(p->term_scan);
	ExecDropSingleTupleTableSlot(p->slot);
	index_close(p->index, AccessShareLock);
	table_close(p->heap, AccessShareLock);
}

/* The keys source_id = p->source_id and term = t. */
static void
term_keys(Postings *p, ScanKey keys, QueryTerm *t)
{
	ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(p->source_id));
	ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid, p->term_collation,
						   F_TEXTEQ, t->term);
}

static inline double
contribution(const Postings *p, double wk, int32 tf, int32 dl)
{
	return wk * tf / (tf + p->k_len + p->k_dl * dl);
}

static void
malformed_block(const Postings *p)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("a posting block of source %d is malformed", p->source_id),
			 errhint("Run agentdb check --repair on the source.")));
}

/*
 * One array of the block in p->slot, held in column `wide` (int4) or else in column `narrow` (int2): detoasted,
 * with *is_wide saying which. A block with neither is refused.
 */
static ArrayType *
block_array(const Postings *p, AttrNumber wide, AttrNumber narrow, bool *is_wide)
{
	bool		isnull;
	Datum		d = slot_getattr(p->slot, wide, &isnull);

	*is_wide = !isnull;
	if (isnull)
	{
		d = slot_getattr(p->slot, narrow, &isnull);
		if (isnull)
			malformed_block(p);
	}
	return DatumGetArrayTypeP(d);
}

/*
 * The arrays of the block in p->slot, read in place: chunk ids as offsets from `first` (wide or narrow), tfs,
 * and lengths (wide or narrow), migrations/0025_narrow_posting_blocks.sql. An array that must be detoasted is
 * copied into p->scratch, which the caller resets once done with them. A block whose arrays differ in length,
 * hold nulls or more than BLOCK postings is refused.
 */
typedef struct BlockArrays
{
	int64		first;
	int			n;
	bool		wide_offs;
	bool		wide_dls;
	const void *offs;
	const int16 *tfs;
	const void *dls;
} BlockArrays;

static void
block_arrays(Postings *p, BlockArrays *a)
{
	bool		isnull;
	ArrayType  *a_offs;
	ArrayType  *a_tfs;
	ArrayType  *a_dls;
	MemoryContext old;

	a->first = DatumGetInt64(slot_getattr(p->slot, p->att_first, &isnull));
	old = MemoryContextSwitchTo(p->scratch);
	a_offs = block_array(p, p->att_offs, p->att_narrow_offs, &a->wide_offs);
	a_tfs = DatumGetArrayTypeP(slot_getattr(p->slot, p->att_tfs, &isnull));
	a_dls = block_array(p, p->att_dls, p->att_narrow_dls, &a->wide_dls);
	MemoryContextSwitchTo(old);
	a->n = ArrayGetNItems(ARR_NDIM(a_offs), ARR_DIMS(a_offs));
	if (a->n > BLOCK || ARR_HASNULL(a_offs) || ARR_HASNULL(a_tfs) || ARR_HASNULL(a_dls) ||
		ArrayGetNItems(ARR_NDIM(a_tfs), ARR_DIMS(a_tfs)) != a->n ||
		ArrayGetNItems(ARR_NDIM(a_dls), ARR_DIMS(a_dls)) != a->n ||
		ARR_ELEMTYPE(a_offs) != (a->wide_offs ? INT4OID : INT2OID) || ARR_ELEMTYPE(a_tfs) != INT2OID ||
		ARR_ELEMTYPE(a_dls) != (a->wide_dls ? INT4OID : INT2OID))
		malformed_block(p);
	a->offs = ARR_DATA_PTR(a_offs);
	a->tfs = (const int16 *) ARR_DATA_PTR(a_tfs);
	a->dls = ARR_DATA_PTR(a_dls);
}

/* The chunk id of posting i of a block read in place. */
static inline int64
block_cid(const BlockArrays *a, int i)
{
	return a->first + (a->wide_offs ? ((const int32 *) a->offs)[i] : ((const int16 *) a->offs)[i]);
}

/* The length of the chunk of posting i of a block read in place. */
static inline int32
block_dl(const BlockArrays *a, int i)
{
	return a->wide_dls ? ((const int32 *) a->dls)[i] : ((const int16 *) a->dls)[i];
}

/* The postings of the block in p->slot into *out, chunk ids made absolute. */
static void
read_block(Postings *p, PostingBlock *out)
{
	BlockArrays a;
	int			i;

	block_arrays(p, &a);
	for (i = 0; i < a.n; i++)
	{
		out->cid[i] = block_cid(&a, i);
		out->tf[i] = a.tfs[i];
		out->dl[i] = block_dl(&a, i);
	}
	out->n = a.n;
	MemoryContextReset(p->scratch);
}

/*
 * A block's postings put in chunk order, where a write through the SQL statements stored them in another (an
 * insertion sort: rare, and at most BLOCK postings).
 */
static void
sort_block(PostingBlock *b)
{
	int			i;
	int			j;

	for (i = 1; i < b->n; i++)
	{
		int64		cid = b->cid[i];
		int32		tf = b->tf[i];
		int32		dl = b->dl[i];

		if (cid >= b->cid[i - 1])
			continue;
		for (j = i; j > 0 && b->cid[j - 1] > cid; j--)
		{
			b->cid[j] = b->cid[j - 1];
			b->tf[j] = b->tf[j - 1];
			b->dl[j] = b->dl[j - 1];
		}
		b->cid[j] = cid;
		b->tf[j] = tf;
		b->dl[j] = dl;
	}
}

/* Call `visit` on every block of term t's postings, in the index's order. */
typedef void (*BlockVisitor) (void *arg, QueryTerm *t, const PostingBlock *block);

static void
scan_term(Postings *p, QueryTerm *t, BlockVisitor visit, void *arg)
{
	IndexScanDesc scan = p->term_scan;
	ScanKeyData keys[2];
	PostingBlock *block = palloc(sizeof(PostingBlock));

	term_keys(p, keys, t);
	index_rescan(scan, keys, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, p->slot))
	{
		CHECK_FOR_INTERRUPTS();
		read_block(p, block);
		visit(arg, t, block);
	}
	pfree(block);
}

/* A chunk and its score. */
typedef struct Hit
{
	int64		cid;
	double		score;
} Hit;

/* The position of the first of the n hits (sorted by chunk id) whose chunk id is cid or more. */
static inline int64
lower_bound(const Hit *hits, int64 n, int64 cid)
{
	int64		l = 0;
	int64		r = n;

	while (l < r)
	{
		int64		m = l + (r - l) / 2;

		if (hits[m].cid < cid)
			l = m + 1;
		else
			r = m;
	}
	return l;
}

/*
 * Whether a candidate among `cands` (n of them, sorted by chunk id) in [lo, hi] reaches theta with `add` added
 * to its score.
 */
static inline bool
may_reach(const Hit *cands, int64 n, int64 lo, int64 hi, double add, double theta)
{
	int64		l;

	for (l = lower_bound(cands, n, lo); l < n && cands[l].cid <= hi; l++)
		if (cands[l].score + add >= theta)
			return true;
	return false;
}

/*
 * Scores leave both paths rounded to a grid of 1e-9 (the SQL side's agentdb_internal.bm25_round): two chunks
 * whose BM25 is mathematically equal then carry the same score whatever order their terms were summed in, and
 * rank by chunk id on both paths.
 */
#define SCORE_GRID 1e9

static double
round_score(double score)
{
	return rint(score * SCORE_GRID) / SCORE_GRID;
}

/*
 * theta: the k-th best score held (0 while fewer are held), a hair lower, relatively and by more than the
 * rounding grid, so that neither float rounding nor the rounding of scores drops a tie.
 */
static inline double
below(double kth)
{
	return kth * (1 - 1e-9) - 1 / SCORE_GRID;
}

static int
hit_order(const void *a, const void *b)
{
	const Hit  *x = a;
	const Hit  *y = b;

	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return x->cid < y->cid ? -1 : (x->cid > y->cid ? 1 : 0);
}

/* Ascending bound (then descending df): the order in which terms become non-essential. */
static int
term_order(const void *a, const void *b)
{
	const QueryTerm *x = a;
	const QueryTerm *y = b;

	if (x->ub != y->ub)
		return x->ub < y->ub ? -1 : 1;
	return x->df > y->df ? -1 : (x->df < y->df ? 1 : 0);
}

/*
 * A block of a term met by its cursor on its index tuple: its first chunk, its row's TID, and its last chunk and
 * bound where the key index includes them (else known once a window reads its row); decoded when a window needs
 * its postings.
 */
typedef struct Entry
{
	ItemPointerData tid;
	int64		first;
	int64		last;			/* while not known: first + the term's max_span */
	double		bound;			/* at the block's max_tf and min_dl; while not known: the term's ub */
	bool		known;
	PostingBlock *block;		/* its postings in chunk order once decoded, else NULL */
	int			pos;			/* the first of them no window has passed yet */
} Entry;

/*
 * One term's postings read forward: an index scan on (source_id, term) in first-chunk order, the tuple it
 * stands on (next_tid, next_first) while `more`, and the blocks met before it that may still hold chunks of
 * the windows to come. The scan is the shared one while the first READ_AHEAD blocks are read, then the term's
 * own (NULL for a term with no more blocks by then).
 */
typedef struct TermCursor
{
	QueryTerm	t;
	IndexScanDesc scan;
	bool		more;
	ItemPointerData next_tid;
	int64		next_first;
	int64		next_last;		/* with key_bounds */
	double		next_bound;
	Entry	   *entries;		/* in first-chunk order */
	int			n;
	int			cap;
	uint32		term_size;		/* the term's bytes in its index tuples, header included; 0 until known */
	uint32		offsets[INDEX_MAX_KEYS];	/* then each column's place in a tuple's data */
} TermCursor;

/*
 * Where the index tuples of term c keep their columns, from one of them without nulls. The columns before
 * first_chunk are source_id and the term, and a shard's one shard_key follows it, so every such tuple of the
 * term whose term takes as many bytes keeps each column in the same place: the cursor reads its columns there,
 * where deforming each tuple would walk them (none has a cached offset after the term, a varlena). A tuple whose
 * term is stored otherwise (a long term compressed by another method than in the first tuple's block) is
 * deformed.
 */
static void
tuple_offsets(TermCursor *c, IndexTuple itup, TupleDesc desc)
{
	const char *data = (char *) itup + IndexInfoFindDataOffset(itup->t_info);
	uintptr_t	off = 0;
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		CompactAttribute *att = TupleDescCompactAttr(desc, i);

		off = att_pointer_alignby(off, att->attalignby, att->attlen, data + off);
		c->offsets[i] = (uint32) off;
		off = att_addlength_pointer(off, att->attlen, data + off);
	}
	c->term_size = VARSIZE_ANY(data + c->offsets[1]);
}

/* The scan's next index tuple, or more = false at its end. */
static void
cursor_step(const Postings *p, TermCursor *c)
{
	ItemPointer tid = index_getnext_tid(c->scan, ForwardScanDirection);
	IndexTuple	itup;
	TupleDesc	desc;
	const char *data;
	Datum		values[INDEX_MAX_KEYS];
	bool		isnull[INDEX_MAX_KEYS];

	c->more = tid != NULL;
	if (!c->more)
		return;
	c->next_tid = *tid;
	itup = c->scan->xs_itup;
	desc = c->scan->xs_itupdesc;
	data = (char *) itup + IndexInfoFindDataOffset(itup->t_info);
	if (c->term_size == 0 && !IndexTupleHasNulls(itup))
		tuple_offsets(c, itup, desc);
	if (!IndexTupleHasNulls(itup) && VARSIZE_ANY(data + c->offsets[1]) == c->term_size)
	{
		int			i;

		for (i = 2; i < desc->natts; i++)
		{
			CompactAttribute *att = TupleDescCompactAttr(desc, i);

			values[i] = fetch_att(data + c->offsets[i], att->attbyval, att->attlen);
		}
	}
	else
		index_deform_tuple(itup, desc, values, isnull);
	c->next_first = DatumGetInt64(values[2]);
	if (p->key_bounds)
	{
		c->next_last = DatumGetInt64(values[p->itup_last - 1]);
		c->next_bound = contribution(p, c->t.wk, DatumGetInt32(values[p->itup_last]),
									 DatumGetInt32(values[p->itup_last + 1]));
	}
}

static void cursor_pull(const Postings *p, TermCursor *c, int64 hi, int limit);

/*
 * The term's first READ_AHEAD blocks become entries, met through the shared scan; a term with more continues
 * with a scan of its own from the block it stands on (first_chunk is unique within a term: the key).
 */
static void
cursor_open(Postings *p, TermCursor *c)
{
	ScanKeyData keys[3];

	term_keys(p, keys, &c->t);
	c->n = 0;
	c->cap = 16;
	c->entries = palloc(sizeof(Entry) * c->cap);
	c->scan = p->term_scan;
	index_rescan(c->scan, keys, 2, NULL, 0);
	cursor_step(p, c);
	cursor_pull(p, c, PG_INT64_MAX, READ_AHEAD);
	if (!c->more)
	{
		c->scan = NULL;			/* the shared scan goes on to the next term */
		return;
	}
	ScanKeyInit(&keys[2], 3, BTGreaterEqualStrategyNumber, F_INT8GE, Int64GetDatum(c->next_first));
	c->scan = index_beginscan(p->heap, p->index, p->snapshot, NULL, 3, 0);
	c->scan->xs_want_itup = true;	/* a block is met on its index tuple's first_chunk, its row read later */
	index_rescan(c->scan, keys, 3, NULL, 0);
	cursor_step(p, c);
}

/* The blocks whose first chunk lies below hi become entries, at most `limit` of them. */
static void
cursor_pull(const Postings *p, TermCursor *c, int64 hi, int limit)
{
	while (c->more && c->next_first < hi && limit-- > 0)
	{
		Entry	   *e;

		CHECK_FOR_INTERRUPTS();
		if (c->n == c->cap)
		{
			c->cap *= 2;
			c->entries = repalloc_huge(c->entries, sizeof(Entry) * c->cap);
		}
		e = &c->entries[c->n++];
		e->tid = c->next_tid;
		e->first = c->next_first;
		e->known = p->key_bounds;
		e->last = e->known ? c->next_last : c->next_first + c->t.max_span;
		e->bound = e->known ? c->next_bound : c->t.ub;
		e->block = NULL;
		e->pos = 0;
		cursor_step(p, c);
	}
}

/* Entry e's row into p->slot; false when no version of it is visible to the snapshot. */
static bool
fetch_row(Postings *p, Entry *e)
{
	bool		call_again = false;
	bool		all_dead = false;

	return table_index_fetch_tuple(p->fetch, &e->tid, p->snapshot, p->slot, &call_again, &all_dead);
}

/* Entry e's row read (false: none visible): its last chunk and bound; the row stays in p->slot. */
static bool
read_row(Postings *p, TermCursor *c, Entry *e)
{
	bool		isnull;

	if (!fetch_row(p, e))
		return false;
	e->last = DatumGetInt64(slot_getattr(p->slot, p->att_last, &isnull));
	e->bound = contribution(p, c->t.wk, DatumGetInt32(slot_getattr(p->slot, p->att_max_tf, &isnull)),
							DatumGetInt32(slot_getattr(p->slot, p->att_min_dl, &isnull)));
	e->known = true;
	return true;
}

/*
 * Entry e's postings decoded (false: no version of its row is visible); its row is in p->slot when `in_slot`,
 * else fetched.
 */
static bool
decode(Postings *p, Entry *e, bool in_slot)
{
	if (!in_slot && !fetch_row(p, e))
		return false;
	e->block = palloc(sizeof(PostingBlock));
	read_block(p, e->block);
	sort_block(e->block);
	/* Windows index their scores by chunk id: a posting outside the row's own range would fall outside one. */
	if (e->block->n > 0 && (e->block->cid[0] < e->first || e->block->cid[e->block->n - 1] > e->last))
		malformed_block(p);
	e->pos = 0;
	return true;
}

/* The lowest chunk id term c may still hold, or PG_INT64_MAX. */
static int64
cursor_next(const TermCursor *c)
{
	int64		next = c->more ? c->next_first : PG_INT64_MAX;
	int			i;

	for (i = 0; i < c->n; i++)
	{
		const Entry *e = &c->entries[i];
		int64		cid = e->block != NULL ? e->block->cid[e->pos] : e->first;

		next = Min(next, cid);
	}
	return next;
}

/*
 * The window [lo, hi), hi - lo <= WINDOW: the partial scores of its chunks and which of them a posting reached;
 * then which of them are candidates, and each candidate's place in the candidates' array (valid where its bit is
 * set), so that a left-out term's posting finds its candidate by its chunk id alone, in any order.
 */
typedef struct Window
{
	int64		lo;
	int64		hi;
	double		score[WINDOW];
	uint64		reached[WINDOW / 64];
	uint64		is_cand[WINDOW / 64];
	int32		cand_at[WINDOW];
} Window;

/* Whether chunk cid is one of the window's candidates; *at its place among them if so. */
static inline bool
window_cand(const Window *w, int64 cid, int32 *at)
{
	uint64		o = (uint64) (cid - w->lo);

	if (o >= (uint64) (w->hi - w->lo) || !(w->is_cand[o >> 6] & (UINT64CONST(1) << (o & 63))))
		return false;
	*at = w->cand_at[o];
	return true;
}

/* A posting of chunk cid, in the window, added to its score. */
static inline void
window_add(const Postings *p, Window *w, double wk, int64 cid, int32 tf, int32 dl)
{
	int			o = (int) (cid - w->lo);

	w->score[o] += contribution(p, wk, tf, dl);
	w->reached[o >> 6] |= UINT64CONST(1) << (o & 63);
}

/*
 * A block lying within the window, its row in p->slot, added to the window's scores from the row itself, in
 * any order (a chunk's sum does not depend on the order of one term's postings).
 */
static void
add_row(Postings *p, QueryTerm *t, const Entry *e, Window *w)
{
	BlockArrays a;
	int			i;

	block_arrays(p, &a);
	for (i = 0; i < a.n; i++)
	{
		int64		cid = block_cid(&a, i);

		/* Windows index their scores by chunk id: a posting outside the row's own range would fall outside. */
		if (cid < e->first || cid > e->last)
			malformed_block(p);
		window_add(p, w, t->wk, cid, a.tfs[i], block_dl(&a, i));
	}
	MemoryContextReset(p->scratch);
}

/* An essential term: each of its postings in the window adds to the window's scores. */
static void
add_essential(Postings *p, TermCursor *c, Window *w)
{
	int64		hi = w->hi;
	int			i;
	int			n = 0;

	cursor_pull(p, c, hi, PG_INT32_MAX);
	for (i = 0; i < c->n; i++)
	{
		Entry	   *e = &c->entries[i];
		PostingBlock *b;

		CHECK_FOR_INTERRUPTS();
		if (e->first >= hi)		/* met ahead of the windows (READ_AHEAD) */
		{
			c->entries[n++] = *e;
			continue;
		}
		if (e->block == NULL)
		{
			if (!read_row(p, c, e))
				continue;
			if (e->first >= w->lo && e->last < hi)
			{
				add_row(p, &c->t, e, w);	/* all its postings are in this window: done with */
				continue;
			}
			(void) decode(p, e, true);
		}
		b = e->block;
		for (; e->pos < b->n && b->cid[e->pos] < hi; e->pos++)
			window_add(p, w, c->t.wk, b->cid[e->pos], b->tf[e->pos], b->dl[e->pos]);
		if (e->pos < b->n)
			c->entries[n++] = *e;
		else
			pfree(b);
	}
	c->n = n;
}

/*
 * The window's chunks whose score plus `bound` reaches theta, in chunk order, marked as its candidates; its
 * scores are left cleared.
 */
static int64
window_candidates(Window *w, double bound, double theta, Hit *cands)
{
	int64		n = 0;
	int			j;

	for (j = 0; j <= (int) ((w->hi - w->lo - 1) >> 6); j++)
	{
		uint64		bits = w->reached[j];

		w->reached[j] = 0;
		while (bits != 0)
		{
			int			o = j * 64 + pg_rightmost_one_pos64(bits);

			bits &= bits - 1;
			if (w->score[o] + bound >= theta)
			{
				cands[n].cid = w->lo + o;
				cands[n].score = w->score[o];
				w->is_cand[o >> 6] |= UINT64CONST(1) << (o & 63);
				w->cand_at[o] = (int32) n;
				n++;
			}
			w->score[o] = 0;
		}
	}
	return n;
}

/* A decoded block's postings in the window added to the candidates holding them; its position moves past it. */
static void
merge_block(Postings *p, QueryTerm *t, Entry *e, const Window *w, Hit *cands)
{
	PostingBlock *b = e->block;
	int32		at;

	for (; e->pos < b->n && b->cid[e->pos] < w->hi; e->pos++)
		if (window_cand(w, b->cid[e->pos], &at))
			cands[at].score += contribution(p, t->wk, b->tf[e->pos], b->dl[e->pos]);
}

/*
 * The block whose row is in p->slot, lying in this window or before it, added to the candidates holding its
 * chunks, read in place from the row in whatever order it holds them: a non-essential block holds a few of
 * the candidates among its BLOCK postings, and each posting finds its candidate, if any, by its chunk id.
 */
static void
merge_row(Postings *p, QueryTerm *t, const Entry *e, const Window *w, Hit *cands)
{
	BlockArrays a;
	int			i;
	int32		at;

	block_arrays(p, &a);
	for (i = 0; i < a.n; i++)
	{
		int64		cid = block_cid(&a, i);

		if (cid < e->first || cid > e->last)
			malformed_block(p);
		if (window_cand(w, cid, &at))
			cands[at].score += contribution(p, t->wk, a.tfs[i], block_dl(&a, i));
	}
	MemoryContextReset(p->scratch);
}

/*
 * A non-essential term added to the window's candidates, `rest` the bounds of the terms after it: a block is
 * read only when a candidate in its range could reach theta with its bound (the term's until its row is read,
 * then its own); a block that may hold chunks of later windows stays an entry.
 */
static void
add_remaining(Postings *p, TermCursor *c, const Window *w, Hit *cands, int64 ncands, double rest, double theta)
{
	int64		lo = w->lo;
	int64		hi = w->hi;
	int			i;
	int			n = 0;

	cursor_pull(p, c, hi, PG_INT32_MAX);
	for (i = 0; i < c->n; i++)
	{
		Entry	   *e = &c->entries[i];

		CHECK_FOR_INTERRUPTS();
		if (e->first < hi && e->last >= lo && may_reach(cands, ncands, Max(e->first, lo), Min(e->last, hi - 1), e->bound + rest, theta))
		{
			bool		in_slot = false;

			if (!e->known)
			{
				if (!read_row(p, c, e))
					continue;
				in_slot = true;
			}
			if (e->last >= lo &&
				may_reach(cands, ncands, Max(e->first, lo), Min(e->last, hi - 1), e->bound + rest, theta))
			{
				if (e->block == NULL && e->last < hi)
				{
					/* all its postings are in this window or before: read in place, then done with */
					if (in_slot || fetch_row(p, e))
						merge_row(p, &c->t, e, w, cands);
					continue;
				}
				if (e->block == NULL && !decode(p, e, in_slot))
					continue;
				merge_block(p, &c->t, e, w, cands);
			}
		}
		if (e->last >= hi && (e->block == NULL || e->pos < e->block->n))
			c->entries[n++] = *e;
		else if (e->block != NULL)
			pfree(e->block);
	}
	c->n = n;
}

/*
 * The candidates whose score plus `bound` reaches theta, kept in order, and the window's marks made to match:
 * the others are no longer its candidates.
 */
static int64
prune(Window *w, Hit *cands, int64 n, double bound, double theta)
{
	int64		i;
	int64		kept = 0;

	for (i = 0; i < n; i++)
	{
		int64		o = cands[i].cid - w->lo;

		if (cands[i].score + bound >= theta)
		{
			w->cand_at[o] = (int32) kept;
			cands[kept++] = cands[i];
		}
		else
			w->is_cand[o >> 6] &= ~(UINT64CONST(1) << (o & 63));
	}
	return kept;
}

/*
 * The best k so far: a heap of at most k hits whose root is the one ranking last (the lowest rounded score, and
 * of those the highest chunk id).
 */
typedef struct Best
{
	Hit		   *h;
	int64		n;
	int64		k;
	int64		cap;
} Best;

/* Whether hit x ranks after hit y. */
static inline bool
ranks_after(const Hit *x, const Hit *y)
{
	return x->score < y->score || (x->score == y->score && x->cid > y->cid);
}

static void
offer(Best *best, int64 cid, double score)
{
	Hit		   *h = best->h;
	Hit			x = {cid, score};
	int64		i;

	if (best->n < best->k)
	{
		if (best->n == best->cap)
		{
			best->cap = Min(best->cap * 2, best->k);
			h = best->h = repalloc_huge(best->h, sizeof(Hit) * best->cap);
		}
		/* sift up */
		for (i = best->n++; i > 0 && ranks_after(&x, &h[(i - 1) / 2]); i = (i - 1) / 2)
			h[i] = h[(i - 1) / 2];
		h[i] = x;
		return;
	}
	if (!ranks_after(&h[0], &x))
		return;
	/* the last gives way: sift down */
	for (i = 0;;)
	{
		int64		c = 2 * i + 1;

		if (c >= best->n)
			break;
		if (c + 1 < best->n && ranks_after(&h[c + 1], &h[c]))
			c++;
		if (!ranks_after(&h[c], &x))
			break;
		h[i] = h[c];
		i = c;
	}
	h[i] = x;
}

static ArrayType *
array_arg(FunctionCallInfo fcinfo, int i, Oid elemtype, int nterms)
{
	ArrayType  *a;

	if (PG_ARGISNULL(i))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("argument %d of agentdb_accel.bm25_topk must not be null", i + 1)));
	a = PG_GETARG_ARRAYTYPE_P(i);
	if (ARR_ELEMTYPE(a) != elemtype || ARR_HASNULL(a) ||
		(nterms >= 0 && ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a)) != nterms))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the term arrays of agentdb_accel.bm25_topk must be of one length, without nulls")));
	return a;
}

/*
 * agentdb_accel.bm25_topk(source_id int, terms text[], weights float8[], dfs bigint[], max_tfs int[],
 *                         min_dls int[], max_spans bigint[], k int, avgdl float8, k1 float8, b float8
 *                         [, blocks regclass])
 * returns table (cid bigint, bm25 float8)
 * over agentdb.posting_blocks, or the table `blocks` (a shard of it).
 */
Datum
agentdb_accel_bm25_topk_blocks(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext work;
	MemoryContext old;
	ArrayType  *a_terms;
	Datum	   *terms;
	bool	   *term_nulls;
	int			nterms;
	double	   *weights;
	int64	   *dfs;
	int32	   *max_tfs;
	int32	   *min_dls;
	int64	   *max_spans;
	int64		k;
	double		avgdl;
	double		k1;
	double		b;
	Postings	p;
	TermCursor *cur;
	double	   *below_sum;
	int			essential = 0;
	double		theta = 0;
	int64		size = FIRST_WINDOW;
	Window	   *w;
	Hit		   *cands;
	Best		best;
	int			i;
	int64		h;

	for (i = 0; i < 11; i++)
		if (PG_ARGISNULL(i) && (i < 1 || i > 6))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("argument %d of agentdb_accel.bm25_topk must not be null", i + 1)));
	InitMaterializedSRF(fcinfo, 0);
	k = PG_GETARG_INT32(7);
	avgdl = PG_GETARG_FLOAT8(8);
	k1 = PG_GETARG_FLOAT8(9);
	b = PG_GETARG_FLOAT8(10);
	if (k < 1 || !(avgdl > 0) || !(k1 >= 0) || !(b >= 0 && b <= 1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("agentdb_accel.bm25_topk needs k >= 1, avgdl > 0, k1 >= 0 and b in [0, 1]")));

	work = AllocSetContextCreate(CurrentMemoryContext, "agentdb_accel bm25_topk", ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(work);

	a_terms = array_arg(fcinfo, 1, TEXTOID, -1);
	deconstruct_array_builtin(a_terms, TEXTOID, &terms, &term_nulls, &nterms);
	weights = (double *) ARR_DATA_PTR(array_arg(fcinfo, 2, FLOAT8OID, nterms));
	dfs = (int64 *) ARR_DATA_PTR(array_arg(fcinfo, 3, INT8OID, nterms));
	max_tfs = (int32 *) ARR_DATA_PTR(array_arg(fcinfo, 4, INT4OID, nterms));
	min_dls = (int32 *) ARR_DATA_PTR(array_arg(fcinfo, 5, INT4OID, nterms));
	max_spans = (int64 *) ARR_DATA_PTR(array_arg(fcinfo, 6, INT8OID, nterms));

	if (nterms == 0)
	{
		MemoryContextSwitchTo(old);
		MemoryContextDelete(work);
		PG_RETURN_VOID();
	}

	postings_open(&p, PG_NARGS() > 11 ? PG_GETARG_OID(11) : InvalidOid, PG_GETARG_INT32(0), k1 * (1 - b),
				  k1 * b / avgdl);

	/*
	 * The terms by ascending bound, each with its cursor; below_sum[i], the sum of the bounds of the terms
	 * before i. Terms [0, essential) are non-essential: their bounds sum below theta.
	 */
	cur = palloc0(sizeof(TermCursor) * nterms);
	for (i = 0; i < nterms; i++)
	{
		cur[i].t.term = terms[i];
		cur[i].t.wk = weights[i];
		cur[i].t.df = dfs[i];
		cur[i].t.max_span = max_spans[i];
		cur[i].t.ub = contribution(&p, weights[i], max_tfs[i], min_dls[i]);
	}
	qsort(cur, nterms, sizeof(TermCursor), term_order);
	below_sum = palloc(sizeof(double) * (nterms + 1));
	below_sum[0] = 0;
	for (i = 0; i < nterms; i++)
	{
		below_sum[i + 1] = below_sum[i] + cur[i].t.ub;
		cursor_open(&p, &cur[i]);
	}

	w = palloc(sizeof(Window));	/* cand_at is read only where is_cand is set */
	memset(w->score, 0, sizeof(w->score));
	memset(w->reached, 0, sizeof(w->reached));
	memset(w->is_cand, 0, sizeof(w->is_cand));
	cands = MemoryContextAllocHuge(work, sizeof(Hit) * WINDOW);
	best.k = k;
	best.n = 0;
	best.cap = Min(k, 1024);
	best.h = MemoryContextAllocHuge(work, sizeof(Hit) * best.cap);
	while (essential < nterms)
	{
		int64		ncands;

		CHECK_FOR_INTERRUPTS();
		w->lo = PG_INT64_MAX;
		for (i = essential; i < nterms; i++)
			w->lo = Min(w->lo, cursor_next(&cur[i]));
		if (w->lo == PG_INT64_MAX)
			break;				/* no essential term holds another chunk */
		w->hi = w->lo + size;
		size = Min(size * 2, WINDOW);
		/* The essential terms, then the others on the candidates, each in descending bound. */
		for (i = nterms - 1; i >= essential; i--)
			add_essential(&p, &cur[i], w);
		ncands = window_candidates(w, below_sum[essential], theta, cands);
		for (i = essential - 1; i >= 0 && ncands > 0; i--)
		{
			ncands = prune(w, cands, ncands, cur[i].t.ub + below_sum[i], theta);
			add_remaining(&p, &cur[i], w, cands, ncands, below_sum[i], theta);
		}
		memset(w->is_cand, 0, sizeof(w->is_cand));
		for (h = 0; h < ncands; h++)
			offer(&best, cands[h].cid, round_score(cands[h].score));
		if (best.n == k)
			theta = below(best.h[0].score);
		while (essential < nterms && below_sum[essential + 1] < theta)
			essential++;
	}
	for (i = 0; i < nterms; i++)
		if (cur[i].scan != NULL)
			index_endscan(cur[i].scan);
	postings_close(&p);

	/* The best k, by score and chunk id. */
	qsort(best.h, best.n, sizeof(Hit), hit_order);
	MemoryContextSwitchTo(old);
	for (h = 0; h < best.n; h++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = Int64GetDatum(best.h[h].cid);
		values[1] = Float8GetDatum(best.h[h].score);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	MemoryContextDelete(work);
	PG_RETURN_VOID();
}

/*
 * The write path: a statement's posting blocks from its rows' tsvectors, as agentdb_internal.block_sql cuts
 * them (sql/020_lexical.sql), for the lexical triggers of a source in the block layout.
 *
 * A posting of lexeme t in chunk c has tf = its number of positions (1 when it has none) and dl = the sum of
 * c's tfs. Each term's postings are cut into blocks of BLOCK in chunk order; a block's row holds its term, its
 * lowest and highest chunk id, its largest tf and smallest dl, and its arrays (offsets from the lowest id).
 */

/* A lexeme's bytes (inside its tsvector, not terminated). */
typedef struct LexemeKey
{
	const char *lexeme;
	uint32		len;
} LexemeKey;

/* A distinct lexeme of the statement, and its number in order of first appearance. */
typedef struct WriteTerm
{
	LexemeKey	key;
	uint32		hash;
	char		status;
	int32		index;
} WriteTerm;

#define SH_PREFIX lex
#define SH_ELEMENT_TYPE WriteTerm
#define SH_KEY_TYPE LexemeKey
#define SH_KEY key
#define SH_HASH_KEY(tb, k) hash_bytes((const unsigned char *) (k).lexeme, (int) (k).len)
#define SH_EQUAL(tb, a, b) ((a).len == (b).len && memcmp((a).lexeme, (b).lexeme, (a).len) == 0)
#define SH_STORE_HASH
#define SH_GET_HASH(tb, a) ((a)->hash)
#define SH_SCOPE static inline
#define SH_DECLARE
#define SH_DEFINE
#include "lib/simplehash.h"

/* One posting of the statement, by term and chunk. */
typedef struct WritePosting
{
	int64		cid;
	int32		dl;
	int16		tf;
} WritePosting;

static int
write_posting_order(const void *a, const void *b)
{
	int64		x = ((const WritePosting *) a)->cid;
	int64		y = ((const WritePosting *) b)->cid;

	return (x > y) - (x < y);
}

/* The tf of each lexeme entry, as coalesce(cardinality(positions), 1) reads it. */
static inline int32
entry_tf(TSVector tsv, WordEntry *e)
{
	return e->haspos ? POSDATALEN(tsv, e) : 1;
}

static ArrayType *
write_array_arg(FunctionCallInfo fcinfo, int i, Oid elemtype)
{
	ArrayType  *a = PG_GETARG_ARRAYTYPE_P(i);

	if (ARR_ELEMTYPE(a) != elemtype || ARR_NDIM(a) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument %d of agentdb_accel.tsv_blocks must be a one-dimensional array of its type",
						i + 1)));
	return a;
}

/*
 * Term `term`'s postings tp[0..n) (distinct chunk ids), ordered by chunk id and cut into blocks of BLOCK, put as
 * rows (term, first_chunk, last_chunk, max_tf, min_dl, offs, narrow_offs, tfs, dls, narrow_dls) of function
 * `fn`'s result: a block's offsets in narrow_offs (int2) when its chunk range fits, else in offs (int4), its
 * lengths in narrow_dls when they all fit, else in dls; the other of each pair null.
 */
static void
put_blocks(ReturnSetInfo *rsinfo, text *term, WritePosting *tp, int64 n, const char *fn)
{
	int64		i;
	int64		from;
	bool		ordered = true;

	for (i = 1; i < n && ordered; i++)
		ordered = tp[i - 1].cid < tp[i].cid;
	if (!ordered)
		qsort(tp, n, sizeof(WritePosting), write_posting_order);
	for (from = 0; from < n; from += BLOCK)
	{
		int			m = (int) Min(BLOCK, n - from);
		Datum		offs[BLOCK];
		Datum		tfs[BLOCK];
		Datum		dls[BLOCK];
		int64		lo = tp[from].cid;
		int64		hi = tp[from + m - 1].cid;
		bool		wide_offs = hi - lo > PG_INT16_MAX;
		bool		wide_dls = false;
		int32		max_tf = 0;
		int32		min_dl = PG_INT32_MAX;
		Datum		values[10];
		bool		nulls[10];
		int			k;

		if (hi - lo > PG_INT32_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("%s: a block's chunk range is out of range", fn)));
		for (k = 0; k < m; k++)
			wide_dls |= tp[from + k].dl > PG_INT16_MAX;
		for (k = 0; k < m; k++)
		{
			const WritePosting *w = &tp[from + k];

			offs[k] = wide_offs ? Int32GetDatum((int32) (w->cid - lo)) : Int16GetDatum((int16) (w->cid - lo));
			tfs[k] = Int16GetDatum(w->tf);
			dls[k] = wide_dls ? Int32GetDatum(w->dl) : Int16GetDatum((int16) w->dl);
			max_tf = Max(max_tf, w->tf);
			min_dl = Min(min_dl, w->dl);
		}
		memset(values, 0, sizeof(values));
		memset(nulls, false, sizeof(nulls));
		values[0] = PointerGetDatum(term);
		values[1] = Int64GetDatum(lo);
		values[2] = Int64GetDatum(hi);
		values[3] = Int32GetDatum(max_tf);
		values[4] = Int32GetDatum(min_dl);
		values[wide_offs ? 5 : 6] =
			PointerGetDatum(construct_array_builtin(offs, m, wide_offs ? INT4OID : INT2OID));
		nulls[wide_offs ? 6 : 5] = true;
		values[7] = PointerGetDatum(construct_array_builtin(tfs, m, INT2OID));
		values[wide_dls ? 8 : 9] = PointerGetDatum(construct_array_builtin(dls, m, wide_dls ? INT4OID : INT2OID));
		nulls[wide_dls ? 9 : 8] = true;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		for (k = 5; k < 10; k++)
			if (!nulls[k])
				pfree(DatumGetPointer(values[k]));
	}
}

/*
 * agentdb_accel.tsv_blocks(chunk_ids bigint[], tsvs tsvector[])
 * returns table (term text, first_chunk bigint, last_chunk bigint, max_tf int, min_dl int, offs int4[],
 *                narrow_offs int2[], tfs int2[], dls int4[], narrow_dls int2[])
 *
 * The posting blocks of the chunks chunk_ids[i] whose tsvectors are tsvs[i] (a null tsvector holds nothing).
 * Each term's postings are ordered by chunk id before they are cut (stable: the ids of one statement are
 * distinct), so the blocks are those the SQL path cuts when the rows come in chunk order (a write of agentdb's,
 * a rebuild).
 */
Datum
agentdb_accel_tsv_blocks(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext work;
	MemoryContext old;
	ArrayType  *a_ids;
	ArrayType  *a_tsvs;
	Datum	   *ids;
	bool	   *id_nulls;
	Datum	   *tsvs;
	bool	   *tsv_nulls;
	int			nids;
	int			ntsvs;
	int			c;
	int64		nposts = 0;
	lex_hash   *terms;
	int32		nterms = 0;
	int32	   *term_of;		/* a posting's term, in the statement's order of postings */
	int64	   *starts;			/* term t's postings: [starts[t], starts[t + 1]) of by_term */
	int64	   *fill;
	WritePosting *by_term;
	LexemeKey  *lexemes;
	int64		p;
	int32		t;

	InitMaterializedSRF(fcinfo, 0);
	a_ids = write_array_arg(fcinfo, 0, INT8OID);
	a_tsvs = write_array_arg(fcinfo, 1, TSVECTOROID);

	work = AllocSetContextCreate(CurrentMemoryContext, "agentdb_accel tsv_blocks", ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(work);

	deconstruct_array(a_ids, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &ids, &id_nulls, &nids);
	deconstruct_array(a_tsvs, TSVECTOROID, -1, false, TYPALIGN_INT, &tsvs, &tsv_nulls, &ntsvs);
	if (nids != ntsvs)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("agentdb_accel.tsv_blocks needs one chunk id a tsvector")));

	/* First pass: each posting's term, and the number of postings of each term. */
	for (c = 0; c < ntsvs; c++)
		if (!tsv_nulls[c])
		{
			if (id_nulls[c])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("agentdb_accel.tsv_blocks: a chunk id is null")));
			tsvs[c] = PointerGetDatum(DatumGetTSVector(tsvs[c]));
			nposts += DatumGetTSVector(tsvs[c])->size;
		}
	terms = lex_create(work, 1024, NULL);
	term_of = palloc(sizeof(int32) * Max(nposts, 1));
	p = 0;
	for (c = 0; c < ntsvs; c++)
	{
		TSVector	tsv;
		WordEntry  *e;
		int			j;

		CHECK_FOR_INTERRUPTS();
		if (tsv_nulls[c])
			continue;
		tsv = DatumGetTSVector(tsvs[c]);
		e = ARRPTR(tsv);
		for (j = 0; j < tsv->size; j++)
		{
			LexemeKey	key = {STRPTR(tsv) + e[j].pos, e[j].len};
			bool		found;
			WriteTerm  *w = lex_insert(terms, key, &found);

			if (!found)
				w->index = nterms++;
			term_of[p++] = w->index;
		}
	}
	starts = palloc0(sizeof(int64) * (nterms + 1));
	for (p = 0; p < nposts; p++)
		starts[term_of[p] + 1]++;
	for (t = 0; t < nterms; t++)
		starts[t + 1] += starts[t];

	/* Second pass: the postings grouped by term, each term's in the statement's order. */
	fill = palloc(sizeof(int64) * Max(nterms, 1));
	memcpy(fill, starts, sizeof(int64) * nterms);
	by_term = palloc(sizeof(WritePosting) * Max(nposts, 1));
	p = 0;
	for (c = 0; c < ntsvs; c++)
	{
		TSVector	tsv;
		WordEntry  *e;
		int			j;
		int64		dl = 0;
		int64		first = p;
		int64		cid;

		CHECK_FOR_INTERRUPTS();
		if (tsv_nulls[c])
			continue;
		tsv = DatumGetTSVector(tsvs[c]);
		e = ARRPTR(tsv);
		cid = DatumGetInt64(ids[c]);
		for (j = 0; j < tsv->size; j++)
			dl += entry_tf(tsv, &e[j]);
		if (dl > PG_INT32_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
					 errmsg("agentdb_accel.tsv_blocks: a chunk's length is out of range")));
		for (j = 0; j < tsv->size; j++)
		{
			WritePosting *w = &by_term[fill[term_of[first + j]]++];

			w->cid = cid;
			w->tf = (int16) entry_tf(tsv, &e[j]);
			w->dl = (int32) dl;
		}
		p = first + tsv->size;
	}

	/* Each term's lexeme, by its number. */
	lexemes = palloc(sizeof(LexemeKey) * Max(nterms, 1));
	{
		lex_iterator it;
		WriteTerm  *w;

		lex_start_iterate(terms, &it);
		while ((w = lex_iterate(terms, &it)) != NULL)
			lexemes[w->index] = w->key;
	}

	/* Each term's postings in chunk order, cut into blocks. */
	for (t = 0; t < nterms; t++)
	{
		text	   *term = cstring_to_text_with_len(lexemes[t].lexeme, (int) lexemes[t].len);

		CHECK_FOR_INTERRUPTS();
		put_blocks(rsinfo, term, &by_term[starts[t]], starts[t + 1] - starts[t], "agentdb_accel.tsv_blocks");
		pfree(term);
	}

	MemoryContextSwitchTo(old);
	MemoryContextDelete(work);
	PG_RETURN_VOID();
}

/*
 * agentdb_accel.tsv_total_len(tsvs tsvector[]) returns bigint: the sum of the tfs of every lexeme of the
 * tsvectors (a null one holds none), the length a statement adds to corpus_stats.total_len.
 */
Datum
agentdb_accel_tsv_total_len(PG_FUNCTION_ARGS)
{
	ArrayType  *a = write_array_arg(fcinfo, 0, TSVECTOROID);
	ArrayIterator it = array_create_iterator(a, 0, NULL);
	Datum		d;
	bool		isnull;
	int64		len = 0;

	while (array_iterate(it, &d, &isnull))
	{
		TSVector	tsv;
		WordEntry  *e;
		int			j;

		CHECK_FOR_INTERRUPTS();
		if (isnull)
			continue;
		tsv = DatumGetTSVector(d);
		e = ARRPTR(tsv);
		for (j = 0; j < tsv->size; j++)
			len += entry_tf(tsv, &e[j]);
		if ((Pointer) tsv != DatumGetPointer(d))
			pfree(tsv);
	}
	array_free_iterator(it);
	PG_RETURN_INT64(len);
}

/* A term's postings gathered from its blocks (merged_blocks). */
typedef struct Gathered
{
	WritePosting *post;
	int64		n;
	int64		cap;
} Gathered;

static void
gather(void *arg, QueryTerm *t, const PostingBlock *block)
{
	Gathered   *g = arg;
	int			i;

	if (g->n + block->n > g->cap)
	{
		g->cap = Max(g->cap * 2, g->n + block->n);
		g->post = repalloc_huge(g->post, sizeof(WritePosting) * g->cap);
	}
	for (i = 0; i < block->n; i++)
	{
		WritePosting *w = &g->post[g->n++];

		w->cid = block->cid[i];
		w->tf = (int16) block->tf[i];
		w->dl = block->dl[i];
	}
}

/*
 * agentdb_accel.merged_blocks(source_id int, terms text[])
 * returns table (term text, first_chunk bigint, last_chunk bigint, max_tf int, min_dl int, offs int4[],
 *                narrow_offs int2[], tfs int2[], dls int4[], narrow_dls int2[])
 *
 * Source source_id's blocks of each of `terms` (agentdb.posting_blocks, read as the cursor reads them, under
 * the caller's snapshot) cut again: the term's postings in chunk order, BLOCK a block. These are the blocks
 * agentdb_internal.block_sql cuts from the same postings when sorted; agentdb.lexical_optimize puts them in
 * place of the term's blocks, without a row a posting in between.
 */
Datum
agentdb_accel_merged_blocks(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext work;
	MemoryContext old;
	Postings	p;
	Datum	   *terms;
	bool	   *term_nulls;
	int			nterms;
	Gathered	g;
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		PG_RETURN_VOID();
	work = AllocSetContextCreate(CurrentMemoryContext, "agentdb_accel merged_blocks", ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(work);
	deconstruct_array_builtin(write_array_arg(fcinfo, 1, TEXTOID), TEXTOID, &terms, &term_nulls, &nterms);
	postings_open(&p, InvalidOid, PG_GETARG_INT32(0), 0, 0);
	g.cap = 1024;
	g.post = palloc(sizeof(WritePosting) * g.cap);
	for (i = 0; i < nterms; i++)
	{
		QueryTerm	t;

		CHECK_FOR_INTERRUPTS();
		if (term_nulls[i])
			continue;
		memset(&t, 0, sizeof(QueryTerm));
		t.term = terms[i];
		g.n = 0;
		scan_term(&p, &t, gather, &g);
		put_blocks(rsinfo, DatumGetTextPP(terms[i]), g.post, g.n, "agentdb_accel.merged_blocks");
	}
	postings_close(&p);
	MemoryContextSwitchTo(old);
	MemoryContextDelete(work);
	PG_RETURN_VOID();
}
