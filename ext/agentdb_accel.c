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
 * a chunk holding term t adds wk_t * tf / (tf + k1 * (1 - b) + k1 * b / avgdl * dl), evaluated in that order.
 *
 * Top k by MaxScore, term at a time. Each term's contribution is at most ub_t (at its max_tf and min_dl).
 * Terms are taken in descending ub; their postings are summed into an accumulator while the bounds of the
 * terms not taken yet sum to at least theta, the k-th best partial score (a chunk none of the terms taken so
 * far holds could still rank). The remaining terms can only add to chunks already held: those whose score
 * plus the remaining bounds reach theta stay candidates, and each remaining term is added to them, by a scan
 * of its postings that skips blocks holding no candidate (on the index tuple) or unable to lift one to theta
 * (on the block's max_tf and min_dl), or by one index probe a candidate when they are few beside the term's
 * postings. The accumulator is an array of partial scores in pages of consecutive chunk ids while the
 * essential terms are summed; theta after each is found among the best k chunks that term reached (a heap
 * kept as it is summed) and the best k before it. The candidates leave the accumulator once, as an array in
 * chunk order (its pages in order), which each scan merges with the blocks' postings and each pruning
 * compacts in place. The result is the k best chunks by (score desc, chunk id) among every chunk holding a
 * query term, visible to the caller's filters or not: the caller applies them.
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

PG_MODULE_MAGIC_EXT(.name = "agentdb_accel", .version = "1.4");

PG_FUNCTION_INFO_V1(agentdb_accel_bm25_topk_blocks);
PG_FUNCTION_INFO_V1(agentdb_accel_tsv_blocks);
PG_FUNCTION_INFO_V1(agentdb_accel_tsv_total_len);
PG_FUNCTION_INFO_V1(agentdb_accel_merged_blocks);

/* A block holds the postings of up to this many chunks of one term. */
#define BLOCK 128

/*
 * A remaining term is added to the candidates by one index probe each while they number less than
 * 1/PROBE_SHARE of its postings, else by a scan of its postings. A probe (a btree descent, the rows of the
 * blocks its range covers) costs far more than a block a scan passes over on its index tuple, so scans win
 * down to few candidates (bench/LOG.md, 2026-12-03).
 */
#define PROBE_SHARE 1024

/*
 * The accumulator: chunk id -> partial score, in pages of ACC_PAGE consecutive ids made as postings first reach
 * them. A term's postings come in ascending ids, so consecutive ones mostly fall in the page of the one before
 * (no hashing), and the pages read in order give the held chunks in chunk order (no sorting).
 */
#define ACC_PAGE_BITS 12
#define ACC_PAGE (1 << ACC_PAGE_BITS)

typedef struct AccData
{
	double		score[ACC_PAGE];
	uint16		stamp[ACC_PAGE];	/* 1 + the last term that added to the chunk; 0: no term yet */
	uint64		member[ACC_PAGE / 64];	/* bit o: chunk o has a score (its stamp is not 0) */
} AccData;

typedef struct AccPage
{
	int64		pageno;			/* cid >> ACC_PAGE_BITS */
	AccData    *data;
	char		status;
} AccPage;

#define SH_PREFIX accpage
#define SH_ELEMENT_TYPE AccPage
#define SH_KEY_TYPE int64
#define SH_KEY pageno
#define SH_HASH_KEY(tb, key) ((uint32) murmurhash64((uint64) (key)))
#define SH_EQUAL(tb, a, b) ((a) == (b))
#define SH_SCOPE static inline
#define SH_DECLARE
#define SH_DEFINE
#include "lib/simplehash.h"

typedef struct Acc
{
	accpage_hash *pages;
	MemoryContext cxt;
	int64		last_pageno;	/* the page a posting last reached, and its data */
	AccData    *last;
	int64		members;		/* chunks with a partial score */
} Acc;

#if defined(__GNUC__) || defined(__clang__)
#define prefetch_for_write(addr) __builtin_prefetch((addr), 1)
#else
#define prefetch_for_write(addr) ((void) (addr))
#endif

/* The page of chunk ids pageno << ACC_PAGE_BITS and on, made (no chunk stamped) when absent. */
static inline AccData *
acc_page(Acc *a, int64 pageno)
{
	if (pageno != a->last_pageno)
	{
		bool		found;
		AccPage    *page = accpage_insert(a->pages, pageno, &found);

		if (!found)
		{
			page->data = MemoryContextAlloc(a->cxt, sizeof(AccData));
			memset(page->data->stamp, 0, sizeof(page->data->stamp));
			memset(page->data->member, 0, sizeof(page->data->member));
		}
		a->last_pageno = pageno;
		a->last = page->data;
	}
	return a->last;
}

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
	IndexScanDesc probe_scan;	/* and the blocks that may hold a chunk */
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

static Relation
open_table(const char *name)
{
	Oid			relid = get_relname_relid(name, get_namespace_oid("agentdb", false));
	AclResult	acl;

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("agentdb.%s does not exist", name)));
	acl = pg_class_aclcheck(relid, GetUserId(), ACL_SELECT);
	if (acl != ACLCHECK_OK)
		aclcheck_error(acl, OBJECT_TABLE, name);
	/* The cursor reads the heap directly: refuse a role whose reads row security would filter. */
	if (check_enable_rls(relid, InvalidOid, false) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("row security applies to agentdb.%s for the current role", name),
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

static void
postings_open(Postings *p, int32 source_id, double k_len, double k_dl)
{
	Oid			index_oid;

	memset(p, 0, sizeof(Postings));
	p->source_id = source_id;
	p->k_len = k_len;
	p->k_dl = k_dl;
	p->heap = open_table("posting_blocks");
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
	p->term_collation = p->index->rd_indcollation[1];
	p->snapshot = GetActiveSnapshot();
	p->slot = table_slot_create(p->heap, NULL);
	p->term_scan = index_beginscan(p->heap, p->index, p->snapshot, NULL, 2, 0);
	/* A scan may skip a block on its index tuple's first_chunk, without reading the block's row. */
	p->term_scan->xs_want_itup = true;
	p->probe_scan = index_beginscan(p->heap, p->index, p->snapshot, NULL, 4, 0);
	p->scratch = AllocSetContextCreate(CurrentMemoryContext, "agentdb_accel block", ALLOCSET_SMALL_SIZES);
}

static void
postings_close(Postings *p)
{
	index_endscan(p->term_scan);
	index_endscan(p->probe_scan);
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
 * The postings of the block in p->slot into *out, chunk ids made absolute. Its arrays (offsets and lengths
 * each wide or narrow, migrations/0025_narrow_posting_blocks.sql) are detoasted into p->scratch, which is reset
 * before it returns; a block whose arrays differ in length, hold nulls or more than BLOCK postings is refused.
 */
static void
read_block(Postings *p, PostingBlock *out)
{
	bool		isnull;
	int64		first = DatumGetInt64(slot_getattr(p->slot, p->att_first, &isnull));
	ArrayType  *a_offs;
	ArrayType  *a_tfs;
	ArrayType  *a_dls;
	bool		wide_offs;
	bool		wide_dls;
	const int16 *tfs;
	MemoryContext old;
	int			n;
	int			i;

	old = MemoryContextSwitchTo(p->scratch);
	a_offs = block_array(p, p->att_offs, p->att_narrow_offs, &wide_offs);
	a_tfs = DatumGetArrayTypeP(slot_getattr(p->slot, p->att_tfs, &isnull));
	a_dls = block_array(p, p->att_dls, p->att_narrow_dls, &wide_dls);
	MemoryContextSwitchTo(old);
	n = ArrayGetNItems(ARR_NDIM(a_offs), ARR_DIMS(a_offs));
	if (n > BLOCK || ARR_HASNULL(a_offs) || ARR_HASNULL(a_tfs) || ARR_HASNULL(a_dls) ||
		ArrayGetNItems(ARR_NDIM(a_tfs), ARR_DIMS(a_tfs)) != n ||
		ArrayGetNItems(ARR_NDIM(a_dls), ARR_DIMS(a_dls)) != n ||
		ARR_ELEMTYPE(a_offs) != (wide_offs ? INT4OID : INT2OID) || ARR_ELEMTYPE(a_tfs) != INT2OID ||
		ARR_ELEMTYPE(a_dls) != (wide_dls ? INT4OID : INT2OID))
		malformed_block(p);
	if (wide_offs)
		for (i = 0; i < n; i++)
			out->cid[i] = first + ((const int32 *) ARR_DATA_PTR(a_offs))[i];
	else
		for (i = 0; i < n; i++)
			out->cid[i] = first + ((const int16 *) ARR_DATA_PTR(a_offs))[i];
	tfs = (const int16 *) ARR_DATA_PTR(a_tfs);
	for (i = 0; i < n; i++)
		out->tf[i] = tfs[i];
	if (wide_dls)
		for (i = 0; i < n; i++)
			out->dl[i] = ((const int32 *) ARR_DATA_PTR(a_dls))[i];
	else
		for (i = 0; i < n; i++)
			out->dl[i] = ((const int16 *) ARR_DATA_PTR(a_dls))[i];
	out->n = n;
	MemoryContextReset(p->scratch);
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
 * Whether a chunk of [lo, hi] is among the candidates `cands` (n of them, sorted by chunk id); none given:
 * always.
 */
static inline bool
range_holds(const Hit *cands, int64 n, int64 lo, int64 hi)
{
	int64		l;

	if (cands == NULL)
		return true;
	l = lower_bound(cands, n, lo);
	return l < n && cands[l].cid <= hi;
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
 * What a scan of a remaining term skips: the blocks that hold none of the candidates `cands` (sorted by chunk
 * id), and those whose largest contribution (at the block's max_tf and min_dl) cannot lift any candidate they
 * may hold to theta, with `rest` (the bounds of the terms after it) added. A candidate a skipped block leaves
 * short of the term's contribution cannot reach theta: the next pruning drops it, or the final cut does, and
 * theta, the k-th best of scores that are all at most the chunks' true ones, never exceeds the true k-th best.
 */
typedef struct Skip
{
	const Hit  *cands;
	int64		n;
	double		theta;
	double		rest;
} Skip;

/*
 * Call `visit` on every block of term t's postings, but those `skip` (when given) skips undecoded. A block holds
 * chunks of [first_chunk, first_chunk + max_span]: a block none of whose candidates lie there is skipped on
 * its index tuple, without reading its row.
 */
typedef void (*BlockVisitor) (void *arg, QueryTerm *t, const PostingBlock *block);

static void
scan_term(Postings *p, QueryTerm *t, const Skip *skip, BlockVisitor visit, void *arg)
{
	IndexScanDesc scan = p->term_scan;
	ScanKeyData keys[2];
	PostingBlock *block = palloc(sizeof(PostingBlock));
	bool		isnull;

	term_keys(p, keys, t);
	index_rescan(scan, keys, 2, NULL, 0);
	while (index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		CHECK_FOR_INTERRUPTS();
		if (skip != NULL)
		{
			int64		first = DatumGetInt64(index_getattr(scan->xs_itup, 3, scan->xs_itupdesc, &isnull));

			if (!range_holds(skip->cands, skip->n, first, first + t->max_span))
				continue;
		}
		if (!index_fetch_heap(scan, p->slot))
			continue;			/* no version of the row visible to the snapshot */
		if (skip != NULL)
		{
			double		add = contribution(p, t->wk,
										   DatumGetInt32(slot_getattr(p->slot, p->att_max_tf, &isnull)),
										   DatumGetInt32(slot_getattr(p->slot, p->att_min_dl, &isnull))) +
				skip->rest;
			int64		first = DatumGetInt64(slot_getattr(p->slot, p->att_first, &isnull));
			int64		last = DatumGetInt64(slot_getattr(p->slot, p->att_last, &isnull));

			if (!may_reach(skip->cands, skip->n, first, last, add, skip->theta))
				continue;
		}
		read_block(p, block);
		visit(arg, t, block);
	}
	pfree(block);
}

/* Term t's contribution to chunk `cid`, or 0 when the chunk does not hold it: one index probe. */
static double
probe(Postings *p, QueryTerm *t, int64 cid, PostingBlock *block)
{
	ScanKeyData keys[4];
	bool		isnull;

	term_keys(p, keys, t);
	ScanKeyInit(&keys[2], 3, BTGreaterEqualStrategyNumber, F_INT8GE, Int64GetDatum(cid - t->max_span));
	ScanKeyInit(&keys[3], 3, BTLessEqualStrategyNumber, F_INT8LE, Int64GetDatum(cid));
	index_rescan(p->probe_scan, keys, 4, NULL, 0);
	while (index_getnext_slot(p->probe_scan, ForwardScanDirection, p->slot))
	{
		int			i;

		CHECK_FOR_INTERRUPTS();
		if (DatumGetInt64(slot_getattr(p->slot, p->att_last, &isnull)) < cid)
			continue;
		read_block(p, block);
		for (i = 0; i < block->n; i++)
		{
			CHECK_FOR_INTERRUPTS();
			if (block->cid[i] == cid)
				return contribution(p, t->wk, block->tf[i], block->dl[i]);
		}
	}
	return 0;
}

/*
 * What an essential term's postings add to, and the best k chunks it reached: a min-heap by score of at most k
 * of them, each with its score as the term first reached it (lower than the chunk's score after the term only
 * where the chunk had two postings of the term). A posting that does not beat the heap's least score once it
 * holds k costs one comparison.
 */
typedef struct Accumulate
{
	Acc		   *acc;
	Postings   *p;
	uint16		stamp;			/* the term's stamp */
	int64		k;
	Hit		   *best;			/* best[0]: the least score of the heap */
	int64		nbest;
	int64		cap;
} Accumulate;

/* Offer chunk cid, of this score, to the heap of the best k. */
static void
offer_best(Accumulate *a, int64 cid, double score)
{
	Hit		   *h = a->best;
	int64		i;

	if (a->nbest < a->k)
	{
		if (a->nbest == a->cap)
		{
			a->cap = Min(a->cap * 2, a->k);
			h = a->best = repalloc_huge(a->best, sizeof(Hit) * a->cap);
		}
		/* sift up */
		for (i = a->nbest++; i > 0 && h[(i - 1) / 2].score > score; i = (i - 1) / 2)
			h[i] = h[(i - 1) / 2];
		h[i].cid = cid;
		h[i].score = score;
		return;
	}
	if (score <= h[0].score)
		return;
	/* the least gives way: sift down */
	for (i = 0;;)
	{
		int64		c = 2 * i + 1;

		if (c >= a->nbest)
			break;
		if (c + 1 < a->nbest && h[c + 1].score < h[c].score)
			c++;
		if (h[c].score >= score)
			break;
		h[i] = h[c];
		i = c;
	}
	h[i].cid = cid;
	h[i].score = score;
}

/*
 * Essential terms: every posting adds to the accumulator. A block's postings fall far apart in it at a million
 * chunks (each a cache miss), so their slots are first looked up and asked of memory all at once, then added to.
 */
static void
accumulate(void *arg, QueryTerm *t, const PostingBlock *block)
{
	Accumulate *a = arg;
	AccData    *pages[BLOCK];
	int			i;

	for (i = 0; i < block->n; i++)
	{
		int64		cid = block->cid[i];
		int			o = (int) (cid & (ACC_PAGE - 1));

		pages[i] = acc_page(a->acc, cid >> ACC_PAGE_BITS);
		prefetch_for_write(&pages[i]->score[o]);
		prefetch_for_write(&pages[i]->stamp[o]);
	}
	for (i = 0; i < block->n; i++)
	{
		int64		cid = block->cid[i];
		AccData    *d = pages[i];
		int			o = (int) (cid & (ACC_PAGE - 1));
		double		c = contribution(a->p, t->wk, block->tf[i], block->dl[i]);

		if (d->stamp[o] == 0)
		{
			d->score[o] = c;
			d->member[o >> 6] |= UINT64CONST(1) << (o & 63);
			a->acc->members++;
		}
		else
			d->score[o] += c;
		if (d->stamp[o] != a->stamp)
		{
			d->stamp[o] = a->stamp;
			if (a->nbest < a->k || d->score[o] > a->best[0].score)
				offer_best(a, cid, d->score[o]);
		}
	}
}

/*
 * The chunks still in play once the essential terms are summed, sorted by chunk id, with their scores so far:
 * the remaining terms add to them by a merge of each block's postings with this array (no hashing), and
 * pruning keeps them in order (no sorting).
 */
typedef struct Held
{
	Hit		   *hit;
	int64		n;
	Postings   *p;
} Held;

/*
 * Remaining terms: postings add to the held chunks only. A block's chunk ids usually ascend (a write through
 * the SQL statements may store them in another order), so the position in the held array moves forward along
 * the block, and is searched again when an id comes lower than the one before.
 */
static void
add_to_held(void *arg, QueryTerm *t, const PostingBlock *block)
{
	Held	   *h = arg;
	int64		pos = lower_bound(h->hit, h->n, block->cid[0]);
	int			i;

	for (i = 0; i < block->n; i++)
	{
		int64		cid = block->cid[i];

		if (i > 0 && cid < block->cid[i - 1])
			pos = lower_bound(h->hit, h->n, cid);
		while (pos < h->n && h->hit[pos].cid < cid)
			pos++;
		if (pos < h->n && h->hit[pos].cid == cid)
			h->hit[pos].score += contribution(h->p, t->wk, block->tf[i], block->dl[i]);
	}
}

/*
 * The k-th largest score of hits[0..n) (n >= k >= 1); reorders the array so that its first k are the k
 * largest.
 */
static double
kth_hit(Hit *s, int64 n, int64 k)
{
	int64		lo = 0;
	int64		hi = n - 1;
	int64		target = k - 1;

	while (lo < hi)
	{
		double		pivot = s[lo + (hi - lo) / 2].score;
		int64		i = lo;
		int64		j = hi;

		CHECK_FOR_INTERRUPTS();
		while (i <= j)
		{
			while (s[i].score > pivot)
				i++;
			while (s[j].score < pivot)
				j--;
			if (i <= j)
			{
				Hit			x = s[i];

				s[i] = s[j];
				s[j] = x;
				i++;
				j--;
			}
		}
		if (target <= j)
			hi = j;
		else if (target >= i)
			lo = i;
		else
			break;
	}
	return s[target].score;
}

/* A buffer of hits grown to hold n or more (its contents are not kept). */
typedef struct HitBuf
{
	Hit		   *hit;
	int64		cap;
} HitBuf;

static Hit *
hit_buf(HitBuf *b, int64 n)
{
	if (n > b->cap)
	{
		if (b->hit != NULL)
			pfree(b->hit);
		b->cap = Max(n, 2 * b->cap);
		b->hit = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(Hit) * b->cap);
	}
	return b->hit;
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

/*
 * theta once an essential term is summed (`a`, the best k chunks it reached): the k-th best partial score. The
 * best k now are among the best k the term reached and the best k before it (any other kept its score, below
 * those k), so the best k before it that the term did not reach join the heap; top[0..*ntop) (room for k)
 * becomes the best k now.
 */
static double
essential_theta(Accumulate *a, int64 *top, int64 *ntop)
{
	int64		i;

	for (i = 0; i < *ntop; i++)
	{
		AccData    *d = acc_page(a->acc, top[i] >> ACC_PAGE_BITS);
		int			o = (int) (top[i] & (ACC_PAGE - 1));

		if (d->stamp[o] != a->stamp)
			offer_best(a, top[i], d->score[o]);
	}
	*ntop = a->nbest;
	for (i = 0; i < a->nbest; i++)
		top[i] = a->best[i].cid;
	return a->nbest < a->k ? 0 : below(a->best[0].score);
}

/* theta over the held chunks. */
static double
held_threshold(const Held *h, int64 k, HitBuf *buf)
{
	Hit		   *hits;

	if (h->n < k)
		return 0;
	hits = hit_buf(buf, h->n);
	memcpy(hits, h->hit, sizeof(Hit) * h->n);
	return below(kth_hit(hits, h->n, k));
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

static int
term_order(const void *a, const void *b)
{
	const QueryTerm *x = a;
	const QueryTerm *y = b;

	if (x->ub != y->ub)
		return x->ub > y->ub ? -1 : 1;
	return x->df < y->df ? -1 : (x->df > y->df ? 1 : 0);
}

static int
page_order(const void *a, const void *b)
{
	int64		x = (*(AccPage *const *) a)->pageno;
	int64		y = (*(AccPage *const *) b)->pageno;

	return x < y ? -1 : (x > y ? 1 : 0);
}

/*
 * The chunks of the accumulator whose score plus `bound` reaches theta, in chunk order (its pages in order, each
 * page's chunks by its bitmap of members: the scores of chunks never reached are not read).
 */
static void
hold(Acc *a, double bound, double theta, Held *h)
{
	accpage_iterator it;
	AccPage    *page;
	AccPage   **pages = palloc(sizeof(AccPage *) * Max(a->pages->members, 1));
	int64		npages = 0;
	int64		i;

	accpage_start_iterate(a->pages, &it);
	while ((page = accpage_iterate(a->pages, &it)) != NULL)
		pages[npages++] = page;
	qsort(pages, npages, sizeof(AccPage *), page_order);
	h->hit = MemoryContextAllocHuge(CurrentMemoryContext, sizeof(Hit) * Max(a->members, 1));
	h->n = 0;
	for (i = 0; i < npages; i++)
	{
		const AccData *d = pages[i]->data;
		int			w;

		CHECK_FOR_INTERRUPTS();
		for (w = 0; w < ACC_PAGE / 64; w++)
		{
			uint64		bits = d->member[w];

			while (bits != 0)
			{
				int			o = w * 64 + pg_rightmost_one_pos64(bits);

				bits &= bits - 1;
				if (d->score[o] + bound >= theta)
				{
					h->hit[h->n].cid = pages[i]->pageno * ACC_PAGE + o;
					h->hit[h->n].score = d->score[o];
					h->n++;
				}
			}
		}
	}
	pfree(pages);
}

/* Drop the held chunks whose score plus `bound` stays below theta, keeping the others in order. */
static void
prune_held(Held *h, double bound, double theta)
{
	int64		i;
	int64		n = 0;

	for (i = 0; i < h->n; i++)
		if (h->hit[i].score + bound >= theta)
			h->hit[n++] = h->hit[i];
	h->n = n;
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
 *                         min_dls int[], max_spans bigint[], k int, avgdl float8, k1 float8, b float8)
 * returns table (cid bigint, bm25 float8)
 */
Datum
agentdb_accel_bm25_topk_blocks(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext work;
	MemoryContext old;
	int32		source_id;
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
	QueryTerm  *qt;
	double	   *after;
	Postings	p;
	Acc			acc;
	HitBuf		buf = {NULL, 0};
	int64	   *top = NULL;
	int64		ntop = 0;
	int64		topcap = 0;
	double		theta = 0;
	int			i;
	int			j;
	Accumulate	arg;
	Held		held;
	Skip		skip;
	int64		nhits = 0;
	int64		h;
	PostingBlock	   *block;

	for (i = 0; i < 11; i++)
		if (PG_ARGISNULL(i) && (i < 1 || i > 6))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("argument %d of agentdb_accel.bm25_topk must not be null", i + 1)));
	InitMaterializedSRF(fcinfo, 0);
	source_id = PG_GETARG_INT32(0);
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

	postings_open(&p, source_id, k1 * (1 - b), k1 * b / avgdl);

	/* The terms by bound, highest first; after[i], the sum of the bounds of the terms after i. */
	qt = palloc(sizeof(QueryTerm) * nterms);
	for (i = 0; i < nterms; i++)
	{
		qt[i].term = terms[i];
		qt[i].wk = weights[i];
		qt[i].df = dfs[i];
		qt[i].max_span = max_spans[i];
		qt[i].ub = contribution(&p, weights[i], max_tfs[i], min_dls[i]);
	}
	qsort(qt, nterms, sizeof(QueryTerm), term_order);
	after = palloc(sizeof(double) * (nterms + 1));
	after[nterms] = 0;
	for (i = nterms - 1; i >= 0; i--)
		after[i] = after[i + 1] + qt[i].ub;

	/*
	 * Essential terms: summed while a chunk none of them holds could still reach theta. Each term's stamp tells
	 * the chunks it reached from the others (stamps wrap past 65,535 terms: a chunk then left out of theta's
	 * reckoning only lowers theta, which stays safe). top: the best k so far, at most as many as the chunks
	 * held.
	 */
	acc.pages = accpage_create(work, 256, NULL);
	acc.cxt = work;
	acc.last_pageno = PG_INT64_MIN;
	acc.last = NULL;
	acc.members = 0;
	arg.acc = &acc;
	arg.p = &p;
	arg.k = k;
	arg.cap = Min(k, 1024);
	arg.best = MemoryContextAllocHuge(work, sizeof(Hit) * arg.cap);
	for (i = 0; i < nterms && (i == 0 || after[i] >= theta); i++)
	{
		int64		need;

		arg.stamp = (uint16) (i % PG_UINT16_MAX) + 1;
		arg.nbest = 0;
		scan_term(&p, &qt[i], NULL, accumulate, &arg);
		need = Max(Min(k, acc.members), 1);
		if (need > topcap)
		{
			top = top == NULL ? MemoryContextAllocHuge(work, sizeof(int64) * need)
				: repalloc_huge(top, sizeof(int64) * need);
			topcap = need;
		}
		theta = essential_theta(&arg, top, &ntop);
	}
	pfree(arg.best);

	/* The rest: added to the chunks that can still reach theta, which rises as they do. */
	hold(&acc, after[i], theta, &held);
	held.p = &p;
	for (j = i; j < nterms; j++)
	{
		if (j > i)
			prune_held(&held, after[j], theta);
		if (held.n * PROBE_SHARE < qt[j].df)
		{
			block = palloc(sizeof(PostingBlock));
			for (h = 0; h < held.n; h++)
			{
				CHECK_FOR_INTERRUPTS();
				held.hit[h].score += probe(&p, &qt[j], held.hit[h].cid, block);
			}
			pfree(block);
		}
		else
		{
			skip.cands = held.hit;
			skip.n = held.n;
			skip.theta = theta;
			skip.rest = after[j + 1];
			scan_term(&p, &qt[j], &skip, add_to_held, &held);
		}
		theta = held_threshold(&held, k, &buf);
	}
	postings_close(&p);

	/* The best k held, by score and chunk id. */
	for (h = 0; h < held.n; h++)
	{
		CHECK_FOR_INTERRUPTS();
		if (held.hit[h].score >= theta)
		{
			held.hit[nhits].cid = held.hit[h].cid;
			held.hit[nhits].score = round_score(held.hit[h].score);
			nhits++;
		}
	}
	qsort(held.hit, nhits, sizeof(Hit), hit_order);

	MemoryContextSwitchTo(old);
	for (h = 0; h < Min(nhits, k); h++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = Int64GetDatum(held.hit[h].cid);
		values[1] = Float8GetDatum(held.hit[h].score);
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
	postings_open(&p, PG_GETARG_INT32(0), 0, 0);
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
		scan_term(&p, &t, NULL, gather, &g);
		put_blocks(rsinfo, DatumGetTextPP(terms[i]), g.post, g.n, "agentdb_accel.merged_blocks");
	}
	postings_close(&p);
	MemoryContextSwitchTo(old);
	MemoryContextDelete(work);
	PG_RETURN_VOID();
}
