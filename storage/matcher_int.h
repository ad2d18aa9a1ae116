/* Internals of the query matcher shared by its parser and evaluator (matcher.c) and its
 * index-bounds analysis (bounds.c): the compiled filter tree. Not for use outside those two
 * files. */
#ifndef SDB_STORAGE_MATCHER_INT_H
#define SDB_STORAGE_MATCHER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stdint.h>

#include <bson/bson.h>

#include "common/bsonval.h"
#include "storage/matcher.h"
#include "storage/pipeline.h"

/* A compiled filter is a tree: logical nodes over path predicates (MongoDB's
 * MatchExpression). */
typedef enum {
	N_AND = 1, /* kids all true ({} is an empty AND: true) */
	N_OR,      /* any kid true */
	N_NOR,     /* no kid true */
	N_NOT,     /* kid[0] false */
	N_FALSE,   /* never ($in: [] style contradictions are expressed by their own op) */
	N_PATH,    /* a predicate on the values at path (or on the value itself: path NULL) */
	N_EXPR,    /* $expr: an aggregation expression over the whole document, true or not */
} node_kind;

typedef enum {
	OP_EQ = 1,
	OP_LT,
	OP_LTE,
	OP_GT,
	OP_GTE,
	OP_IN,
	OP_REGEX,
	OP_TYPE,
	OP_MOD,
	OP_EXISTS,
	OP_SIZE,
	OP_ELEM_VALUE,  /* $elemMatch, value form: kid[0] is a path-less AND */
	OP_ELEM_OBJECT, /* $elemMatch, object form: sub is a matcher on each element */
	OP_BITS_ALL_SET,   /* $bitsAllSet: bits, nbits, bitmask */
	OP_BITS_ALL_CLEAR, /* $bitsAllClear */
	OP_BITS_ANY_SET,   /* $bitsAnySet */
	OP_BITS_ANY_CLEAR, /* $bitsAnyClear */
} op_kind;

typedef struct node node;

typedef struct regex {
	pcre2_code *code;
	char *pattern;
	char *flags;
} regex;

struct node {
	node_kind kind;
	op_kind op;
	char *path; /* N_PATH: owned; NULL for value-level predicates */
	node **kids;
	size_t nkids;
	bson_value_t val; /* EQ/LT/LTE/GT/GTE operand (owned copy) */
	/* OP_IN: values (owned copies) and compiled regexes */
	bson_value_t *in;
	size_t nin;
	regex *in_re;
	size_t nin_re;
	bool in_null; /* the list holds null: matches missing */
	/* OP_IN with at least IN_SORTED_MIN values: pointers into `in` sorted by
	 * sdb_bson_value_cmp under in_sorted_coll (the thread's collation when the list was
	 * parsed), without null, undefined and NaN (answered by in_null, in_undef, in_nan), for
	 * a binary search; used only while the thread's collation is in_sorted_coll. */
	const bson_value_t **in_sorted;
	size_t nin_sorted;
	const sdb_bson_collator *in_sorted_coll;
	bool in_undef, in_nan;
	regex re;     /* OP_REGEX */
	uint8_t types[32]; /* OP_TYPE: bitmap over bson_type_t bytes */
	int64_t mod_d, mod_r;
	bool exists;  /* OP_EXISTS */
	/* OP_BITS_*: the bit positions tested (owned; from a number, a BinData or a list) and
	 * the same as a 64-bit mask for numbers (positions past 63 test bit 63: numbers are
	 * sign-extended), as mongod's BitTestMatchExpression */
	uint32_t *bits;
	size_t nbits;
	uint64_t bitmask;
	int64_t size; /* OP_SIZE */
	sdb_matcher *sub; /* OP_ELEM_OBJECT */
	sdb_expr *x; /* N_EXPR */
};

struct sdb_matcher {
	node *root;
	bool value_form; /* from sdb_matcher_new_elem with operators: root is path-less */
};

/* Is v a NaN (of any numeric type)? */
static inline bool is_nan(const bson_value_t *v)
{
	sdb_bson_num num;

	return sdb_bson_num_canon(v, &num) && num.cls == 0;
}

/* Internal flag of sdb_matcher_new_opts (bounds.c): $expr is accepted and not compiled
 * (its node has no expression), so a filter whose $expr reads `let` variables can be
 * analysed without them. Such a matcher is for analysis only: its $expr never matches. */
#define SDB_MATCHER_EXPR_SHAPE 0x100u

#endif
