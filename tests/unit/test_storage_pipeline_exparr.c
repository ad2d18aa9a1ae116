/* Unit tests of the aggregation expression operators for variables, arrays, sets and
 * objects (storage/pipeline_expr_var.c, _array.c, _obj.c): the MongoDB manual's examples
 * with their documented outputs, and MongoDB 6.0's error codes for bad arguments
 * (mongo/db/pipeline/expression.cpp). Outputs are compared as canonical extended JSON. */
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

#define P(expr) "[{'$project': {'_id': 0, 'r': " expr "}}]"
#define S64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define S1K S64 S64 S64 S64 S64 S64 S64 S64 S64 S64 S64 S64 S64 S64 S64 S64

/* $let, $map, $filter, $reduce and the variable rules */
static void test_variables(void **state)
{
	(void)state;
	/* manual $let: total = price + tax, discounted when applyDiscount */
	check(P("{'$let': {'vars': {'total': {'$add': ['$price', '$tax']},"
		" 'discounted': {'$cond': {'if': '$applyDiscount', 'then': 0.9, 'else': 1}}},"
		" 'in': {'$multiply': ['$$total', '$$discounted']}}}"),
	      "[{'price': 10, 'tax': 0.5, 'applyDiscount': true}, {'price': 10, 'tax': 0.25, 'applyDiscount': false}]",
	      "[{'r': 9.450000000000001}, {'r': 10.25}]");
	/* vars see only the outer scope; inner shadows outer; $$v.path */
	check(P("{'$let': {'vars': {'a': {'x': [1, 2]}}, 'in': {'$let': {'vars': {'a': '$$a.x'},"
		" 'in': '$$a'}}}}"), "[{}]", "[{'r': [1, 2]}]");
	check_err(P("{'$let': {'vars': {'a': 1, 'b': '$$a'}, 'in': '$$b'}}"), "[{}]", 17276,
		  "Use of undefined variable: a");
	/* manual $map: adjust grades */
	check(P("{'$map': {'input': '$quizzes', 'as': 'grade', 'in': {'$add': ['$$grade', 2]}}}"),
	      "[{'quizzes': [5, 6, 7]}, {'quizzes': []}, {'quizzes': [3, 8, 9]}]",
	      "[{'r': [7, 8, 9]}, {'r': []}, {'r': [5, 10, 11]}]");
	/* default $$this, missing results become null, null input gives null */
	check(P("{'$map': {'input': '$a', 'in': '$$this.x'}}"),
	      "[{'a': [{'x': 1}, {}, {'x': [2]}]}, {'a': null}, {}]",
	      "[{'r': [1, null, [2]]}, {'r': null}, {'r': null}]");
	/* nested $map: the inner variable shadows, the outer one stays readable */
	check(P("{'$map': {'input': [1, 2], 'as': 'o', 'in': {'$map': {'input': [10, 20],"
		" 'in': {'$add': ['$$o', '$$this']}}}}}"),
	      "[{}]", "[{'r': [[11, 21], [12, 22]]}]");
	/* manual $filter, with limit */
	check(P("{'$filter': {'input': '$items', 'as': 'item', 'cond': {'$gte': ['$$item.price', 100]}}}"),
	      "[{'items': [{'item_id': 43, 'quantity': 2, 'price': 10}, {'item_id': 2, 'quantity': 1, 'price': 240}]},"
	      " {'items': []}]",
	      "[{'r': [{'item_id': 2, 'quantity': 1, 'price': 240}]}, {'r': []}]");
	check(P("{'$filter': {'input': [1, 2, 3, 4, 5], 'as': 'n', 'cond': {'$gt': ['$$n', 1]},"
		" 'limit': 2}}"), "[{}]", "[{'r': [2, 3]}]");
	check(P("{'$filter': {'input': [1, 2], 'cond': true, 'limit': null}}"), "[{}]",
	      "[{'r': [1, 2]}]");
	check_err(P("{'$filter': {'input': [1], 'cond': true, 'limit': 0}}"), "[{}]", 327392,
		  "limit must be greater than 0");
	check_err(P("{'$filter': {'input': [1], 'cond': true, 'limit': 1.5}}"), "[{}]", 327391,
		  "32-bit integral");
	/* manual $reduce: concatenate strings, sum, and multiply */
	check(P("{'$reduce': {'input': ['a', 'b', 'c'], 'initialValue': '',"
		" 'in': {'$concat': ['$$value', '$$this']}}}"), "[{}]", "[{'r': 'abc'}]");
	check(P("{'$reduce': {'input': [1, 2, 3, 4], 'initialValue': {'sum': 5, 'product': 2},"
		" 'in': {'sum': {'$add': ['$$value.sum', '$$this']},"
		" 'product': {'$multiply': ['$$value.product', '$$this']}}}}"),
	      "[{}]", "[{'r': {'sum': 15, 'product': 48}}]");
	check(P("{'$reduce': {'input': [[3, 4], [5, 6]], 'initialValue': [1, 2],"
		" 'in': {'$concatArrays': ['$$value', '$$this']}}}"),
	      "[{}]", "[{'r': [1, 2, 3, 4, 5, 6]}]");
	check(P("{'$reduce': {'input': '$nope', 'initialValue': 0, 'in': 1}}"), "[{}]",
	      "[{'r': null}]");
	check_err(P("{'$reduce': {'input': 5, 'initialValue': 0, 'in': 1}}"), "[{}]", 40080,
		  "'input' be an array, found: 5");
	/* the accumulator grown in place (its one read moves it): linear, 50,000 elements */
	check(P("{'$let': {'vars': {'a': {'$reduce': {'input': {'$range': [0, 50000]},"
		" 'initialValue': [], 'in': {'$concatArrays': ['$$value', ['$$this']]}}}},"
		" 'in': [{'$size': '$$a'}, {'$first': '$$a'}, {'$last': '$$a'},"
		" {'$arrayElemAt': ['$$a', 31337]}]}}"),
	      "[{}]", "[{'r': [50000, 0, 49999, 31337]}]");
	/* nested $concatArrays, and an initial value from the document (not moved from it) */
	check(P("{'$reduce': {'input': [1, 2], 'initialValue': '$a',"
		" 'in': {'$concatArrays': [{'$concatArrays': ['$$value', ['$$this']]}, [0]]}}}"),
	      "[{'a': [9]}, {'a': null}]", "[{'r': [9, 1, 0, 2, 0]}, {'r': null}]");
	/* $$value read twice, or inside a loop, is not moved: each read sees it whole */
	check(P("{'$reduce': {'input': [1, 2], 'initialValue': [7],"
		" 'in': {'$concatArrays': ['$$value', '$$value', ['$$this']]}}}"),
	      "[{}]", "[{'r': [7, 7, 1, 7, 7, 1, 2]}]");
	check(P("{'$reduce': {'input': [1, 2], 'initialValue': [0],"
		" 'in': {'$map': {'input': [1, 2], 'in': {'$size': '$$value'}}}}}"),
	      "[{}]", "[{'r': [2, 2]}]");
	check(P("{'$reduce': {'input': [1, 2, 3], 'initialValue': [],"
		" 'in': {'$cond': [{'$eq': ['$$this', 2]}, [], {'$concatArrays': ['$$value', ['$$this']]}]}}}"),
	      "[{}]", "[{'r': [3]}]");
	check(P("{'$reduce': {'input': [1, 2], 'initialValue': {'a': [0]},"
		" 'in': {'$concatArrays': ['$$value.a', ['$$this']]}}}"),
	      "[{}]", "[{'r': [2]}]");
	/* a $cond/$switch reading $$value in its condition and in its branches: a branch's
	 * one read moves the accumulator (linear), a branch reading it twice copies */
	check(P("{'$let': {'vars': {'a': {'$reduce': {'input': {'$range': [0, 5000]},"
		" 'initialValue': [], 'in': {'$cond': [{'$gte': [{'$size': '$$value'}, 0]},"
		" {'$concatArrays': ['$$value', ['$$this']]}, '$$value']}}}},"
		" 'in': [{'$size': '$$a'}, {'$last': '$$a'}]}}"),
	      "[{}]", "[{'r': [5000, 4999]}]");
	check(P("{'$reduce': {'input': [1, 2, 3, 4, 5, 6], 'initialValue': [],"
		" 'in': {'$cond': [{'$lt': [{'$size': '$$value'}, 3]},"
		" {'$concatArrays': ['$$value', ['$$this']]}, '$$value']}}}"),
	      "[{}]", "[{'r': [1, 2, 3]}]");
	check(P("{'$reduce': {'input': [1, 2, 3, 4], 'initialValue': [],"
		" 'in': {'$cond': [{'$lt': [{'$size': '$$value'}, 2]},"
		" {'$concatArrays': ['$$value', ['$$this']]}, {'$concatArrays': [['x'], '$$value']}]}}}"),
	      "[{}]", "[{'r': ['x', 'x', 1, 2]}]");
	check(P("{'$reduce': {'input': [1, 2, 3], 'initialValue': [0],"
		" 'in': {'$cond': [true, {'$concatArrays': ['$$value', '$$value']}, '$$value']}}}"),
	      "[{}]", "[{'r': [0, 0, 0, 0, 0, 0, 0, 0]}]");
	check(P("{'$reduce': {'input': [1, 2, 3], 'initialValue': [0], 'in': {'$cond': {"
		" 'if': {'$gt': ['$$this', 1]}, 'then': {'$concatArrays': ['$$value', ['$$this']]},"
		" 'else': {'$concatArrays': ['$$value', [{'$size': '$$value'}]]}}}}}"),
	      "[{}]", "[{'r': [0, 1, 2, 3]}]");
	check(P("{'$reduce': {'input': [1, 2, 3], 'initialValue': {'n': 0},"
		" 'in': {'$cond': [{'$gt': ['$$value.n', 1]}, '$$value',"
		" {'$mergeObjects': ['$$value', {'n': {'$add': ['$$value.n', 1]}}]}]}}}"),
	      "[{}]", "[{'r': {'n': 2}}]");
	check(P("{'$reduce': {'input': [1, 2, 3], 'initialValue': [], 'in': {'$switch': {"
		" 'branches': [{'case': {'$eq': ['$$this', 1]}, 'then': {'$concatArrays': ['$$value', ['one']]}},"
		" {'case': {'$in': ['$$this', '$$value']}, 'then': '$$value'}],"
		" 'default': {'$concatArrays': ['$$value', ['$$this']]}}}}}"),
	      "[{}]", "[{'r': ['one', 2, 3]}]");
	check(P("{'$reduce': {'input': [1, 2], 'initialValue': [],"
		" 'in': {'$cond': [{'$eq': [{'$size': '$$value'}, 0]},"
		" {'$concatArrays': ['$$value', ['$$this']]},"
		" {'$let': {'vars': {'v': '$$value'}, 'in': {'$concatArrays': ['$$v', '$$value']}}}]}}}"),
	      "[{}]", "[{'r': [1, 1]}]");
	check(P("{'$reduce': {'input': [1, 2, 3], 'initialValue': [],"
		" 'in': {'$cond': [false, '$$value', {'$map': {'input': [1],"
		" 'in': {'$concatArrays': ['$$value', ['$$this']]}}}]}}}"),
	      "[{}]", "[{'r': [[[[1], 1], 1]]}]");
	/* a repeated key frees what was parsed first (the last wins, as MongoDB): the
	 * analysis walks the parsed tree, never a freed read (review: a freed read's address
	 * reused by an inner $reduce's $$value moved the wrong accumulator; a freed whole
	 * read was written to) */
	check(P("{'$reduce': {'input': [1, 2], 'initialValue': [0], 'in': {'$cond': {'if': true,"
		" 'then': '$$value', 'then': {'$literal': [1]}, 'else': [2]}}}}"),
	      "[{}]", "[{'r': [1]}]");
	check(P("{'$reduce': {'input': [[1, 2]], 'initialValue': [], 'in': {'$cond': {"
		" 'if': {'$isArray': '$$value'}, 'then': {'$concatArrays': [{'$concatArrays':"
		" [{'$concatArrays': [{'$concatArrays': ['$$value']}]}]}]},"
		" 'then': {'$reduce': {'input': '$$this', 'initialValue': '$$this',"
		" 'in': {'$concatArrays': ['$$value', '$$value']}}}, 'else': '$$value'}}}}"),
	      "[{}]", "[{'r': [1, 2, 1, 2, 1, 2, 1, 2]}]");
	/* a $let inside `in` shadows $$value: the outer one is not the one read */
	check(P("{'$reduce': {'input': [1, 2], 'initialValue': [5], 'in': {'$let': {'vars':"
		" {'value': [8]}, 'in': {'$concatArrays': ['$$value', ['$$this']]}}}}}"),
	      "[{}]", "[{'r': [8, 2]}]");
	/* $$this and $$value of an outer $reduce read inside an inner one */
	check(P("{'$reduce': {'input': [[1, 2], [3]], 'initialValue': [], 'in': {'$reduce':"
		" {'input': '$$this', 'initialValue': '$$value',"
		" 'in': {'$concatArrays': ['$$value', ['$$this']]}}}}}"),
	      "[{}]", "[{'r': [1, 2, 3]}]");
	/* argument errors */
	check_err(P("{'$let': 1}"), "[{}]", 16874, "$let only supports an object");
	check_err(P("{'$let': {'vars': {}, 'in': 1, 'x': 2}}"), "[{}]", 16875,
		  "Unrecognized parameter to $let: x");
	check_err(P("{'$let': {'in': 1}}"), "[{}]", 16876, "Missing 'vars'");
	check_err(P("{'$let': {'vars': {}}}"), "[{}]", 16877, "Missing 'in'");
	check_err(P("{'$let': {'vars': {'Bad': 1}, 'in': 1}}"), "[{}]", 16867,
		  "starts with an invalid character for a user variable name");
	check_err(P("{'$let': {'vars': {'a-b': 1}, 'in': 1}}"), "[{}]", 16868, NULL);
	check_err(P("{'$let': {'vars': {'': 1}, 'in': 1}}"), "[{}]", 16866, NULL);
	check_err(P("'$$'"), "[{}]", 16869, "empty variable names");
	check_err(P("'$$1x'"), "[{}]", 16870, NULL);
	check_err(P("'$$a-b'"), "[{}]", 16871, NULL);
	check_err(P("'$$this'"), "[{}]", 17276, "Use of undefined variable: this");
	check_err(P("{'$map': []}"), "[{}]", 16878, NULL);
	check_err(P("{'$map': {'input': [], 'in': 1, 'x': 1}}"), "[{}]", 16879, NULL);
	check_err(P("{'$map': {'in': 1}}"), "[{}]", 16880, NULL);
	check_err(P("{'$map': {'input': []}}"), "[{}]", 16882, NULL);
	check_err(P("{'$map': {'input': 'abc', 'in': 1}}"), "[{}]", 16883,
		  "input to $map must be an array not string");
	check_err(P("{'$map': {'input': [], 'as': 'X', 'in': 1}}"), "[{}]", 16867, NULL);
	check_err(P("{'$filter': 1}"), "[{}]", 28646, NULL);
	check_err(P("{'$filter': {'input': [], 'cond': 1, 'y': 1}}"), "[{}]", 28647, NULL);
	check_err(P("{'$filter': {'cond': 1}}"), "[{}]", 28648, NULL);
	check_err(P("{'$filter': {'input': []}}"), "[{}]", 28650, NULL);
	check_err(P("{'$filter': {'input': 1, 'cond': 1}}"), "[{}]", 28651, NULL);
	check_err(P("{'$reduce': 1}"), "[{}]", 40075, NULL);
	check_err(P("{'$reduce': {'input': [], 'initialValue': 0, 'in': 1, 'z': 1}}"), "[{}]", 40076, NULL);
	check_err(P("{'$reduce': {'initialValue': 0, 'in': 1}}"), "[{}]", 40077, NULL);
	check_err(P("{'$reduce': {'input': [], 'in': 1}}"), "[{}]", 40078, NULL);
	check_err(P("{'$reduce': {'input': [], 'initialValue': 0}}"), "[{}]", 40079, NULL);
	/* $$this outside $map's `in` is unbound */
	check_err(P("{'$map': {'input': '$$this', 'in': 1}}"), "[{}]", 17276, NULL);
}

/* the array operators */
static void test_arrays(void **state)
{
	(void)state;
	/* $slice (manual) */
	check("[{'$project': {'_id': 0, 'a': {'$slice': ['$f', 1]}, 'b': {'$slice': ['$f', -1]},"
	      " 'c': {'$slice': ['$f', 1, 1]}, 'd': {'$slice': ['$f', -2, 5]},"
	      " 'e': {'$slice': ['$f', 10, 1]}, 'n': {'$slice': ['$z', 1]}}}]",
	      "[{'f': ['pie', 'ice cream', 'cake']}]",
	      "[{'a': ['pie'], 'b': ['cake'], 'c': ['ice cream'], 'd': ['ice cream', 'cake'],"
	      " 'e': [], 'n': null}]");
	check_err(P("{'$slice': [1, 1]}"), "[{}]", 28724, NULL);
	check_err(P("{'$slice': [[1], 'a']}"), "[{}]", 28725, NULL);
	check_err(P("{'$slice': [[1], 1.5]}"), "[{}]", 28726, NULL);
	check_err(P("{'$slice': [[1], 0, 'a']}"), "[{}]", 28727, NULL);
	check_err(P("{'$slice': [[1], 0, 2.5]}"), "[{}]", 28728, NULL);
	check_err(P("{'$slice': [[1], 0, 0]}"), "[{}]", 28729, "must be positive: 0");
	check_err(P("{'$slice': [[1]]}"), "[{}]", 16020, NULL);
	/* $reverseArray */
	check(P("{'$reverseArray': '$a'}"), "[{'a': [1, [2], {'x': 3}]}, {'a': []}, {}]",
	      "[{'r': [{'x': 3}, [2], 1]}, {'r': []}, {'r': null}]");
	check_err(P("{'$reverseArray': 1}"), "[{}]", 34435, NULL);
	/* $range (manual) */
	check("[{'$project': {'_id': 0, 'a': {'$range': [0, 10, 2]}, 'b': {'$range': [10, 0, -2]},"
	      " 'c': {'$range': [0, 10, -2]}, 'd': {'$range': [0, 5]}, 'e': {'$range': [0, 5.0]}}}]",
	      "[{}]",
	      "[{'a': [0, 2, 4, 6, 8], 'b': [10, 8, 6, 4, 2], 'c': [], 'd': [0, 1, 2, 3, 4],"
	      " 'e': [0, 1, 2, 3, 4]}]");
	check_err(P("{'$range': ['a', 1]}"), "[{}]", 34443, NULL);
	check_err(P("{'$range': [0.5, 1]}"), "[{}]", 34444, NULL);
	check_err(P("{'$range': [0, null]}"), "[{}]", 34445, NULL);
	check_err(P("{'$range': [0, 1e10]}"), "[{}]", 34446, NULL);
	check_err(P("{'$range': [0, 1, 'x']}"), "[{}]", 34447, NULL);
	check_err(P("{'$range': [0, 1, 0.5]}"), "[{}]", 34448, NULL);
	check_err(P("{'$range': [0, 1, 0]}"), "[{}]", 34449, NULL);
	/* the 100 MiB rule: MongoDB's estimate, 16 bytes an element */
	check_err(P("{'$range': [0, 2147483647]}"), "[{}]", 146,
		  "$range would use too much memory");
	check_err(P("{'$range': [-2147483648, 2147483647, 1]}"), "[{}]", 146, NULL);
	check(P("{'$size': {'$range': [-2147483648, 2147483647, 1073741824]}}"), "[{}]",
	      "[{'r': 4}]");
	/* $indexOfArray (manual) */
	check("[{'$project': {'_id': 0, 'i': {'$indexOfArray': ['$items', 2]},"
	      " 'j': {'$indexOfArray': ['$items', 2, 2]}, 'k': {'$indexOfArray': ['$items', 2, 0, 1]},"
	      " 'n': {'$indexOfArray': ['$z', 2]}}}]",
	      "[{'items': ['one', 2, 'three', 2]}]", "[{'i': 1, 'j': 3, 'k': -1, 'n': null}]");
	check_err(P("{'$indexOfArray': ['a', 1]}"), "[{}]", 40090, NULL);
	check_err(P("{'$indexOfArray': [[1], 1, 1.5]}"), "[{}]", 40096, NULL);
	check_err(P("{'$indexOfArray': [[1], 1, -1]}"), "[{}]", 40097, NULL);
	check_err(P("{'$indexOfArray': [[1]]}"), "[{}]", 16020, NULL);
	/* $zip (manual) */
	check(P("{'$zip': {'inputs': [[1, 2, 3], ['a', 'b']]}}"), "[{}]",
	      "[{'r': [[1, 'a'], [2, 'b']]}]");
	check(P("{'$zip': {'inputs': [[1, 2, 3], ['a']], 'useLongestLength': true}}"), "[{}]",
	      "[{'r': [[1, 'a'], [2, null], [3, null]]}]");
	check(P("{'$zip': {'inputs': [[1], ['a', 'b']], 'useLongestLength': true,"
		" 'defaults': [0, 'z']}}"), "[{}]", "[{'r': [[1, 'a'], [0, 'b']]}]");
	check(P("{'$zip': {'inputs': [[1], '$nope']}}"), "[{}]", "[{'r': null}]");
	check_err(P("{'$zip': 1}"), "[{}]", 34460, NULL);
	check_err(P("{'$zip': {'inputs': 1}}"), "[{}]", 34461, NULL);
	check_err(P("{'$zip': {'inputs': [[1]], 'defaults': 1}}"), "[{}]", 34462, NULL);
	check_err(P("{'$zip': {'inputs': [[1]], 'useLongestLength': 1}}"), "[{}]", 34463, NULL);
	check_err(P("{'$zip': {'inputs': [[1]], 'x': 1}}"), "[{}]", 34464, NULL);
	check_err(P("{'$zip': {}}"), "[{}]", 34465, NULL);
	check_err(P("{'$zip': {'inputs': [[1]], 'defaults': [1]}}"), "[{}]", 34466, NULL);
	check_err(P("{'$zip': {'inputs': [[1]], 'useLongestLength': true, 'defaults': [1, 2]}}"),
		  "[{}]", 34467, NULL);
	check_err(P("{'$zip': {'inputs': [[1], 3]}}"), "[{}]", 34468,
		  "$zip found a non-array expression in input: 3");
	/* $first / $last (expression forms) */
	check("[{'$project': {'_id': 0, 'f': {'$first': '$a'}, 'l': {'$last': '$a'},"
	      " 'e': {'$first': [[]]}, 'n': {'$last': '$z'}}}]",
	      "[{'a': [1, 2, 3]}]", "[{'f': 1, 'l': 3, 'n': null}]");
	check_err(P("{'$first': 'abc'}"), "[{}]", 28689,
		  "$first's first argument must be an array, but is string");
	check_err(P("{'$last': [[1], [2]]}"), "[{}]", 16020, NULL);
	/* the $group accumulators of the same names still work */
	check("[{'$group': {'_id': null, 'f': {'$first': '$a'}, 'l': {'$last': '$a'}}}]",
	      "[{'a': 1}, {'a': 2}]", "[{'_id': null, 'f': 1, 'l': 2}]");
	/* $allElementsTrue / $anyElementTrue (manual) */
	check("[{'$project': {'_id': 0, 'all': {'$allElementsTrue': ['$r']},"
	      " 'any': {'$anyElementTrue': ['$r']}}}]",
	      "[{'r': [true, 1, 'x']}, {'r': [[false]]}, {'r': [null, false, 0]}, {'r': []}]",
	      "[{'all': true, 'any': true}, {'all': true, 'any': true},"
	      " {'all': false, 'any': false}, {'all': true, 'any': false}]");
	check_err(P("{'$allElementsTrue': [1]}"), "[{}]", 17040, NULL);
	check_err(P("{'$anyElementTrue': ['$z']}"), "[{}]", 17041, "but is missing");
}

/* the set operators (manual examples) */
static void test_sets(void **state)
{
	(void)state;
	check("[{'$project': {'_id': 0, 'u': {'$setUnion': ['$a', '$b']},"
	      " 'i': {'$setIntersection': ['$a', '$b']}, 'd': {'$setDifference': ['$b', '$a']},"
	      " 'e': {'$setEquals': ['$a', '$b']}, 's': {'$setIsSubset': ['$a', '$b']}}}]",
	      "[{'a': ['red', 'blue'], 'b': ['blue', 'red', 'blue']},"
	      " {'a': ['red', 'blue'], 'b': ['green', 'red']},"
	      " {'a': ['red', 'blue'], 'b': []}]",
	      "[{'u': ['blue', 'red'], 'i': ['blue', 'red'], 'd': [], 'e': true, 's': true},"
	      " {'u': ['blue', 'green', 'red'], 'i': ['red'], 'd': ['green'], 'e': false, 's': false},"
	      " {'u': ['blue', 'red'], 'i': [], 'd': [], 'e': false, 's': false}]");
	/* numbers compare by value, mixed types in MongoDB order, nested arrays are elements */
	check(P("{'$setUnion': [[2, 1.0, {'$numberLong': '1'}], ['a', [1]], []]}"), "[{}]",
	      "[{'r': [1.0, 2, 'a', [1]]}]");
	/* of equal values of different types the first one (argument order, then array order)
	 * is kept, as mongod's ValueSet (a std::set) keeps the first inserted: whatever the
	 * sort, with many equal values of two types interleaved */
	check(P("{'$setUnion': [{'$map': {'input': {'$range': [0, 300]}, 'in': {'$cond': ["
		"{'$eq': [{'$mod': ['$$this', 2]}, 0]}, {'$toLong': {'$mod': ['$$this', 3]}},"
		" {'$toDouble': {'$mod': ['$$this', 3]}}]}}}, [1]]}"), "[{}]",
	      "[{'r': [{'$numberLong': '0'}, 1.0, {'$numberLong': '2'}]}]");
	check(P("{'$setUnion': [[{'$numberLong': '1'}], [1.0, 1]]}"), "[{}]",
	      "[{'r': [{'$numberLong': '1'}]}]");
	check(P("{'$setIntersection': [[{'$numberLong': '1'}, 1, 2.0, 2], [1.0, 2]]}"), "[{}]",
	      "[{'r': [{'$numberLong': '1'}, 2.0]}]");
	check(P("{'$setIntersection': []}"), "[{}]", "[{'r': []}]");
	check(P("{'$setUnion': [[1], null]}"), "[{}]", "[{'r': null}]");
	check(P("{'$setDifference': [[3, 1, 3, 2], [2]]}"), "[{}]", "[{'r': [3, 1]}]");
	check(P("{'$setDifference': ['$z', [2]]}"), "[{}]", "[{'r': null}]");
	check_err(P("{'$setUnion': [[1], 1]}"), "[{}]", 17043, NULL);
	check_err(P("{'$setIntersection': [[1], 'x']}"), "[{}]", 17047, NULL);
	check_err(P("{'$setDifference': [1, []]}"), "[{}]", 17048, NULL);
	check_err(P("{'$setDifference': [[], 1]}"), "[{}]", 17049, NULL);
	check_err(P("{'$setEquals': [[1]]}"), "[{}]", 17045, "needs at least two arguments had: 1");
	check_err(P("{'$setEquals': [[1], null]}"), "[{}]", 17044, NULL);
	check_err(P("{'$setIsSubset': [1, []]}"), "[{}]", 17046, NULL);
	check_err(P("{'$setIsSubset': [[], '$z']}"), "[{}]", 17042, NULL);
}

/* $sortArray (manual examples) */
static void test_sort_array(void **state)
{
	(void)state;
	check("[{'$project': {'_id': 0, 'n': {'$sortArray': {'input': '$team', 'sortBy': {'name': 1}}},"
	      " 'a': {'$sortArray': {'input': '$team', 'sortBy': {'address.city': -1}}},"
	      " 'v': {'$sortArray': {'input': [20, 4, {'a': 'Free'}, 6, 21, 5, 'Gratis', {'a': null},"
	      " {'a': {'sale': true, 'price': 19}}, " "{'$numberDecimal': '10.23'}, {'a': 'On sale'}],"
	      " 'sortBy': 1}},"
	      " 'd': {'$sortArray': {'input': [1, 3, 2], 'sortBy': -1}},"
	      " 'z': {'$sortArray': {'input': '$nope', 'sortBy': 1}}}}]",
	      "[{'team': [{'name': 'pat', 'age': 30, 'address': {'street': '12 Baker St', 'city': 'London'}},"
	      " {'name': 'dallas', 'age': 36, 'address': {'street': '12 Cowper St', 'city': 'Palo Alto'}},"
	      " {'name': 'charlie', 'age': 42, 'address': {'street': '12 French St', 'city': 'New Brunswick'}}]}]",
	      "[{'n': [{'name': 'charlie', 'age': 42, 'address': {'street': '12 French St', 'city': 'New Brunswick'}},"
	      " {'name': 'dallas', 'age': 36, 'address': {'street': '12 Cowper St', 'city': 'Palo Alto'}},"
	      " {'name': 'pat', 'age': 30, 'address': {'street': '12 Baker St', 'city': 'London'}}],"
	      " 'a': [{'name': 'dallas', 'age': 36, 'address': {'street': '12 Cowper St', 'city': 'Palo Alto'}},"
	      " {'name': 'charlie', 'age': 42, 'address': {'street': '12 French St', 'city': 'New Brunswick'}},"
	      " {'name': 'pat', 'age': 30, 'address': {'street': '12 Baker St', 'city': 'London'}}],"
	      " 'v': [4, 5, 6, {'$numberDecimal': '10.23'}, 20, 21, 'Gratis', {'a': null}, {'a': 'Free'},"
	      " {'a': 'On sale'}, {'a': {'sale': true, 'price': 19}}],"
	      " 'd': [3, 2, 1], 'z': null}]");
	/* non-documents sort as missing fields; equal keys keep their order */
	check(P("{'$sortArray': {'input': [{'k': 2, 'i': 0}, 5, {'k': 1}, {'k': 2, 'i': 1}],"
		" 'sortBy': {'k': 1}}}"), "[{}]",
	      "[{'r': [5, {'k': 1}, {'k': 2, 'i': 0}, {'k': 2, 'i': 1}]}]");
	check_err(P("{'$sortArray': 1}"), "[{}]", 2942500, NULL);
	check_err(P("{'$sortArray': {'input': [], 'sortBy': 1, 'x': 1}}"), "[{}]", 2942501, NULL);
	check_err(P("{'$sortArray': {'sortBy': 1}}"), "[{}]", 2942502, NULL);
	check_err(P("{'$sortArray': {'input': []}}"), "[{}]", 2942503, NULL);
	check_err(P("{'$sortArray': {'input': 1, 'sortBy': 1}}"), "[{}]", 2942504, NULL);
	check_err(P("{'$sortArray': {'input': [], 'sortBy': 2}}"), "[{}]", 2942506, NULL);
	check_err(P("{'$sortArray': {'input': [], 'sortBy': {'a': 2}}}"), "[{}]", 15975, NULL);
}

/* $maxN / $minN / $firstN / $lastN, array forms (manual examples) */
static void test_n_operators(void **state)
{
	(void)state;
	check("[{'$project': {'_id': 0, 'max': {'$maxN': {'n': 2, 'input': '$score'}},"
	      " 'min': {'$minN': {'n': 2, 'input': '$score'}},"
	      " 'first': {'$firstN': {'n': 3, 'input': '$score'}},"
	      " 'last': {'$lastN': {'n': 2, 'input': '$score'}}}}]",
	      "[{'score': [1, 2, 3, 4, 5]}, {'score': [12, 90, 7, 89, 8]}, {'score': [null]},"
	      " {'score': []}, {'score': [20, 10, null, 400]}]",
	      "[{'max': [5, 4], 'min': [1, 2], 'first': [1, 2, 3], 'last': [4, 5]},"
	      " {'max': [90, 89], 'min': [7, 8], 'first': [12, 90, 7], 'last': [89, 8]},"
	      " {'max': [], 'min': [], 'first': [null], 'last': [null]},"
	      " {'max': [], 'min': [], 'first': [], 'last': []},"
	      " {'max': [400, 20], 'min': [10, 20], 'first': [20, 10, null], 'last': [null, 400]}]");
	/* equal values: the first kept, in input order (MongoDB's ordered multiset) */
	check(P("[{'$minN': {'n': 1, 'input': [1, 1.0]}}, {'$maxN': {'n': 3, 'input': [1, 2.0, 2]}}]"),
	      "[{}]", "[{'r': [[1], [2, 2.0, 1]]}]");
	check(P("{'$firstN': {'n': 2.0, 'input': [1, 2, 3]}}"), "[{}]", "[{'r': [1, 2]}]");
	check_err(P("{'$maxN': 5}"), "[{}]", 5787900, "specification must be an object");
	check_err(P("{'$firstN': [1]}"), "[{}]", 5787801, NULL);
	check_err(P("{'$lastN': {'n': 1, 'input': [], 'x': 1}}"), "[{}]", 5787901, NULL);
	check_err(P("{'$minN': {'input': []}}"), "[{}]", 5787906, NULL);
	check_err(P("{'$minN': {'n': 1}}"), "[{}]", 5787907, NULL);
	check_err(P("{'$minN': {'n': 'a', 'input': []}}"), "[{}]", 5787902, NULL);
	check_err(P("{'$minN': {'n': 1.5, 'input': []}}"), "[{}]", 5787903, NULL);
	check_err(P("{'$minN': {'n': 0, 'input': []}}"), "[{}]", 5787908, "found 0");
	check_err(P("{'$lastN': {'n': 1, 'input': null}}"), "[{}]", 5788200, "Input must be an array");
}

/* the object operators */
static void test_objects(void **state)
{
	(void)state;
	/* $mergeObjects (manual): later fields win in place, null/missing skipped */
	check(P("{'$mergeObjects': [{'a': 1, 'b': 1}, '$x', null, '$nope', {'a': 3, 'c': 4}]}"),
	      "[{'x': {'b': 2}}]", "[{'r': {'a': 3, 'b': 2, 'c': 4}}]");
	check(P("{'$mergeObjects': '$x'}"), "[{'x': {'q': 1}}, {}]", "[{'r': {'q': 1}}, {'r': {}}]");
	check_err(P("{'$mergeObjects': [{}, 5]}"), "[{}]", 40400,
		  "$mergeObjects requires object inputs, but input 5 is of type int");
	/* $objectToArray / $arrayToObject (manual) */
	check(P("{'$objectToArray': '$d'}"), "[{'d': {'item': 'foo', 'qty': 25}}, {'d': null}]",
	      "[{'r': [{'k': 'item', 'v': 'foo'}, {'k': 'qty', 'v': 25}]}, {'r': null}]");
	check_err(P("{'$objectToArray': [1]}"), "[{}]", 40390, NULL);
	check(P("{'$arrayToObject': '$d'}"),
	      "[{'d': [['item', 'abc123'], ['qty', 25], ['item', 'x']]},"
	      " {'d': [{'k': 'item', 'v': 'abc'}, {'v': 2, 'k': 'n'}]}, {'d': []}, {}]",
	      "[{'r': {'item': 'x', 'qty': 25}}, {'r': {'item': 'abc', 'n': 2}}, {'r': {}},"
	      " {'r': null}]");
	check_err(P("{'$arrayToObject': 1}"), "[{}]", 40386, NULL);
	check_err(P("{'$arrayToObject': [[1]]}"), "[{}]", 40398, NULL);
	check_err(P("{'$arrayToObject': [[['a', 1], {'k': 'b', 'v': 1}]]}"), "[{}]", 40396, NULL);
	check_err(P("{'$arrayToObject': [[['a', 1, 2]]]}"), "[{}]", 40397, NULL);
	check_err(P("{'$arrayToObject': [[[1, 1]]]}"), "[{}]", 40395, NULL);
	check_err(P("{'$arrayToObject': [[{'k': 'a', 'v': 1}, 1]]}"), "[{}]", 40391, NULL);
	check_err(P("{'$arrayToObject': [[{'k': 'a'}]]}"), "[{}]", 40392, NULL);
	check_err(P("{'$arrayToObject': [[{'k': 'a', 'x': 1}]]}"), "[{}]", 40393, NULL);
	check_err(P("{'$arrayToObject': [[{'k': 1, 'v': 1}]]}"), "[{}]", 40394, NULL);
	/* $getField (manual: dotted and dollared names) */
	check("[{'$project': {'_id': 0, 'a': {'$getField': 'price.usd'},"
	      " 'b': {'$getField': {'field': {'$literal': '$price'}, 'input': '$$ROOT'}},"
	      " 'c': {'$getField': {'field': 'x', 'input': '$sub'}},"
	      " 'd': {'$getField': {'field': 'x', 'input': '$nope'}},"
	      " 'e': {'$getField': {'field': 'x', 'input': null}},"
	      " 'f': {'$getField': {'field': 'x', 'input': 5}}}}]",
	      "[{'price.usd': 45, '$price': 7, 'sub': {'x': [1]}}]",
	      "[{'a': 45, 'b': 7, 'c': [1], 'e': null}]");
	check_err(P("{'$getField': {'field': 'a', 'input': {}, 'x': 1}}"), "[{}]", 3041701, NULL);
	check_err(P("{'$getField': {'input': {}}}"), "[{}]", 3041702, NULL);
	check_err(P("{'$getField': {'field': 'a'}}"), "[{}]", 3041703, NULL);
	check_err(P("{'$getField': '$a'}"), "[{}]", 5654600,
		  "'$a' is a field path reference which is not allowed in this context");
	check_err(P("{'$getField': {'$concat': ['a', 'b']}}"), "[{}]", 5654601, NULL);
	check_err(P("{'$getField': {'field': 1, 'input': {}}}"), "[{}]", 5654602,
		  "requires 'field' to evaluate to type String, but got int");
	/* $setField / $unsetField (manual) */
	check("[{'$project': {'_id': 0, 's': {'$setField': {'field': 'price.usd', 'input': '$$ROOT',"
	      " 'value': 50}}, 'r': {'$setField': {'field': 'a', 'input': '$$ROOT', 'value': '$$REMOVE'}},"
	      " 'u': {'$unsetField': {'field': {'$literal': '$x'}, 'input': {'$literal': {'$x': 1, 'y': 2}}}},"
	      " 'n': {'$setField': {'field': 'a', 'input': null, 'value': 1}}}}]",
	      "[{'a': 1, 'price.usd': 45}]",
	      "[{'s': {'a': 1, 'price.usd': 50}, 'r': {'price.usd': 45}, 'u': {'y': 2}, 'n': null}]");
	check_err(P("{'$setField': 1}"), "[{}]", 4161100, NULL);
	check_err(P("{'$setField': {'field': 'a', 'input': {}, 'value': 1, 'q': 1}}"), "[{}]",
		  4161101, NULL);
	check_err(P("{'$setField': {'input': {}, 'value': 1}}"), "[{}]", 4161102, NULL);
	check_err(P("{'$setField': {'field': 'a', 'input': {}}}"), "[{}]", 4161103, NULL);
	check_err(P("{'$setField': {'field': 'a', 'value': 1}}"), "[{}]", 4161109, NULL);
	check_err(P("{'$setField': {'field': 'a', 'input': 1, 'value': 1}}"), "[{}]", 4161105, NULL);
	check_err(P("{'$setField': {'field': {'$concat': ['a']}, 'input': {}, 'value': 1}}"), "[{}]",
		  4161106, NULL);
	check_err(P("{'$setField': {'field': 1, 'input': {}, 'value': 1}}"), "[{}]", 4161107, NULL);
	check_err(P("{'$setField': {'field': '$a', 'input': {}, 'value': 1}}"), "[{}]", 4161108, NULL);
	check_err(P("{'$unsetField': {'field': 'a', 'input': {}, 'value': 1}}"), "[{}]", 4161101, NULL);
}

/* bad input answers errors, never crashes: deep nesting, operators on every kind of value */
static void test_fuzz(void **state)
{
	static const char *const ops[] = {"$slice", "$reverseArray", "$range", "$indexOfArray",
					  "$first", "$last", "$allElementsTrue", "$anyElementTrue",
					  "$setUnion", "$setIntersection", "$setDifference",
					  "$setEquals", "$setIsSubset", "$mergeObjects",
					  "$objectToArray", "$arrayToObject", "$getField",
					  "$setField", "$unsetField", "$zip", "$let", "$map",
					  "$filter", "$reduce", "$sortArray", "$maxN", "$firstN"};
	static const char *const args[] = {"null", "1", "'a'", "[]", "{}", "[null]", "[1, 2]",
					   "['$a', '$b', '$c']", "[[1], [2], 3]", "{'input': null}",
					   "{'input': [1], 'in': '$$this', 'cond': 1, 'initialValue': 0}",
					   "[[['k', 1]], 1, 2]", "'$$REMOVE'", "{'input': [3, {}, 1], 'sortBy': -1}", "{'n': 1e300, 'input': [1]}",
					   "{'n': {'$numberDecimal': 'NaN'}, 'input': [1]}", "[{'k': 'a', 'v': 1}]"};
	(void)state;
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		for (size_t j = 0; j < sizeof args / sizeof args[0]; j++) {
			char pipe[512];
			int code;
			char err[512];
			char *got;

			snprintf(pipe, sizeof pipe, "[{'$project': {'r': {'%s': %s}}}]", ops[i], args[j]);
			got = run(pipe, "[{'a': [1, {'x': 2}], 'b': null, 'c': {'d': 1}}]", NULL, &code, err,
				  sizeof err);
			if (got == NULL) {
				assert_true(code != 0);
			}
			bson_free(got);
		}
	}
}

/* loops cannot build unbounded values: 146 past 100 MiB; a command `let` may use them */
static void test_bounds(void **state)
{
	bson_t *let = J("{'let': {'z': {'$zip': {'inputs': [[1], [2, 3]], 'useLongestLength': true,"
			" 'defaults': [0, 0]}}, 'm': {'$map': {'input': [1, 2], 'in': {'$add': ['$$this', 1]}}}}}");
	bson_t *want = J("{'z': [[1, 2], [0, 3]], 'm': [2, 3]}");
	bson_t out;
	bson_iter_t it;
	int code = 0;
	char err[256] = "";

	(void)state;
	check_err(P("{'$map': {'input': {'$range': [0, 3000]}, 'in': {'$range': [0, 100000]}}}"),
		  "[{}]", 146, "$map would use too much memory");
	check_err(P("{'$reduce': {'input': {'$range': [0, 40]}, 'initialValue': [1],"
		    " 'in': {'$concatArrays': ['$$value', '$$value']}}}"),
		  "[{}]", 146, "$reduce would use too much memory");
	/* grown in place, the accumulator is still counted: 100 MiB of 2 KiB strings */
	check_err("[{'$project': {'_id': 0, 'r': {'$reduce': {'input': {'$range': [0, 200000]},"
		  " 'initialValue': [], 'in': {'$concatArrays': ['$$value', ['$s']]}}}}}]",
		  "[{'s': '" S1K S1K "'}]", 146, "$reduce would use too much memory");
	assert_true(bson_iter_init_find(&it, let, "let"));
	assert_int_equal(sdb_let_parse(&it, NULL, "let", &out, &code, err, sizeof err), 0);
	assert_true(bson_equal(&out, want));
	bson_destroy(&out);
	bson_destroy(let);
	bson_destroy(want);
	/* an error in the middle of a loop frees what the loop built (ASan checks) */
	check_err(P("{'$map': {'input': [1, 0], 'in': {'$divide': [1, '$$this']}}}"), "[{}]", 16608, NULL);
	check_err(P("{'$filter': {'input': [1, 0], 'cond': {'$divide': [1, '$$this']}}}"), "[{}]", 16608, NULL);
	check_err(P("{'$reduce': {'input': [1, 0], 'initialValue': [], 'in': {'$divide': [1, '$$this']}}}"),
		  "[{}]", 16608, NULL);
	check_err(P("{'$let': {'vars': {'a': [1], 'b': {'$divide': [1, 0]}}, 'in': 1}}"), "[{}]", 16608, NULL);
	check_err(P("{'$let': {'vars': {'a': [1]}, 'in': {'$divide': [1, 0]}}}"), "[{}]", 16608, NULL);
	check_err(P("{'$zip': {'inputs': [[1], {'$divide': [1, 0]}]}}"), "[{}]", 16608, NULL);
	check_err(P("{'$setField': {'field': 'a', 'input': {}, 'value': {'$divide': [1, 0]}}}"), "[{}]",
		  16608, NULL);
	check_err(P("{'$sortArray': {'input': {'$divide': [1, 0]}, 'sortBy': 1}}"), "[{}]", 16608, NULL);
	/* a command let that reads the document through $getField's $$CURRENT is refused */
	let = J("{'let': {'g': {'$getField': 'a'}}}");
	assert_true(bson_iter_init_find(&it, let, "let"));
	assert_int_not_equal(sdb_let_parse(&it, NULL, "let", &out, &code, err, sizeof err), 0);
	assert_int_equal(code, 4890500);
	bson_destroy(&out);
	bson_destroy(let);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_variables),
		cmocka_unit_test(test_arrays),
		cmocka_unit_test(test_sets),
		cmocka_unit_test(test_sort_array),
		cmocka_unit_test(test_n_operators),
		cmocka_unit_test(test_objects),
		cmocka_unit_test(test_bounds),
		cmocka_unit_test(test_fuzz),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
