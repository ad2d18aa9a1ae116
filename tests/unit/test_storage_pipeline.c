/* Unit tests of storage/pipeline.c: MongoDB's documented examples for each stage and
 * expression, error codes, the memory bound and the pushdown helper. Outputs are compared
 * as canonical extended JSON (types and field order count). The stages that read other
 * collections ($lookup, $unionWith, $graphLookup) are in test_storage_pipeline_lookup.c. */

/* The modules under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../storage/pipeline.c"
#include "../../storage/pipeline_parse.c"
#include "../../storage/pipeline_expr.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "storage/pipeline.h"

#include "pipeline_check.h"
static const char *sales =
	"[{'_id': 1, 'item': 'abc', 'price': 10, 'quantity': 2},"
	" {'_id': 2, 'item': 'jkl', 'price': 20, 'quantity': 1},"
	" {'_id': 3, 'item': 'xyz', 'price': 5, 'quantity': 10},"
	" {'_id': 4, 'item': 'xyz', 'price': 5, 'quantity': 20},"
	" {'_id': 5, 'item': 'abc', 'price': 10, 'quantity': 10},"
	" {'_id': 6, 'item': 'def', 'price': 7.5, 'quantity': 5},"
	" {'_id': 7, 'item': 'def', 'price': 7.5, 'quantity': 10},"
	" {'_id': 8, 'item': 'abc', 'price': 10, 'quantity': 6}]";

/* https://www.mongodb.com/docs/manual/reference/operator/aggregation/group/ */
static void test_group(void **state)
{
	(void)state;
	check("[{'$group': {'_id': '$item', 'totalSaleAmount': {'$sum': {'$multiply': ['$price', '$quantity']}},"
	      " 'count': {'$sum': 1}, 'avgQ': {'$avg': '$quantity'}, 'maxQ': {'$max': '$quantity'},"
	      " 'minP': {'$min': '$price'}, 'first': {'$first': '$_id'}, 'last': {'$last': '$_id'},"
	      " 'n': {'$count': {}}}}, {'$sort': {'_id': 1}}]",
	      sales,
	      "[{'_id': 'abc', 'totalSaleAmount': 180, 'count': 3, 'avgQ': 6.0, 'maxQ': 10, 'minP': 10, 'first': 1, 'last': 8, 'n': 3},"
	      " {'_id': 'def', 'totalSaleAmount': 112.5, 'count': 2, 'avgQ': 7.5, 'maxQ': 10, 'minP': 7.5, 'first': 6, 'last': 7, 'n': 2},"
	      " {'_id': 'jkl', 'totalSaleAmount': 20, 'count': 1, 'avgQ': 1.0, 'maxQ': 1, 'minP': 20, 'first': 2, 'last': 2, 'n': 1},"
	      " {'_id': 'xyz', 'totalSaleAmount': 150, 'count': 2, 'avgQ': 15.0, 'maxQ': 20, 'minP': 5, 'first': 3, 'last': 4, 'n': 2}]");
	/* _id null: one group over everything; $push and $addToSet */
	check("[{'$match': {'price': {'$lt': 10}}}, {'$group': {'_id': null, 'items': {'$push': '$item'},"
	      " 'set': {'$addToSet': '$item'}, 'q': {'$sum': '$quantity'}}}]",
	      sales, "[{'_id': null, 'items': ['xyz', 'xyz', 'def', 'def'], 'set': ['xyz', 'def'], 'q': 45}]");
	/* a document _id; numbers of different types group together; missing fields group as null */
	check("[{'$group': {'_id': {'k': '$k'}, 'c': {'$sum': 1}}}]",
	      "[{'k': 1}, {'k': 1.0}, {'k': {'$numberLong': '1'}}, {'x': 1}, {'k': null}]",
	      "[{'_id': {'k': 1}, 'c': 3}, {'_id': {}, 'c': 1}, {'_id': {'k': null}, 'c': 1}]");
	check("[{'$group': {'_id': '$k', 'c': {'$sum': 1}}}]",
	      "[{'k': 1}, {'k': 1.0}, {'x': 1}, {'k': null}]", "[{'_id': 1, 'c': 2}, {'_id': null, 'c': 2}]");
	/* $sum widens int32 -> int64 and ignores non-numbers; $avg of nothing numeric is null */
	check("[{'$group': {'_id': null, 's': {'$sum': '$v'}, 'a': {'$avg': '$s'}, 'm': {'$min': '$nope'}}}]",
	      "[{'v': 2147483647}, {'v': 1}, {'v': 'str'}]",
	      "[{'_id': null, 's': {'$numberLong': '2147483648'}, 'a': null, 'm': null}]");
	/* $stdDevPop / $stdDevSamp (AccumulatorStdDev: Welford over the numbers as doubles,
	 * others ignored; null without numbers, and for the sample of one) */
	check("[{'$group': {'_id': '$g', 'p': {'$stdDevPop': '$v'}, 's': {'$stdDevSamp': '$v'}}},"
	      " {'$sort': {'_id': 1}}]",
	      "[{'g': 1, 'v': 2}, {'g': 1, 'v': 4}, {'g': 1, 'v': 4.0}, {'g': 1, 'v': {'$numberLong': '4'}},"
	      " {'g': 1, 'v': 5}, {'g': 1, 'v': {'$numberDecimal': '5'}}, {'g': 1, 'v': 7}, {'g': 1, 'v': 9},"
	      " {'g': 1, 'v': 'x'}, {'g': 1}, {'g': 2, 'v': 3}, {'g': 3, 'v': null}]",
	      "[{'_id': 1, 'p': 2.0, 's': 2.138089935299395}, {'_id': 2, 'p': 0.0, 's': null},"
	      " {'_id': 3, 'p': null, 's': null}]");
	check("[{'$project': {'_id': 0, 'a': {'$stdDevPop': [1, 2, 3, 4]}, 'b': {'$stdDevPop': '$arr'},"
	      " 'c': {'$stdDevSamp': [1, 'x', 3]}, 'd': {'$stdDevSamp': '$arr'}, 'e': {'$stdDevPop': []},"
	      " 'f': {'$stdDevPop': ['$arr', 1]}, 'g': {'$stdDevSamp': 5}}}]",
	      "[{'arr': [1, 'x', 3]}]",
	      "[{'a': 1.118033988749895, 'b': 1.0, 'c': 1.4142135623730951, 'd': 1.4142135623730951,"
	      " 'e': null, 'f': 0.0, 'g': null}]");
	/* $addToSet keeps the first of equal values (1, 1.0 and NumberLong(1) are equal) */
	check("[{'$group': {'_id': null, 's': {'$addToSet': '$v'}}}]",
	      "[{'v': 1}, {'v': 1.0}, {'v': 'a'}, {'v': {'$numberLong': '1'}}, {'v': [1]}, {'v': 'a'}, {}]",
	      "[{'_id': null, 's': [1, 'a', [1]]}]");
	/* empty input: no group at all */
	check("[{'$group': {'_id': null, 'c': {'$sum': 1}}}]", "[]", "[]");
	check_err("[{'$group': {'total': {'$sum': 1}}}]", "[]", 15955, "must include an _id");
	check_err("[{'$group': {'_id': null, 'total': 1}}]", "[]", 40234, "accumulator object");
	check_err("[{'$group': {'_id': null, 'total': {'$median': 1}}}]", "[]", 15952, "$median");
}

/* https://www.mongodb.com/docs/manual/reference/operator/aggregation/count/ */
static void test_count(void **state)
{
	(void)state;
	const char *scores = "[{'_id': 1, 'subject': 'History', 'score': 88}, {'_id': 2, 'subject': 'History', 'score': 92},"
			     " {'_id': 3, 'subject': 'History', 'score': 97}, {'_id': 4, 'subject': 'History', 'score': 71},"
			     " {'_id': 5, 'subject': 'History', 'score': 79}, {'_id': 6, 'subject': 'History', 'score': 83}]";

	check("[{'$match': {'score': {'$gt': 80}}}, {'$count': 'passing_scores'}]", scores,
	      "[{'passing_scores': 4}]");
	check("[{'$match': {'score': {'$gt': 100}}}, {'$count': 'n'}]", scores, "[]");
	check_err("[{'$count': ''}]", "[]", 40157, NULL);
	check_err("[{'$count': '$x'}]", "[]", 40158, NULL);
	check_err("[{'$count': 'a.b'}]", "[]", 40160, NULL);
	check_err("[{'$count': 1}]", "[]", 40156, NULL);
}

/* https://www.mongodb.com/docs/manual/reference/operator/aggregation/unwind/ */
static void test_unwind(void **state)
{
	(void)state;
	const char *inv = "[{'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': ['S', 'M', 'L']},"
			  " {'_id': 2, 'item': 'EFG', 'price': 120, 'sizes': []},"
			  " {'_id': 3, 'item': 'IJK', 'price': 160, 'sizes': 'M'},"
			  " {'_id': 4, 'item': 'LMN', 'price': 10},"
			  " {'_id': 5, 'item': 'XYZ', 'price': 5.75, 'sizes': null}]";

	check("[{'$unwind': '$sizes'}]", inv,
	      "[{'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': 'S'}, {'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': 'M'},"
	      " {'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': 'L'}, {'_id': 3, 'item': 'IJK', 'price': 160, 'sizes': 'M'}]");
	check("[{'$unwind': {'path': '$sizes', 'preserveNullAndEmptyArrays': true}}]", inv,
	      "[{'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': 'S'}, {'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': 'M'},"
	      " {'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': 'L'}, {'_id': 2, 'item': 'EFG', 'price': 120},"
	      " {'_id': 3, 'item': 'IJK', 'price': 160, 'sizes': 'M'}, {'_id': 4, 'item': 'LMN', 'price': 10},"
	      " {'_id': 5, 'item': 'XYZ', 'price': 5.75, 'sizes': null}]");
	check("[{'$unwind': {'path': '$sizes', 'includeArrayIndex': 'arrayIndex'}}]", inv,
	      "[{'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': 'S', 'arrayIndex': {'$numberLong': '0'}},"
	      " {'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': 'M', 'arrayIndex': {'$numberLong': '1'}},"
	      " {'_id': 1, 'item': 'ABC', 'price': 80, 'sizes': 'L', 'arrayIndex': {'$numberLong': '2'}},"
	      " {'_id': 3, 'item': 'IJK', 'price': 160, 'sizes': 'M', 'arrayIndex': null}]");
	/* a dotted path keeps the embedding */
	check("[{'$unwind': '$a.b'}]", "[{'_id': 1, 'a': {'b': [1, 2], 'c': 3}}]",
	      "[{'_id': 1, 'a': {'b': 1, 'c': 3}}, {'_id': 1, 'a': {'b': 2, 'c': 3}}]");
	check_err("[{'$unwind': 'sizes'}]", "[]", 28818, "prefixed with a '$'");
	check_err("[{'$unwind': {'path': '$a', 'bogus': 1}}]", "[]", 28811, "bogus");
}

/* https://www.mongodb.com/docs/manual/reference/operator/aggregation/project/ */
static void test_project(void **state)
{
	(void)state;
	const char *books = "[{'_id': 1, 'title': 'abc123', 'isbn': '0001122223334',"
			    " 'author': {'last': 'zzz', 'first': 'aaa'}, 'copies': 5}]";

	check("[{'$project': {'title': 1, 'author': 1}}]", books,
	      "[{'_id': 1, 'title': 'abc123', 'author': {'last': 'zzz', 'first': 'aaa'}}]");
	check("[{'$project': {'_id': 0, 'title': 1, 'author': 1}}]", books,
	      "[{'title': 'abc123', 'author': {'last': 'zzz', 'first': 'aaa'}}]");
	check("[{'$project': {'author.first': 0, 'copies': 0}}]", books,
	      "[{'_id': 1, 'title': 'abc123', 'isbn': '0001122223334', 'author': {'last': 'zzz'}}]");
	check("[{'$project': {'author': {'first': 0}, '_id': 0}}]", books,
	      "[{'title': 'abc123', 'isbn': '0001122223334', 'author': {'last': 'zzz'}, 'copies': 5}]");
	/* inclusion keeps document order; computed fields follow, in specification order */
	check("[{'$project': {'stock': {'$add': ['$copies', 1]}, 'title': 1,"
	      " 'author.full': {'$concat': ['$author.first', ' ', '$author.last']}, 'lit': 'text', 'one': {'$literal': 1}}}]",
	      books,
	      "[{'_id': 1, 'title': 'abc123', 'author': {'full': 'aaa zzz'}, 'stock': 6, 'lit': 'text', 'one': 1}]");
	/* dotted inclusion through an array of documents */
	check("[{'$project': {'a.b': 1, '_id': 0}}]", "[{'_id': 1, 'a': [{'b': 1, 'c': 2}, 3, {'c': 4}]}]",
	      "[{'a': [{'b': 1}, {}]}]");
	check_err("[{'$project': {'title': 1, 'copies': 0}}]", books, 31254, "exclusion on field copies");
	check_err("[{'$project': {'title': 0, 'copies': 1}}]", books, 31253, "inclusion on field copies");
	check_err("[{'$project': {'a': 1, 'a.b': 1}}]", books, 31250, "Path collision");
	check_err("[{'$project': {}}]", books, 51272, NULL);
	check_err("[{'$project': {'x': {'$frobnicate': 1}}}]", books, 168, "Unrecognized expression '$frobnicate'");
}

/* https://www.mongodb.com/docs/manual/reference/operator/aggregation/addFields/ and unset/ */
static void test_add_fields_unset(void **state)
{
	(void)state;
	check("[{'$addFields': {'totalQuiz': {'$add': [{'$arrayElemAt': ['$quiz', 0]}, {'$arrayElemAt': ['$quiz', -1]}]},"
	      " 'extraCredit': 5}}]",
	      "[{'_id': 1, 'student': 'Maya', 'quiz': [10, 8], 'extraCredit': 0}]",
	      "[{'_id': 1, 'student': 'Maya', 'quiz': [10, 8], 'extraCredit': 5, 'totalQuiz': 18}]");
	check("[{'$set': {'specs.fuel_type': 'unleaded'}}]",
	      "[{'_id': 1, 'type': 'car', 'specs': {'doors': 4, 'wheels': 4}}, {'_id': 2, 'type': 'motorcycle', 'specs': {'doors': 0, 'wheels': 2}}]",
	      "[{'_id': 1, 'type': 'car', 'specs': {'doors': 4, 'wheels': 4, 'fuel_type': 'unleaded'}},"
	      " {'_id': 2, 'type': 'motorcycle', 'specs': {'doors': 0, 'wheels': 2, 'fuel_type': 'unleaded'}}]");
	/* a nested document spec merges; $$REMOVE removes */
	check("[{'$addFields': {'specs': {'seats': 2}, 'type': '$$REMOVE', 'whole': '$$ROOT.type'}}]",
	      "[{'_id': 1, 'type': 'car', 'specs': {'doors': 4}}]",
	      "[{'_id': 1, 'specs': {'doors': 4, 'seats': 2}, 'whole': 'car'}]");
	check("[{'$unset': ['isbn', 'author.first', 'copies']}]",
	      "[{'_id': 1, 'title': 'abc123', 'isbn': '0001122223334', 'author': {'last': 'zzz', 'first': 'aaa'}, 'copies': 5}]",
	      "[{'_id': 1, 'title': 'abc123', 'author': {'last': 'zzz'}}]");
	check("[{'$unset': 'copies'}]", "[{'_id': 1, 'copies': 5, 'x': 1}]", "[{'_id': 1, 'x': 1}]");
	check("[{'$replaceRoot': {'newRoot': '$specs'}}]", "[{'_id': 1, 'specs': {'doors': 4}}]", "[{'doors': 4}]");
	check_err("[{'$replaceRoot': {'newRoot': '$type'}}]", "[{'_id': 1, 'type': 'car'}]", 40228, "must evaluate to an object");
}

static void test_sort_skip_limit(void **state)
{
	(void)state;
	const char *docs = "[{'_id': 1, 'a': 3}, {'_id': 2, 'a': 1}, {'_id': 3, 'a': 2}, {'_id': 4, 'a': 1}, {'_id': 5}]";

	check("[{'$sort': {'a': 1, '_id': -1}}]", docs,
	      "[{'_id': 5}, {'_id': 4, 'a': 1}, {'_id': 2, 'a': 1}, {'_id': 3, 'a': 2}, {'_id': 1, 'a': 3}]");
	/* ties keep input order (stable) */
	check("[{'$sort': {'a': -1}}]", docs,
	      "[{'_id': 1, 'a': 3}, {'_id': 3, 'a': 2}, {'_id': 2, 'a': 1}, {'_id': 4, 'a': 1}, {'_id': 5}]");
	check("[{'$sort': {'a': 1}}, {'$skip': 1}, {'$limit': 2}]", docs,
	      "[{'_id': 2, 'a': 1}, {'_id': 4, 'a': 1}]");
	check("[{'$skip': 4}]", docs, "[{'_id': 5}]");
	check("[{'$limit': 1}, {'$project': {'_id': 1}}]", docs, "[{'_id': 1}]");
	/* the largest int64 is a valid $limit and $skip (it went through a double and was
	 * refused with 5107200) */
	check("[{'$limit': {'$numberLong': '9223372036854775807'}}, {'$project': {'_id': 1}}, "
	      "{'$limit': 1}]", docs, "[{'_id': 1}]");
	check("[{'$skip': {'$numberLong': '9223372036854775807'}}]", docs, "[]");
	check_err("[{'$limit': 0}]", docs, 15958, "positive");
	check_err("[{'$limit': 'x'}]", docs, 15957, NULL);
	check_err("[{'$skip': -1}]", docs, 5107200, NULL);
	check_err("[{'$sort': {}}]", docs, 15976, NULL);
	check_err("[{'$sort': {'a': 2}}]", docs, 15975, NULL);
}

/* https://www.mongodb.com/docs/manual/reference/operator/aggregation/sortByCount/ */
static void test_sort_by_count(void **state)
{
	(void)state;
	check("[{'$unwind': '$tags'}, {'$sortByCount': '$tags'}, {'$sort': {'count': -1, '_id': 1}}, {'$limit': 4}]",
	      "[{'_id': 1, 'tags': ['painting', 'satire', 'Expressionism', 'caricature']},"
	      " {'_id': 2, 'tags': ['woodcut', 'Expressionism']}, {'_id': 3, 'tags': ['oil', 'Surrealism', 'painting']},"
	      " {'_id': 4, 'tags': ['woodblock', 'ukiyo-e']}, {'_id': 5, 'tags': ['Surrealism', 'painting', 'oil']},"
	      " {'_id': 6, 'tags': ['oil', 'painting', 'abstract']}]",
	      "[{'_id': 'painting', 'count': 4}, {'_id': 'oil', 'count': 3}, {'_id': 'Expressionism', 'count': 2},"
	      " {'_id': 'Surrealism', 'count': 2}]");
	check_err("[{'$sortByCount': 'tags'}]", "[]", 40148, NULL);
}

/* $switch: the first true case wins; the default; 40066 without one; its parse codes. */
static void test_switch(void **state)
{
	(void)state;
	check("[{'$project': {'_id': 1, 'g': {'$switch': {'branches': ["
	      "{'case': {'$gte': ['$s', 90]}, 'then': 'A'}, {'case': {'$gte': ['$s', 80]}, 'then': 'B'}],"
	      " 'default': 'C'}}}}]",
	      "[{'_id': 1, 's': 95}, {'_id': 2, 's': 85}, {'_id': 3, 's': 10}, {'_id': 4}]",
	      "[{'_id': 1, 'g': 'A'}, {'_id': 2, 'g': 'B'}, {'_id': 3, 'g': 'C'}, {'_id': 4, 'g': 'C'}]");
	check_err("[{'$project': {'g': {'$switch': {'branches': [{'case': {'$eq': ['$s', 0]}, 'then': 1}]}}}}]",
		  "[{'_id': 1, 's': 5}]", 40066, "could not find a matching branch");
	check_err("[{'$project': {'g': {'$switch': [1]}}}]", "[]", 40060, NULL);
	check_err("[{'$project': {'g': {'$switch': {'branches': 1}}}}]", "[]", 40061, NULL);
	check_err("[{'$project': {'g': {'$switch': {'branches': [1]}}}}]", "[]", 40062, NULL);
	check_err("[{'$project': {'g': {'$switch': {'branches': [{'case': true, 'then': 1, 'x': 1}]}}}}]",
		  "[]", 40063, NULL);
	check_err("[{'$project': {'g': {'$switch': {'branches': [{'then': 1}]}}}}]", "[]", 40064, NULL);
	check_err("[{'$project': {'g': {'$switch': {'branches': [{'case': true}]}}}}]", "[]", 40065, NULL);
	check_err("[{'$project': {'g': {'$switch': {'branches': [], 'x': 1}}}}]", "[]", 40067, NULL);
	check_err("[{'$project': {'g': {'$switch': {'branches': []}}}}]", "[]", 40068, NULL);
	check_err("[{'$project': {'g': {'$switch': {}}}}]", "[]", 40068, NULL);
}

static const char *artists =
	"[{'_id': 1, 'name': 'Bernard', 'year_born': 1868}, {'_id': 2, 'name': 'Rippl-Ronai', 'year_born': 1861},"
	" {'_id': 3, 'name': 'Ostroumova', 'year_born': 1871}, {'_id': 4, 'name': 'Van Gogh', 'year_born': 1853},"
	" {'_id': 5, 'name': 'Maurer', 'year_born': 1868}, {'_id': 6, 'name': 'Munch', 'year_born': 1863},"
	" {'_id': 7, 'name': 'Redon', 'year_born': 1840}, {'_id': 8, 'name': 'Diriks', 'year_born': 1855},"
	" {'_id': 9, 'name': 'Later', 'year_born': 1900}, {'_id': 10, 'name': 'Unknown'}]";

/* $bucketAuto (MongoDB 6.0's DocumentSourceBucketAuto): the manual's artwork example (8
 * prices, 4 buckets of 2: a bucket's max is the next one's min, the last one's the largest
 * value), equal values never split, fewer buckets than asked, missing as null below
 * numbers, output accumulators fed in groupBy order; the granularity examples of the
 * manual (_id 0..99 in 5 buckets); the option errors. */
static void test_bucket_auto(void **state)
{
	static const char *art = "[{'p': 199.99}, {'p': 280.0}, {'p': 76.04}, {'p': 167.3},"
				 " {'p': 483.0}, {'p': 385.0}, {'p': 159.0}, {'p': 118.42}]";
	char things[4096];
	size_t off = 0;

	(void)state;
	check("[{'$bucketAuto': {'groupBy': '$p', 'buckets': 4}}]", art,
	      "[{'_id': {'min': 76.04, 'max': 159.0}, 'count': 2},"
	      " {'_id': {'min': 159.0, 'max': 199.99}, 'count': 2},"
	      " {'_id': {'min': 199.99, 'max': 385.0}, 'count': 2},"
	      " {'_id': {'min': 385.0, 'max': 483.0}, 'count': 2}]");
	/* 1 1 1 2 3 in 2 buckets: approx 3 (round(2.5)); the 1s stay together; then 2 and 3 */
	check("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2,"
	      " 'output': {'n': {'$sum': 1}, 'ids': {'$push': '$i'}}}}]",
	      "[{'a': 3, 'i': 0}, {'a': 1, 'i': 1}, {'a': 2, 'i': 2}, {'a': 1, 'i': 3}, {'a': 1, 'i': 4}]",
	      "[{'_id': {'min': 1, 'max': 2}, 'n': 3, 'ids': [1, 3, 4]},"
	      " {'_id': {'min': 2, 'max': 3}, 'n': 2, 'ids': [2, 0]}]");
	/* equal values absorbed past approx: 1 1 1 1 2 in 3 buckets (approx 2) -> 2 buckets */
	check("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 3}}]",
	      "[{'a': 1}, {'a': 1}, {'a': 2}, {'a': 1}, {'a': 1}]",
	      "[{'_id': {'min': 1, 'max': 2}, 'count': 4}, {'_id': {'min': 2, 'max': 2}, 'count': 1}]");
	/* fewer distinct values than buckets; missing and null group as null, first */
	check("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 10}}]",
	      "[{'a': 'x'}, {'b': 1}, {'a': 5}, {'a': null}, {'a': 5}]",
	      "[{'_id': {'min': null, 'max': 5}, 'count': 2}, {'_id': {'min': 5, 'max': 'x'}, 'count': 2},"
	      " {'_id': {'min': 'x', 'max': 'x'}, 'count': 1}]");
	check("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 1, 'output': {'lo': {'$min': '$a'},"
	      " 'hi': {'$max': '$a'}, 'f': {'$first': '$a'}, 'avg': {'$avg': '$a'}}}}]",
	      "[{'a': 4}, {'a': 2}, {'a': 8}]",
	      "[{'_id': {'min': 2, 'max': 8}, 'lo': 2, 'hi': 8, 'f': 2, 'avg': 4.666666666666667}]");
	check("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 3}}]", "[]", "[]");
	/* whole values in MongoDB's order: numbers, strings, objects, arrays (element-wise) */
	check("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 10}}, {'$project': {'_id': 0, 'm': '$_id.min'}}]",
	      "[{'a': [1, 2]}, {'a': [1]}, {'a': {'x': 1}}, {'a': [0, 5]}, {'a': 's'}, {'a': 3},"
	      " {'a': {'w': 9}}, {'a': true}]",
	      "[{'m': 3}, {'m': 's'}, {'m': {'w': 9}}, {'m': {'x': 1}}, {'m': [0, 5]}, {'m': [1]},"
	      " {'m': [1, 2]}, {'m': true}]");
	/* 1, 1.0 and NumberLong(1) are one value */
	check("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 3}}]",
	      "[{'a': 1}, {'a': 1.0}, {'a': {'$numberLong': '1'}}, {'a': 2}]",
	      "[{'_id': {'min': 1, 'max': 2}, 'count': 3}, {'_id': {'min': 2, 'max': 2}, 'count': 1}]");

	off += (size_t)snprintf(things + off, sizeof things - off, "[");
	for (int i = 0; i < 100; i++) {
		off += (size_t)snprintf(things + off, sizeof things - off, "%s{'_id': %d}",
					i ? ", " : "", i);
	}
	snprintf(things + off, sizeof things - off, "]");
	check("[{'$bucketAuto': {'groupBy': '$_id', 'buckets': 5, 'granularity': 'R5'}}]", things,
	      "[{'_id': {'min': 0, 'max': 25.0}, 'count': 25}, {'_id': {'min': 25.0, 'max': 63.0},"
	      " 'count': 38}, {'_id': {'min': 63.0, 'max': 100.0}, 'count': 37}]");
	check("[{'$bucketAuto': {'groupBy': '$_id', 'buckets': 5, 'granularity': 'POWERSOF2'}}]",
	      things,
	      "[{'_id': {'min': 0, 'max': 32}, 'count': 32}, {'_id': {'min': 32, 'max': 64},"
	      " 'count': 32}, {'_id': {'min': 64, 'max': 128}, 'count': 36}]");
	/* the first min rounded down; a double rounded up by POWERSOF2 is 2^n as {$pow} gives */
	check("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 'E6'}}]",
	      "[{'a': 0.8}, {'a': 1.2}, {'a': 5}, {'a': 70}]",
	      "[{'_id': {'min': 0.68, 'max': 1.5}, 'count': 2}, {'_id': {'min': 1.5, 'max': 100.0},"
	      " 'count': 2}]");
	check("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 'POWERSOF2'}}]",
	      "[{'a': 0.3}, {'a': 3.5}]",
	      "[{'_id': {'min': 0.25, 'max': 0.5}, 'count': 1}, {'_id': {'min': 0.5, 'max': 4}, 'count': 1}]");
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 'R5'}}]",
		  "[{'a': 'x'}]", 40258, "found a value with type: string");
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 'R5'}}]",
		  "[{'b': 1}]", 40258, "type: missing");
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 'R5'}}]",
		  "[{'a': {'$numberDouble': 'NaN'}}]", 40259, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 'R5'}}]",
		  "[{'a': -1}]", 40260, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 'R5'}}]",
		  "[{'a': {'$numberDouble': 'Infinity'}}]", 2, "finite");
	/* a subnormal double: mongod's rounder loops forever on it (a review found ours did) */
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 'E6'}}]",
		  "[{'a': {'$numberDouble': '5e-324'}}, {'a': 1}]", 2, "subnormal");
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 1, 'granularity': 'R5'}}]",
		  "[{'a': {'$numberDouble': '1e-322'}}]", 2, "subnormal");
	/* the smallest normal double rounds (no hang) */
	{
		int rcode = 0;
		char rerr[256] = "";
		char *got = run("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 1, "
				"'granularity': 'E6'}}]",
				"[{'a': {'$numberDouble': '2.2250738585072014e-308'}}]", NULL,
				&rcode, rerr, sizeof rerr);
		if (got == NULL)
			fail_msg("DBL_MIN with E6: code %d %s", rcode, rerr);
		bson_free(got);
	}
	/* an accumulator failing in the second bucket fails the aggregation (nothing leaks) */
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'output': {'q': {'$push':"
		  " {'$divide': [1, '$a']}}}}}]",
		  "[{'a': 1}, {'a': 2}, {'a': 0}, {'a': 3}]", 16608, NULL);
	check_err("[{'$bucketAuto': 1}]", "[]", 40240, NULL);
	check_err("[{'$bucketAuto': {'groupBy': 'a', 'buckets': 2}}]", "[]", 40239, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$', 'buckets': 2}}]", "[]", 40239, NULL);
	check_err("[{'$bucketAuto': {'groupBy': {'a': 1}, 'buckets': 2}}]", "[]", 40239, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 'x'}}]", "[]", 40241, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2.5}}]", "[]", 40242, "2.5");
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': {'$numberLong': '5000000000'}}}]",
		  "[]", 40242, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 0}}]", "[]", 40243, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': -1}}]", "[]", 40243, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'output': 1}}]", "[]", 40244,
		  NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'x': 1}}]", "[]", 40245, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a'}}]", "[]", 40246, NULL);
	check_err("[{'$bucketAuto': {'buckets': 2}}]", "[]", 40246, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 'R7'}}]", "[]",
		  40257, "Unknown rounding granularity 'R7'");
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'granularity': 5}}]", "[]",
		  40261, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'output': {'n': 1}}}]", "[]",
		  40234, NULL);
	check_err("[{'$bucketAuto': {'groupBy': '$a', 'buckets': 2, 'output': {'n': {'$foo': 1}}}}]",
		  "[]", 15952, NULL);
}

/* $bucket, after the manual's artists example: [lower, upper) buckets sorted by _id, the
 * default bucket for values outside (and for a missing value), output accumulators. */
static void test_bucket(void **state)
{
	(void)state;
	check("[{'$bucket': {'groupBy': '$year_born', 'boundaries': [1840, 1850, 1860, 1870, 1880],"
	      " 'default': 'Other'}}]",
	      artists,
	      "[{'_id': 1840, 'count': 1}, {'_id': 1850, 'count': 2}, {'_id': 1860, 'count': 4},"
	      " {'_id': 1870, 'count': 1}, {'_id': 'Other', 'count': 2}]");
	check("[{'$match': {'year_born': {'$lt': 1880}}},"
	      " {'$bucket': {'groupBy': '$year_born', 'boundaries': [1840, 1860, 1880],"
	      " 'output': {'n': {'$sum': 1}, 'names': {'$push': '$name'}}}}]",
	      artists,
	      "[{'_id': 1840, 'n': 3, 'names': ['Van Gogh', 'Redon', 'Diriks']},"
	      " {'_id': 1860, 'n': 5, 'names': ['Bernard', 'Rippl-Ronai', 'Ostroumova', 'Maurer', 'Munch']}]");
	/* string boundaries; a number is outside them (another type) and goes to the default */
	check("[{'$bucket': {'groupBy': '$k', 'boundaries': ['a', 'm', 'z'], 'default': 0}}]",
	      "[{'_id': 1, 'k': 'b'}, {'_id': 2, 'k': 'n'}, {'_id': 3, 'k': 'c'}, {'_id': 4, 'k': 7}]",
	      "[{'_id': 0, 'count': 1}, {'_id': 'a', 'count': 2}, {'_id': 'm', 'count': 1}]");
	/* no default: a value outside the boundaries fails the aggregation, as MongoDB */
	check_err("[{'$bucket': {'groupBy': '$year_born', 'boundaries': [1840, 1880]}}]", artists, 40066,
		  NULL);
	check_err("[{'$bucket': 5}]", "[]", 40201, NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [0, 5], 'x': 1}}]", "[]", 40197, NULL);
	check_err("[{'$bucket': {'groupBy': '$a'}}]", "[]", 40198, NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': 5}}]", "[]", 40200, NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [0]}}]", "[]", 40192, NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [0, '$b']}}]", "[]", 40191, NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [0, 'x']}}]", "[]", 40193, NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [5, 1]}}]", "[]", 40194, NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [1, 1]}}]", "[]", 40194, NULL);
	check_err("[{'$bucket': {'groupBy': 'a', 'boundaries': [0, 5]}}]", "[]", 40202, NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [0, 5], 'default': '$a'}}]", "[]", 40195,
		  NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [0, 5], 'default': 3}}]", "[]", 40199,
		  NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [0, 5], 'output': 1}}]", "[]", 40196, NULL);
	check_err("[{'$bucket': {'groupBy': '$a', 'boundaries': [0, 5], 'output': {'_id': {'$sum': 1}}}}]",
		  "[]", 15948, NULL);
}

/* $facet: every sub-pipeline over the same input, one output document (also for no input),
 * later stages over it, and its errors. */
static void test_facet(void **state)
{
	const char *docs = "[{'_id': 1, 'price': 10, 'tags': ['a', 'b']}, {'_id': 2, 'price': 20, 'tags': ['b']},"
			   " {'_id': 3, 'price': 30}]";

	(void)state;
	check("[{'$facet': {'byTag': [{'$unwind': '$tags'}, {'$sortByCount': '$tags'}, {'$sort': {'count': -1, '_id': 1}}],"
	      " 'byPrice': [{'$bucket': {'groupBy': '$price', 'boundaries': [0, 15, 40]}}],"
	      " 'n': [{'$count': 'total'}]}}]",
	      docs,
	      "[{'byTag': [{'_id': 'b', 'count': 2}, {'_id': 'a', 'count': 1}],"
	      " 'byPrice': [{'_id': 0, 'count': 1}, {'_id': 15, 'count': 2}], 'n': [{'total': 3}]}]");
	check("[{'$facet': {'f': [{'$match': {}}]}}]", "[]", "[{'f': []}]");
	check("[{'$match': {'price': {'$gt': 15}}}, {'$facet': {'a': [{'$project': {'_id': 1}}]}},"
	      " {'$project': {'k': {'$size': '$a'}}}]",
	      docs, "[{'k': 2}]");
	check_err("[{'$facet': {}}]", "[]", 40169, NULL);
	check_err("[{'$facet': 1}]", "[]", 40169, NULL);
	check_err("[{'$facet': {'f': 1}}]", "[]", 40170, "f is type");
	check_err("[{'$facet': {'f': [1]}}]", "[]", 40171, NULL);
	check_err("[{'$facet': {'f': [{'$facet': {'g': []}}]}}]", "[]", 40600, "$facet is not allowed");
	check_err("[{'$facet': {'f': [{'$out': 'x'}]}}]", "[]", 40600, "$out is not allowed");
	check_err("[{'$facet': {'$x': []}}]", "[]", 16410, NULL);
	check_err("[{'$facet': {'a.b': []}}]", "[]", 16412, NULL);
	check_err("[{'$facet': {'f': [{'$frob': {}}]}}]", "[]", 40324, NULL);
	check_err("[{'$facet': {'f': [{'$project': {'x': {'$divide': [1, 0]}}}]}}]", docs, 16608, NULL);
}
static void test_expressions(void **state)
{
	(void)state;
	/* $cond (document and array forms), from the manual's inventory example */
	check("[{'$project': {'item': 1, 'discount': {'$cond': {'if': {'$gte': ['$qty', 250]}, 'then': 30, 'else': 20}},"
	      " 'd2': {'$cond': [{'$lt': ['$qty', 250]}, 'low', 'high']}}}]",
	      "[{'_id': 1, 'item': 'abc1', 'qty': 300}, {'_id': 2, 'item': 'abc2', 'qty': 200}, {'_id': 3, 'item': 'xyz1', 'qty': 250}]",
	      "[{'_id': 1, 'item': 'abc1', 'discount': 30, 'd2': 'high'}, {'_id': 2, 'item': 'abc2', 'discount': 20, 'd2': 'low'},"
	      " {'_id': 3, 'item': 'xyz1', 'discount': 30, 'd2': 'high'}]");
	/* $ifNull */
	check("[{'$project': {'item': 1, 'description': {'$ifNull': ['$description', 'Unspecified']}}}]",
	      "[{'_id': 1, 'item': 'buggy', 'description': 'Toy car'}, {'_id': 2, 'item': 'bicycle', 'description': null},"
	      " {'_id': 3, 'item': 'flag'}]",
	      "[{'_id': 1, 'item': 'buggy', 'description': 'Toy car'}, {'_id': 2, 'item': 'bicycle', 'description': 'Unspecified'},"
	      " {'_id': 3, 'item': 'flag', 'description': 'Unspecified'}]");
	/* arithmetic: types follow MongoDB (int32, int64 on overflow, double for $divide) */
	check("[{'$project': {'_id': 0, 'add': {'$add': ['$a', '$b', 1]}, 'sub': {'$subtract': ['$a', '$b']},"
	      " 'mul': {'$multiply': ['$a', '$b']}, 'div': {'$divide': ['$a', '$b']}, 'mod': {'$mod': ['$a', '$b']},"
	      " 'big': {'$add': ['$a', 2147483647]}, 'dbl': {'$add': ['$a', 0.5]}, 'nul': {'$add': ['$a', '$none']},"
	      " 'abs': {'$abs': {'$subtract': ['$b', '$a']}}}}]",
	      "[{'a': 10, 'b': 4}]",
	      "[{'add': 15, 'sub': 6, 'mul': 40, 'div': 2.5, 'mod': 2, 'big': {'$numberLong': '2147483657'},"
	      " 'dbl': 10.5, 'nul': null, 'abs': 6}]");
	/* $abs at the ends of the integer types (MongoDB: |INT32_MIN| is a long, |INT64_MIN|
	 * is 28680) and $arrayElemAt's index rules (28690 not a number, 28691 not an int32) */
	check("[{'$project': {'_id': 0, 'a': {'$abs': '$i'}, 'e': {'$arrayElemAt': ['$arr', -1]}}}]",
	      "[{'i': {'$numberInt': '-2147483648'}, 'arr': [1, 2, 3]}]",
	      "[{'a': {'$numberLong': '2147483648'}, 'e': 3}]");
	check_err("[{'$project': {'a': {'$abs': '$l'}}}]", "[{'l': {'$numberLong': '-9223372036854775808'}}]",
		  28680, "can't take $abs of long long min");
	check_err("[{'$project': {'e': {'$arrayElemAt': ['$arr', 1e300]}}}]", "[{'arr': [1]}]", 28691,
		  "must be representable as a 32-bit integer");
	check_err("[{'$project': {'e': {'$arrayElemAt': ['$arr', {'$numberLong': '2147483648'}]}}}]",
		  "[{'arr': [1]}]", 28691, "must be representable as a 32-bit integer");
	check_err("[{'$project': {'e': {'$arrayElemAt': ['$arr', 'x']}}}]", "[{'arr': [1]}]", 28690,
		  "must be a numeric value, but is string");
	/* dates: date + ms, date - date */
	check("[{'$project': {'_id': 0, 'later': {'$add': ['$d', 60000]}, 'diff': {'$subtract': ['$e', '$d']}}}]",
	      "[{'d': {'$date': '2024-01-01T00:00:00Z'}, 'e': {'$date': '2024-01-01T00:00:01Z'}}]",
	      "[{'later': {'$date': '2024-01-01T00:01:00Z'}, 'diff': {'$numberLong': '1000'}}]");
	/* strings and comparisons */
	check("[{'$project': {'_id': 0, 'c': {'$concat': ['$f', '-', '$l']}, 'u': {'$toUpper': '$f'}, 'lo': {'$toLower': '$l'},"
	      " 'eq': {'$eq': ['$n', 5]}, 'eq2': {'$eq': ['$n', 5.0]}, 'gt': {'$gt': ['$n', 4]}, 'lt': {'$lt': ['$f', 1]},"
	      " 'ne': {'$ne': ['$n', 5]}, 'cmp': {'$cmp': ['$n', 7]}, 'sz': {'$size': '$arr'},"
	      " 'in': {'$in': [2, '$arr']}, 'and': {'$and': [1, '$n']}, 'or': {'$or': [0, null]}, 'not': {'$not': ['$n']},"
	      " 'cnull': {'$concat': ['$f', '$none']}, 'path': '$sub.x', 'arrpath': '$objs.v'}}]",
	      "[{'f': 'Ada', 'l': 'LOVELACE', 'n': 5, 'arr': [1, 2, 3], 'sub': {'x': 9}, 'objs': [{'v': 1}, {'w': 2}, {'v': 3}]}]",
	      "[{'c': 'Ada-LOVELACE', 'u': 'ADA', 'lo': 'lovelace', 'eq': true, 'eq2': true, 'gt': true, 'lt': false,"
	      " 'ne': false, 'cmp': -1, 'sz': 3, 'in': true, 'and': true, 'or': false, 'not': false, 'cnull': null,"
	      " 'path': 9, 'arrpath': [1, 3]}]");
	/* list operators, types, arrays, rounding and string slicing */
	check("[{'$project': {'_id': 0, 'sum': {'$sum': '$arr'}, 'sum2': {'$sum': ['$n', 2.5, 'x']}, 'avg': {'$avg': '$arr'},"
	      " 'min': {'$min': '$arr'}, 'max': {'$max': ['$n', '$f', null]}, 'mnone': {'$min': []},"
	      " 't': [{'$type': '$n'}, {'$type': '$f'}, {'$type': '$none'}, {'$type': '$arr'}, {'$type': '$sub'}],"
	      " 'isa': {'$isArray': ['$arr']}, 'cat': {'$concatArrays': ['$arr', [4], []]}, 'catn': {'$concatArrays': ['$arr', '$none']},"
	      " 'fl': {'$floor': 2.7}, 'ce': {'$ceil': 2.1}, 'fli': {'$floor': '$n'}, 'len': {'$strLenBytes': '$f'},"
	      " 'sub': {'$substrBytes': ['$f', 1, 2]}, 'sub2': {'$substr': ['$f', 1, -1]},"
	      " 'ts': [{'$toString': '$n'}, {'$toString': 0.1}, {'$toString': true}, {'$toString': '$d'}, {'$toString': '$none'}]}}]",
	      "[{'f': 'Ada', 'n': 5, 'arr': [1, 2, 3], 'sub': {'x': 9}, 'd': {'$date': '2024-01-02T03:04:05.006Z'}}]",
	      "[{'sum': 6, 'sum2': 7.5, 'avg': 2.0, 'min': 1, 'max': 'Ada', 'mnone': null,"
	      " 't': ['int', 'string', 'missing', 'array', 'object'], 'isa': true, 'cat': [1, 2, 3, 4], 'catn': null,"
	      " 'fl': 2.0, 'ce': 3.0, 'fli': 5, 'len': 3, 'sub': 'da', 'sub2': 'da',"
	      " 'ts': ['5', '0.1', 'true', '2024-01-02T03:04:05.006Z', null]}]");
	check_err("[{'$project': {'x': {'$concatArrays': [[1], 2]}}}]", "[{'a': 1}]", 28664, NULL);
	check_err("[{'$project': {'x': {'$strLenBytes': 5}}}]", "[{'a': 1}]", 34473, NULL);
	check_err("[{'$project': {'x': {'$divide': ['$a', 0]}}}]", "[{'a': 1}]", 16608, "by zero");
	check_err("[{'$project': {'x': {'$size': '$a'}}}]", "[{'a': 1}]", 17124, "must be an array");
	check_err("[{'$project': {'x': {'$concat': ['$a']}}}]", "[{'a': 1}]", 16702, "only supports strings");
	check_err("[{'$project': {'x': {'$add': ['$a', 'b']}}}]", "[{'a': 1}]", 16554, NULL);
	check_err("[{'$project': {'x': {'$subtract': [1]}}}]", "[{'a': 1}]", 16020, NULL);
	check_err("[{'$project': {'x': '$$nope'}}]", "[{'a': 1}]", 17276, NULL);
}

static void test_stage_errors(void **state)
{
	(void)state;
	check_err("[{'$frobnicate': {}}]", "[]", 40324, "Unrecognized pipeline stage name: '$frobnicate'");
	check_err("[{'$match': {}, '$sort': {'a': 1}}]", "[]", 40323, "exactly one field");
	check_err("[{}]", "[]", 40323, NULL);
	check_err("[5]", "[]", 14, NULL);
	/* without a foreign reader in the options: 238 (a malformed one is still 9 first) */
	check_err("[{'$lookup': {'from': 'o', 'localField': 'a', 'foreignField': 'b', 'as': 'j'}}]",
		  "[]", 238, "$lookup is not supported");
	check_err("[{'$unionWith': 'o'}]", "[]", 238, "$unionWith is not supported");
	check_err("[{'$lookup': {}}]", "[]", 9, "must specify 'as'");
	check_err("[{'$match': {'a': {'$bogus': 1}}}]", "[]", 2, NULL);
}

/* Hostile shapes are refused before any recursion: deep nesting, very long field paths. */
static void test_limits(void **state)
{
	(void)state;
	char *json = malloc(8192);
	size_t n = 0;
	int code;
	char err[256];

	n += (size_t)sprintf(json + n, "[{'$project': {'x': '$a");
	for (int i = 0; i < 300; i++) {
		n += (size_t)sprintf(json + n, ".a");
	}
	sprintf(json + n, "'}}]");
	check_err(json, "[]", 15, "FieldPath is too long"); /* MongoDB: more than 200 */

	free(json);

	/* [{$project: {x: {d: {d: ... 250 levels}}}}], built with the BSON API (libbson's JSON
	 * parser refuses such depth itself) */
	bson_t *deep = bson_new(), *w, stage, spec, arr = BSON_INITIALIZER;
	sdb_pipeline *p = NULL;

	BSON_APPEND_INT32(deep, "x", 1);
	for (int i = 0; i < 250; i++) {
		w = bson_new();
		BSON_APPEND_DOCUMENT(w, "d", deep);
		bson_destroy(deep);
		deep = w;
	}
	BSON_APPEND_DOCUMENT_BEGIN(&arr, "0", &stage);
	BSON_APPEND_DOCUMENT_BEGIN(&stage, "$project", &spec);
	BSON_APPEND_DOCUMENT(&spec, "x", deep);
	bson_append_document_end(&stage, &spec);
	bson_append_document_end(&arr, &stage);
	assert_int_not_equal(sdb_pipeline_parse(&arr, NULL, &p, &code, err, sizeof err), 0);
	assert_null(p);
	assert_int_equal(code, 15);
	bson_destroy(&arr);
	bson_destroy(deep);
}

static void test_match(void **state)
{
	(void)state;
	check("[{'$match': {'author': 'dave'}}]",
	      "[{'_id': 1, 'author': 'dave', 'score': 80}, {'_id': 2, 'author': 'dave', 'score': 85},"
	      " {'_id': 3, 'author': 'ahn', 'score': 60}]",
	      "[{'_id': 1, 'author': 'dave', 'score': 80}, {'_id': 2, 'author': 'dave', 'score': 85}]");
	check("[{'$match': {'$or': [{'score': {'$gt': 70, '$lt': 90}}, {'views': {'$gte': 1000}}]}},"
	      " {'$group': {'_id': null, 'count': {'$sum': 1}}}]",
	      "[{'score': 80, 'views': 100}, {'score': 85, 'views': 521}, {'score': 60, 'views': 1000},"
	      " {'score': 55, 'views': 5000}, {'score': 60, 'views': 50}, {'score': 94, 'views': 999}]",
	      "[{'_id': null, 'count': 4}]");
	/* $expr compares fields of the same document (the manual's budget example) */
	check("[{'$match': {'$expr': {'$gt': ['$spent', '$budget']}, 'category': {'$ne': 'food'}}}]",
	      "[{'_id': 1, 'category': 'food', 'budget': 400, 'spent': 450}, {'_id': 2, 'category': 'drinks', 'budget': 100, 'spent': 150},"
	      " {'_id': 3, 'category': 'clothes', 'budget': 100, 'spent': 50}, {'_id': 4, 'category': 'misc', 'budget': 500, 'spent': 300},"
	      " {'_id': 5, 'category': 'travel', 'budget': 200, 'spent': 650}]",
	      "[{'_id': 2, 'category': 'drinks', 'budget': 100, 'spent': 150}, {'_id': 5, 'category': 'travel', 'budget': 200, 'spent': 650}]");
}

/* $sample (pipeline_sample.c): sizes, errors, the memory bound, and the keys a shard sends
 * the proxy (sample_key_out) and the proxy merges (sample_key_in: the smallest keys win,
 * deterministically). */
static void test_sample(void **state)
{
	(void)state;
	int code;
	char err[512];
	char *got;

	check("[{'$sample': {'size': 0}}]", "[{'_id': 1}]", "[]");
	check("[{'$sample': {'size': 5}}, {'$sort': {'_id': 1}}]", "[{'_id': 1}, {'_id': 2}, {'_id': 3}]",
	      "[{'_id': 1}, {'_id': 2}, {'_id': 3}]");
	check("[{'$sample': {'size': 2.7}}, {'$count': 'n'}]", "[{'_id': 1}, {'_id': 2}, {'_id': 3}]",
	      "[{'n': 2}]");
	check_err("[{'$sample': 1}]", "[]", 28745, "the $sample stage specification must be an object");
	check_err("[{'$sample': {'size': 'a'}}]", "[]", 28746, "size argument to $sample must be a number");
	check_err("[{'$sample': {'size': -1}}]", "[]", 28747, "size argument to $sample must not be negative");
	check_err("[{'$sample': {'size': 1, 'x': 1}}]", "[]", 28748, "unrecognized option to $sample: x");
	check_err("[{'$sample': {}}]", "[]", 28749, "$sample stage must specify a size");

	/* the heap holds size documents: over the bound 292, under it fine */
	{
		sdb_pipeline_opts o = {.max_memory_bytes = 24000};
		char *docs = malloc(200000);
		size_t len = 0;

		len += (size_t)sprintf(docs + len, "[");
		for (int i = 0; i < 1000; i++)
			len += (size_t)sprintf(docs + len, "%s{'_id': %d, 'pad': 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'}",
					       i ? ", " : "", i);
		sprintf(docs + len, "]");
		got = run("[{'$sample': {'size': 500}}]", docs, &o, &code, err, sizeof err);
		assert_null(got);
		assert_int_equal(code, 292);
		assert_non_null(strstr(err, "Exceeded memory limit for $sample"));
		got = run("[{'$sample': {'size': 50}}, {'$count': 'n'}]", docs, &o, &code, err, sizeof err);
		assert_non_null(got);
		assert_string_equal(got, "{ \"v\" : [ { \"n\" : { \"$numberInt\" : \"50\" } } ] }");
		bson_free(got);
		free(docs);
	}

	/* sample_key_out: a last $sample emits ascending keys in [0, 1) */
	{
		sdb_pipeline_opts o = {.sample_key_out = true};
		bson_t parr, darr = BSON_INITIALIZER;
		bson_t *pw = JA("[{'$sample': {'size': 20}}]", &parr);
		sdb_pipeline *p = NULL;
		sdb_pipeline_cursor *c;
		input in = {.fail_after = -1};
		const bson_t *d;
		double prev = -1;
		int n = 0;

		for (int i = 0; i < 100; i++) {
			bson_t doc;
			char key[16];

			snprintf(key, sizeof key, "%d", i);
			bson_append_document_begin(&darr, key, -1, &doc);
			BSON_APPEND_INT32(&doc, "_id", i);
			bson_append_document_end(&darr, &doc);
		}
		assert_int_equal(sdb_pipeline_parse(&parr, &o, &p, &code, err, sizeof err), 0);
		bson_iter_init(&in.it, &darr);
		sdb_pipeline_open(p, input_next, &in, &c);
		while (sdb_pipeline_cursor_next(c, &d, &code, err, sizeof err) == 1) {
			bson_iter_t it;

			assert_true(bson_iter_init_find(&it, d, SDB_PIPELINE_SAMPLE_KEY));
			assert_true(BSON_ITER_HOLDS_DOUBLE(&it));
			assert_true(bson_iter_double(&it) >= prev && bson_iter_double(&it) < 1.0);
			prev = bson_iter_double(&it);
			n++;
		}
		assert_int_equal(n, 20);
		sdb_pipeline_cursor_free(c);
		sdb_pipeline_free(p);
		bson_destroy(pw);
		bson_destroy(&darr);
	}

	/* sample_key_in: the documents' own keys decide (and are removed) */
	{
		sdb_pipeline_opts o = {.sample_key_in = true};
		bson_t parr, darr = BSON_INITIALIZER;
		bson_t *pw = JA("[{'$sample': {'size': 2}}]", &parr);
		sdb_pipeline *p = NULL;
		sdb_pipeline_cursor *c;
		input in = {.fail_after = -1};
		const bson_t *d;
		const double keys[] = {0.9, 0.1, 0.5, 0.7};
		int want[] = {2, 3}, n = 0;

		for (int i = 0; i < 4; i++) {
			bson_t doc;
			char key[16];

			snprintf(key, sizeof key, "%d", i);
			bson_append_document_begin(&darr, key, -1, &doc);
			BSON_APPEND_INT32(&doc, "_id", i + 1);
			BSON_APPEND_DOUBLE(&doc, SDB_PIPELINE_SAMPLE_KEY, keys[i]);
			bson_append_document_end(&darr, &doc);
		}
		assert_int_equal(sdb_pipeline_parse(&parr, &o, &p, &code, err, sizeof err), 0);
		bson_iter_init(&in.it, &darr);
		sdb_pipeline_open(p, input_next, &in, &c);
		while (sdb_pipeline_cursor_next(c, &d, &code, err, sizeof err) == 1) {
			bson_iter_t it;

			assert_true(n < 2);
			assert_false(bson_iter_init_find(&it, d, SDB_PIPELINE_SAMPLE_KEY));
			assert_true(bson_iter_init_find(&it, d, "_id"));
			assert_int_equal(bson_iter_int32(&it), want[n]);
			n++;
		}
		assert_int_equal(n, 2);
		sdb_pipeline_cursor_free(c);
		sdb_pipeline_free(p);
		bson_destroy(pw);
		bson_destroy(&darr);
	}
}

/* $redact (pipeline_redact.c): the manual's accounts example, $$CURRENT / $$ROOT, arrays
 * of arrays, 17053. */
static void test_redact(void **state)
{
	(void)state;
	check("[{'$redact': {'$cond': {'if': {'$eq': ['$level', 5]}, 'then': '$$PRUNE', 'else': '$$DESCEND'}}}]",
	      "[{'_id': 1, 'level': 1, 'acct_id': 'xyz123', 'cc': {'level': 5, 'type': 'yy',"
	      " 'billing_addr': {'level': 5, 'addr1': '123 ABC Street'},"
	      " 'shipping_addr': [{'level': 3, 'addr1': '987 XYZ Ave'}]}, 'status': 'A'},"
	      " {'_id': 2, 'level': 5}]",
	      "[{'_id': 1, 'level': 1, 'acct_id': 'xyz123', 'status': 'A'}]");
	check("[{'$redact': {'$cond': [{'$eq': ['$$CURRENT.o', '$$ROOT.o']}, '$$DESCEND', '$$PRUNE']}}]",
	      "[{'_id': 1, 'o': 'a', 'x': {'o': 'b'}, 'y': {'o': 'a', 'z': {}},"
	      " 'arr': [[{'o': 'a', 'k': 1}, {'o': 'b'}, 3], {'o': 'b'}, []]}]",
	      "[{'_id': 1, 'o': 'a', 'y': {'o': 'a'}, 'arr': [[{'o': 'a', 'k': 1}, 3], []]}]");
	check("[{'$redact': '$$KEEP'}]", "[{'_id': 1, 'a': {'b': 1}}]", "[{'_id': 1, 'a': {'b': 1}}]");
	check("[{'$redact': 'prune'}]", "[{'_id': 1}]", "[]");
	check_err("[{'$redact': '$a'}]", "[{'_id': 1, 'a': 2}]", 17053, "but returned 2");
	check_err("[{'$redact': '$a'}]", "[{'_id': 1}]", 17053, "but returned MISSING");
	check_err("[{'$redact': 'x'}]", "[{'_id': 1}]", 17053, "but returned \"x\"");
	check_err("[{'$redact': '$a'}]", "[{'_id': 1, 'a': {'b': 'x', 'c': [1, 2.5, null]}}]", 17053,
		  "but returned {b: \"x\", c: [1, 2.5, null]}");
	check_err("[{'$project': {'a': '$$DESCEND'}}]", "[]", 17276, "Use of undefined variable: DESCEND");
}

/* Blocking stages over more than max_memory_bytes fail with 292; $sort + $limit keeps only
 * the top documents and stays under the bound. */
static void test_memory_limit(void **state)
{
	(void)state;
	sdb_pipeline_opts o = {.max_memory_bytes = 24000};
	char *docs = malloc(200000);
	size_t len = 0;
	int code;
	char err[512];
	char *got;

	len += (size_t)sprintf(docs + len, "[");
	for (int i = 0; i < 1000; i++) {
		len += (size_t)sprintf(docs + len, "%s{'_id': %d, 'k': %d, 'pad': 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'}",
				       i ? ", " : "", i, (i * 7919) % 1000);
	}
	sprintf(docs + len, "]");

	got = run("[{'$sort': {'k': 1}}]", docs, &o, &code, err, sizeof err);
	assert_null(got);
	assert_int_equal(code, 292);
	assert_non_null(strstr(err, "Exceeded memory limit for $sort"));

	got = run("[{'$group': {'_id': null, 'all': {'$push': '$pad'}}}]", docs, &o, &code, err, sizeof err);
	assert_null(got);
	assert_int_equal(code, 292);
	assert_non_null(strstr(err, "Exceeded memory limit for $group"));

	/* $bucketAuto holds every input's groupBy value and accumulator arguments (not the
	 * documents: a fresh user's 120 x 1 MiB documents failed) under the same bound */
	got = run("[{'$bucketAuto': {'groupBy': '$k', 'buckets': 2}}]", docs, &o, &code, err, sizeof err);
	assert_null(got);
	assert_int_equal(code, 292);
	assert_non_null(strstr(err, "Exceeded memory limit for $bucketAuto"));
	{
		/* a bound the whole documents exceed (1000 x ~300 bytes held) but the values
		 * fit; an accumulator of the whole pad still does not */
		sdb_pipeline_opts big = {.max_memory_bytes = 300000};
		got = run("[{'$bucketAuto': {'groupBy': '$k', 'buckets': 2}}, {'$project': {'_id': 0}}]",
			  docs, &big, &code, err, sizeof err);
		if (got == NULL)
			fail_msg("bucketAuto under 300000 bytes: %d %s", code, err);
		assert_string_equal(got, "{ \"v\" : [ { \"count\" : { \"$numberInt\" : \"500\" } }, { \"count\" : { \"$numberInt\" : \"500\" } } ] }");
		bson_free(got);
		got = run("[{'$bucketAuto': {'groupBy': '$k', 'buckets': 2, 'output': {'p': {'$push': '$$ROOT'}}}}]",
			  docs, &big, &code, err, sizeof err);
		assert_null(got);
		assert_int_equal(code, 292);
	}
	got = run("[{'$match': {'k': {'$lt': 30}}}, {'$bucketAuto': {'groupBy': '$k', 'buckets': 3}},"
		  " {'$project': {'_id': 0, 'count': 1}}]",
		  docs, &o, &code, err, sizeof err);
	assert_non_null(got);
	assert_string_equal(got, "{ \"v\" : [ { \"count\" : { \"$numberInt\" : \"10\" } }, { \"count\" : { \"$numberInt\" : \"10\" } }, { \"count\" : { \"$numberInt\" : \"10\" } } ] }");
	bson_free(got);

	/* $facet holds its whole input under the same bound; its sub-pipelines too */
	got = run("[{'$facet': {'n': [{'$count': 'n'}]}}]", docs, &o, &code, err, sizeof err);
	assert_null(got);
	assert_int_equal(code, 292);
	assert_non_null(strstr(err, "Exceeded memory limit for $facet"));
	got = run("[{'$match': {'k': {'$lt': 100}}}, {'$facet': {'s': [{'$group': {'_id': null, 'all': {'$push': '$pad'}}},"
		  " {'$project': {'_id': 0, 'n': {'$size': '$all'}}}]}}]",
		  docs, &o, &code, err, sizeof err);
	assert_non_null(got);
	assert_string_equal(got, "{ \"v\" : [ { \"s\" : [ { \"n\" : { \"$numberInt\" : \"100\" } } ] } ] }");
	bson_free(got);

	got = run("[{'$sort': {'k': -1}}, {'$limit': 2}, {'$project': {'_id': 0, 'k': 1}}]", docs, &o, &code, err,
		  sizeof err);
	assert_non_null(got);
	assert_string_equal(got, "{ \"v\" : [ { \"k\" : { \"$numberInt\" : \"999\" } }, { \"k\" : { \"$numberInt\" : \"998\" } } ] }");
	bson_free(got);

	got = run("[{'$sort': {'k': 1}}, {'$skip': 3}, {'$limit': 1}, {'$project': {'_id': 0, 'k': 1}}]", docs, &o, &code,
		  err, sizeof err);
	assert_non_null(got);
	assert_string_equal(got, "{ \"v\" : [ { \"k\" : { \"$numberInt\" : \"3\" } } ] }");
	bson_free(got);

	/* the default bound (100 MB) lets the same data through */
	got = run("[{'$sort': {'k': 1}}, {'$group': {'_id': null, 'n': {'$sum': 1}}}]", docs, NULL, &code, err,
		  sizeof err);
	assert_non_null(got);
	assert_string_equal(got, "{ \"v\" : [ { \"_id\" : null, \"n\" : { \"$numberInt\" : \"1000\" } } ] }");
	bson_free(got);
	free(docs);
}

static void test_pushdown(void **state)
{
	(void)state;
	bson_t parr;
	bson_t *pw = JA("[{'$match': {'a': 1}}, {'$match': {'b': 2}}, {'$sort': {'a': 1}}, {'$skip': 2},"
			" {'$limit': 5}, {'$limit': 3}, {'$project': {'a': 1}}]",
			&parr);
	sdb_pipeline *p;
	sdb_pipeline_pushdown_t pd;
	int code;
	char err[256];
	char *s;

	assert_int_equal(sdb_pipeline_parse(&parr, NULL, &p, &code, err, sizeof err), 0);
	assert_int_equal(sdb_pipeline_pushdown(p, SDB_PUSHDOWN_MATCH | SDB_PUSHDOWN_SORT | SDB_PUSHDOWN_LIMIT, &pd), 0);
	s = bson_as_canonical_extended_json(&pd.filter, NULL);
	assert_string_equal(s, "{ \"$and\" : [ { \"a\" : { \"$numberInt\" : \"1\" } }, { \"b\" : { \"$numberInt\" : \"2\" } } ] }");
	bson_free(s);
	s = bson_as_canonical_extended_json(&pd.sort, NULL);
	assert_string_equal(s, "{ \"a\" : { \"$numberInt\" : \"1\" } }");
	bson_free(s);
	assert_int_equal(pd.skip, 2);
	assert_int_equal(pd.limit, 3);
	sdb_pipeline_pushdown_destroy(&pd);

	/* what is left runs on the store's output: the $project only */
	{
		input in = {.fail_after = -1};
		bson_t darr;
		bson_t *dw = JA("[{'_id': 7, 'a': 1, 'b': 2}]", &darr);
		sdb_pipeline_cursor *c;
		const bson_t *d;

		bson_iter_init(&in.it, &darr);
		sdb_pipeline_open(p, input_next, &in, &c);
		assert_int_equal(sdb_pipeline_cursor_next(c, &d, &code, err, sizeof err), 1);
		s = bson_as_canonical_extended_json(d, NULL);
		assert_string_equal(s, "{ \"_id\" : { \"$numberInt\" : \"7\" }, \"a\" : { \"$numberInt\" : \"1\" } }");
		bson_free(s);
		assert_int_equal(sdb_pipeline_cursor_next(c, &d, &code, err, sizeof err), 0);
		assert_int_equal(sdb_pipeline_cursor_next(c, &d, &code, err, sizeof err), 0);
		sdb_pipeline_cursor_free(c);
		bson_destroy(dw);
	}
	sdb_pipeline_free(p);
	bson_destroy(pw);

	/* a $match with $expr is pushed down too (the store's query runs $expr), with the
	 * $sort after it */
	pw = JA("[{'$match': {'a': 1}}, {'$match': {'$expr': {'$eq': ['$a', '$b']}}}, {'$sort': {'a': 1}}]", &parr);
	assert_int_equal(sdb_pipeline_parse(&parr, NULL, &p, &code, err, sizeof err), 0);
	assert_int_equal(sdb_pipeline_pushdown(p, SDB_PUSHDOWN_MATCH | SDB_PUSHDOWN_SORT, &pd), 0);
	s = bson_as_canonical_extended_json(&pd.filter, NULL);
	assert_string_equal(s, "{ \"$and\" : [ { \"a\" : { \"$numberInt\" : \"1\" } }, { \"$expr\" : { \"$eq\" : [ \"$a\", \"$b\" ] } } ] }");
	bson_free(s);
	assert_false(bson_empty(&pd.sort));
	sdb_pipeline_pushdown_destroy(&pd);
	sdb_pipeline_free(p);
	bson_destroy(pw);

	/* an empty pipeline pushes nothing down and stays empty (no memmove of its NULL
	 * stage array: UBSan aborted `aggregate` with `pipeline: []`) */
	pw = JA("[]", &parr);
	assert_int_equal(sdb_pipeline_parse(&parr, NULL, &p, &code, err, sizeof err), 0);
	assert_int_equal(sdb_pipeline_pushdown(p, SDB_PUSHDOWN_MATCH | SDB_PUSHDOWN_SORT | SDB_PUSHDOWN_LIMIT, &pd), 0);
	assert_true(bson_empty(&pd.filter));
	assert_true(bson_empty(&pd.sort));
	sdb_pipeline_pushdown_destroy(&pd);
	sdb_pipeline_free(p);
	bson_destroy(pw);

	/* match only: the $sort stays in the pipeline */
	pw = JA("[{'$match': {'a': 1}}, {'$sort': {'a': 1}}]", &parr);
	assert_int_equal(sdb_pipeline_parse(&parr, NULL, &p, &code, err, sizeof err), 0);
	assert_int_equal(sdb_pipeline_pushdown(p, SDB_PUSHDOWN_MATCH, &pd), 0);
	s = bson_as_canonical_extended_json(&pd.filter, NULL);
	assert_string_equal(s, "{ \"a\" : { \"$numberInt\" : \"1\" } }");
	bson_free(s);
	assert_true(bson_empty(&pd.sort));
	assert_int_equal(pd.limit, -1);
	sdb_pipeline_pushdown_destroy(&pd);
	sdb_pipeline_free(p);
	bson_destroy(pw);
}

static void test_input_error(void **state)
{
	(void)state;
	bson_t parr, darr;
	bson_t *pw = JA("[{'$match': {}}]", &parr), *dw = JA("[{'a': 1}, {'a': 2}]", &darr);
	sdb_pipeline *p;
	sdb_pipeline_cursor *c;
	input in = {.fail_after = 1};
	const bson_t *d;
	int code;
	char err[256];

	assert_int_equal(sdb_pipeline_parse(&parr, NULL, &p, &code, err, sizeof err), 0);
	bson_iter_init(&in.it, &darr);
	sdb_pipeline_open(p, input_next, &in, &c);
	assert_int_equal(sdb_pipeline_cursor_next(c, &d, &code, err, sizeof err), 1);
	assert_int_equal(sdb_pipeline_cursor_next(c, &d, &code, err, sizeof err), SDB_EIO);
	assert_int_equal(code, 1);
	assert_string_equal(err, "disk on fire");
	/* the failure sticks */
	assert_int_equal(sdb_pipeline_cursor_next(c, &d, &code, err, sizeof err), SDB_EIO);
	assert_int_equal(code, 1);
	sdb_pipeline_cursor_free(c);
	sdb_pipeline_free(p);
	bson_destroy(pw);
	bson_destroy(dw);
}

static void test_eval_expr(void **state)
{
	(void)state;
	bson_t *e = J("{'x': {'$multiply': ['$a', 3]}, 'm': '$nope'}"), *doc = J("{'a': 4}");
	bson_iter_t it;
	bson_t out;
	int code;
	char err[128];
	char *s;

	assert_true(bson_iter_init_find(&it, e, "x"));
	assert_int_equal(sdb_pipeline_eval_expr(&it, doc, &out, &code, err, sizeof err), 0);
	s = bson_as_canonical_extended_json(&out, NULL);
	assert_string_equal(s, "{ \"v\" : { \"$numberInt\" : \"12\" } }");
	bson_free(s);
	bson_destroy(&out);
	assert_true(bson_iter_init_find(&it, e, "m"));
	assert_int_equal(sdb_pipeline_eval_expr(&it, doc, &out, &code, err, sizeof err), 0);
	assert_true(bson_empty(&out));
	bson_destroy(&out);
	bson_destroy(e);
	bson_destroy(doc);
}

#define DEC(s) "{'$numberDecimal': '" s "'}"

/* Decimal128 operands give Decimal128 results (MongoDB 6.0's ExpressionAdd..., AccumulatorSum,
 * AccumulatorAvg): exact decimal digits, doubles converted as mongod converts them. */
static void test_decimal(void **state)
{
	(void)state;
	/* $group: decimals sum exactly; ints, longs and doubles join through their exact sum */
	check("[{'$group': {'_id': '$g', 's': {'$sum': '$v'}, 'a': {'$avg': '$v'}}}, {'$sort': {'_id': 1}}]",
	      "[{'g': 1, 'v': " DEC("0.1") "}, {'g': 1, 'v': " DEC("0.2") "},"
	      " {'g': 2, 'v': 1}, {'g': 2, 'v': {'$numberLong': '2'}}, {'g': 2, 'v': 0.5},"
	      " {'g': 2, 'v': " DEC("0.25") "}, {'g': 2, 'v': 'x'}]",
	      "[{'_id': 1, 's': " DEC("0.3") ", 'a': " DEC("0.15") "},"
	      " {'_id': 2, 's': " DEC("3.75") ", 'a': " DEC("0.9375") "}]");
	/* doubles: MongoDB's compensated sum (ten 0.1s make 1.0, not 0.9999999999999999) */
	check("[{'$group': {'_id': null, 's': {'$sum': '$v'}, 'a': {'$avg': '$v'}}}]",
	      "[{'v': 0.1}, {'v': 0.1}, {'v': 0.1}, {'v': 0.1}, {'v': 0.1}, {'v': 0.1}, {'v': 0.1},"
	      " {'v': 0.1}, {'v': 0.1}, {'v': 0.1}]",
	      "[{'_id': null, 's': 1.0, 'a': 0.1}]");
	/* NaN and Infinity propagate; a decimal overflow is Infinity */
	check("[{'$group': {'_id': null, 's': {'$sum': '$v'}}}]",
	      "[{'v': " DEC("NaN") "}, {'v': 1}]", "[{'_id': null, 's': " DEC("NaN") "}]");
	check("[{'$group': {'_id': null, 's': {'$sum': '$v'}}}]",
	      "[{'v': " DEC("9.999999999999999999999999999999999E+6144") "}, {'v': " DEC("1E+6144") "}]",
	      "[{'_id': null, 's': " DEC("Infinity") "}]");
	/* the accumulators of $bucket and $bucketAuto are $group's */
	check("[{'$bucketAuto': {'groupBy': '$k', 'buckets': 1, 'output': {'s': {'$sum': '$v'},"
	      " 'a': {'$avg': '$v'}}}}]",
	      "[{'k': 1, 'v': " DEC("0.10") "}, {'k': 2, 'v': 1}, {'k': 3, 'v': " DEC("0.2") "}]",
	      "[{'_id': {'min': 1, 'max': 3}, 's': " DEC("1.30") ", 'a': " DEC("0.4333333333333333333333333333333333") "}]");
	check("[{'$bucket': {'groupBy': '$k', 'boundaries': [0, 10], 'output': {'s': {'$sum': '$v'}}}}]",
	      "[{'k': 1, 'v': " DEC("0.10") "}, {'k': 2, 'v': 1}, {'k': 3, 'v': " DEC("0.2") "}]",
	      "[{'_id': 0, 's': " DEC("1.30") "}]");
	/* expressions */
	check("[{'$project': {'_id': 0,"
	      " 'add': {'$add': ['$d', 2]}, 'addd': {'$add': [" DEC("1") ", 0.1]},"
	      " 'adddf': {'$add': [0.1, " DEC("1") "]},"
	      " 'sub': {'$subtract': [" DEC("10.5") ", 0.25]}, 'mul': {'$multiply': [2, '$d']},"
	      " 'muld': {'$multiply': [0.5, " DEC("3") "]}, 'div': {'$divide': [" DEC("1") ", 3]},"
	      " 'mod': {'$mod': [" DEC("5.5") ", 2]}, 'abs': {'$abs': " DEC("-2.50") "},"
	      " 'floor': {'$floor': " DEC("-2.5") "}, 'ceil': {'$ceil': " DEC("2.1") "},"
	      " 'sum': {'$sum': ['$d', 2, 'x']}, 'avg': {'$avg': [" DEC("1") ", 2]},"
	      " 'str': {'$toString': '$d'}, 'nan': {'$add': [" DEC("NaN") ", 1]},"
	      " 'inf': {'$multiply': [" DEC("1E+6000") ", " DEC("1E+6000") "]},"
	      " 'negz': {'$multiply': [" DEC("-1.5") ", 0]}}}]",
	      "[{'d': " DEC("1.10") "}]",
	      "[{'add': " DEC("3.10") ", 'addd': " DEC("1.100000000000000") ","
	      " 'adddf': " DEC("1.100000000000000005551115123125783") ","
	      " 'sub': " DEC("10.250000000000000") ", 'mul': " DEC("2.20") ","
	      " 'muld': " DEC("1.500000000000000") ", 'div': " DEC("0.3333333333333333333333333333333333") ","
	      " 'mod': " DEC("1.5") ", 'abs': " DEC("2.50") ", 'floor': " DEC("-3") ","
	      " 'ceil': " DEC("3") ", 'sum': " DEC("3.10") ", 'avg': " DEC("1.5") ", 'str': '1.10',"
	      " 'nan': " DEC("NaN") ", 'inf': " DEC("Infinity") ", 'negz': " DEC("-0.0") "}]");
	/* $add with a date: a decimal total gives the date of its rounded value */
	check("[{'$project': {'_id': 0, 't': {'$add': ['$t', " DEC("1.5") "]}}}]",
	      "[{'t': {'$date': {'$numberLong': '1000'}}}]", "[{'t': {'$date': {'$numberLong': '1002'}}}]");
	check("[{'$project': {'_id': 0, 't': {'$subtract': ['$t', " DEC("2.5") "]}}}]",
	      "[{'t': {'$date': {'$numberLong': '1000'}}}]", "[{'t': {'$date': {'$numberLong': '998'}}}]");
	check_err("[{'$project': {'x': {'$add': ['$t', 1e300]}}}]",
		  "[{'t': {'$date': {'$numberLong': '1000'}}}]", 15, "date overflow in $add");
	check_err("[{'$project': {'x': {'$divide': ['$d', " DEC("0.00") "]}}}]", "[{'d': 1}]", 16608,
		  "by zero");
	check_err("[{'$project': {'x': {'$mod': [" DEC("1") ", 0]}}}]", "[{}]", 16610, "by zero");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_group),
		cmocka_unit_test(test_count),
		cmocka_unit_test(test_unwind),
		cmocka_unit_test(test_project),
		cmocka_unit_test(test_add_fields_unset),
		cmocka_unit_test(test_sort_skip_limit),
		cmocka_unit_test(test_sort_by_count),
		cmocka_unit_test(test_switch),
		cmocka_unit_test(test_bucket),
		cmocka_unit_test(test_bucket_auto),
		cmocka_unit_test(test_facet),
		cmocka_unit_test(test_expressions),
		cmocka_unit_test(test_stage_errors),
		cmocka_unit_test(test_match),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_memory_limit),
		cmocka_unit_test(test_sample),
		cmocka_unit_test(test_redact),
		cmocka_unit_test(test_pushdown),
		cmocka_unit_test(test_input_error),
		cmocka_unit_test(test_eval_expr),
		cmocka_unit_test(test_decimal),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
