/* Internals of the query matcher shared by its parser and evaluator (matcher.c), its
 * $bits* operators (matcher_bits.c) and its index-bounds analysis (bounds.c): the compiled
 * filter tree and the parser's error state. Not for use outside those files. */
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

/* The parser's state: where its error goes, and what the filter may hold. */
typedef struct perr {
	int code;
	char *err;
	size_t errlen;
	bool allow_expr; /* SDB_MATCHER_EXPR: $expr is built (else refused) */
	const bson_t *vars; /* user variables for $expr (sdb_matcher_new_vars), or NULL */
	bool in_elem;    /* parsing an $elemMatch object: $expr is refused there */
	bool expr_shape; /* SDB_MATCHER_EXPR_SHAPE: $expr's node holds no expression */
} perr;

#define ERR_BAD_VALUE 2 /* MongoDB's BadValue, most parse errors' code */

/* A parse error: sets pe->code to code and pe->err (up to pe->errlen bytes, when given)
 * to the printf-formatted message, for `return matcher_fail(...)`. Errors: always
 * SDB_EINVAL. (matcher.c) */
int matcher_fail(perr *pe, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* What matcher_num_i64 made of a value. */
typedef enum {
	MATCHER_I64_NOT_NUMBER = 0, /* not an int32, int64, double or decimal128 */
	MATCHER_I64_OUT_OF_RANGE,   /* NaN, an infinity, or outside [-2^63, 2^63) */
	MATCHER_I64_OK,             /* *out holds it, truncated toward zero */
} matcher_i64;

/* A number as a 64-bit integer, with the range checks $mod, $bits*, $size and $type's
 * codes share: int32 and int64 as they are; a double or decimal128 truncated toward zero
 * when finite and within int64 (a decimal is read through a long double). *whole (when
 * whole is not NULL) says whether the value was integral: for a decimal by an exact
 * comparison (2.0000000000000000000001 is not whole), which costs a conversion, so
 * evaluation passes NULL when it does not need it. Out of range: *out 0, *whole false.
 * Not a number: *out and *whole untouched. (matcher.c) */
matcher_i64 matcher_num_i64(const bson_value_t *v, int64_t *out, bool *whole);

/* The OP_BITS_* kind of a $bits* operator name ("$bitsAllSet" ...), or 0 for another
 * name. (matcher_bits.c) */
op_kind matcher_bits_op(const char *op);

/* The operand of $bitsAllSet/$bitsAllClear/$bitsAnySet/$bitsAnyClear (op) into n, as
 * mongod 6.0's parseBitTest (expression_parser.cpp): a non-negative integral number (a
 * bitmask; else 9 FailedToParse as parseIntegerElementToNonNegativeLong), an array of bit
 * positions (integral numbers 0..2^31-1; else 2 BadValue as parseBitPositionsArray) or a
 * BinData bitmask (any subtype; little-endian bytes); another type: 2 BadValue. Each
 * bit position is added to n (n->bits, n->bitmask; owned by n, freed with it). Returns 0.
 * Errors: SDB_EINVAL with pe's code (9 or 2, above) and message set. (matcher_bits.c) */
int matcher_parse_bits(node *n, const char *op, const bson_iter_t *it, perr *pe);

/* $bitsAllSet/$bitsAllClear/$bitsAnySet/$bitsAnyClear on one value, as mongod's
 * BitTestMatchExpression::matchesSingleElement: numbers as 64-bit two's complement
 * (doubles only when integral and within int64, else no match; decimals rounded half to
 * even as Decimal128::toLong), BinData bytes little-endian (bit 0 is the lowest bit of the
 * first byte; positions past the data are 0); other types never match. n is an
 * OP_BITS_* node from matcher_parse_bits. (matcher_bits.c) */
bool matcher_bits_value(const node *n, const bson_value_t *v);

/* Internal flag of sdb_matcher_new_opts (bounds.c): $expr is accepted and not compiled
 * (its node has no expression), so a filter whose $expr reads `let` variables can be
 * analysed without them. Such a matcher is for analysis only: its $expr never matches. */
#define SDB_MATCHER_EXPR_SHAPE 0x100u

#endif
