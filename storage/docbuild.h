/* Mutable document trees for editing BSON documents (used by the update engine and the
 * aggregation pipeline). libbson documents are immutable byte strings; an edit such as
 * "set a.b.2 keeping a's position" is done by loading the document into a tree of nodes,
 * editing the tree, and serialising it back with docbuild_to_bson().
 *
 * A node is a document, an array, or a scalar (any other BSON type, with its own deep copy
 * of the value). A document node keeps its fields in order; every child of a document has
 * a key. Array children have no key: their index is their position.
 * Ownership: a node owns its children; docbuild_free frees a whole subtree. Nothing here
 * fails except by aborting on out-of-memory (common/alloc.h).
 */
#ifndef SDB_STORAGE_DOCBUILD_H
#define SDB_STORAGE_DOCBUILD_H

#include <bson/bson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct docbuild_node docbuild_node;
struct docbuild_node {
	bson_type_t type;     /* BSON_TYPE_DOCUMENT or BSON_TYPE_ARRAY for containers */
	char *key;            /* field name in the parent document; NULL otherwise */
	bson_value_t value;   /* scalars only: an owned deep copy */
	docbuild_node **kids; /* containers only: n children in order */
	size_t n;
	size_t cap;
};

/* Load a whole document (a DOCUMENT node). */
docbuild_node *docbuild_from_bson(const bson_t *doc);
/* Load any value (documents and arrays recursively). key may be NULL. */
docbuild_node *docbuild_from_value(const bson_value_t *v, const char *key);
/* Load the value at iter (key: the iter's key when with_key). */
docbuild_node *docbuild_from_iter(const bson_iter_t *iter, bool with_key);
docbuild_node *docbuild_new_doc(const char *key);
docbuild_node *docbuild_new_array(const char *key);
/* A BSON null scalar. */
docbuild_node *docbuild_new_null(const char *key);
docbuild_node *docbuild_clone(const docbuild_node *n);
void docbuild_free(docbuild_node *n);
/* Replace n's key (copied; NULL removes it). */
void docbuild_set_key(docbuild_node *n, const char *key);

/* The nesting depth of n: 0 for a scalar, 1 for a document or array of scalars, 1 + the
 * deepest child otherwise; counted without recursion (an explicit stack on the heap) and
 * stopped as soon as it passes limit (then limit + 1 is returned), so a tree of any depth
 * can be measured before a recursive walk (serialisation, comparison) meets it. */
size_t docbuild_depth(const docbuild_node *n, size_t limit);
/* Serialise a DOCUMENT (or ARRAY, with keys "0", "1"...) node; out uninitialised. */
void docbuild_to_bson(const docbuild_node *n, bson_t *out);
/* Append n's value to dst under key (keylen -1 for NUL-terminated). */
void docbuild_append(bson_t *dst, const char *key, int keylen, const docbuild_node *n);
/* A value view of n: scalars point into n; containers are serialised into *scratch
 * (uninitialised; always bson_destroy it), and *v points into it. v is valid while n
 * and scratch live. */
void docbuild_value(const docbuild_node *n, bson_t *scratch, bson_value_t *v);

/* The child of document node doc named name (len bytes), or NULL; *idx gets its
 * position when idx is non-NULL. */
docbuild_node *docbuild_field(const docbuild_node *doc, const char *name, size_t len,
			      size_t *idx);
/* Append child at the end of a container (takes ownership). */
void docbuild_push(docbuild_node *c, docbuild_node *child);
/* Insert child at position i (0..n) of a container (takes ownership). */
void docbuild_insert(docbuild_node *c, size_t i, docbuild_node *child);
/* Detach and return the child at position i (caller owns it). */
docbuild_node *docbuild_take(docbuild_node *c, size_t i);
/* Replace the child at position i by child (the old one is freed; child gets its key). */
void docbuild_replace(docbuild_node *c, size_t i, docbuild_node *child);

/* An owned copy of a BSON document's bytes, for heap structures: libbson declares bson_t
 * with 128-byte alignment, which malloc does not give, so a bson_t must not live inside a
 * heap-allocated struct (UBSan reports every access). Keep a blob there and look at it
 * through a stack bson_t. A zeroed blob is empty (views as {}). */
typedef struct docbuild_blob {
	uint8_t *data;
	uint32_t len;
} docbuild_blob;

/* Copy doc's bytes into b (b's previous contents are freed). */
void docbuild_blob_set(docbuild_blob *b, const bson_t *doc);
/* Point the uninitialised stack bson_t *view at b's bytes (no copy; never destroy it). */
void docbuild_blob_view(const docbuild_blob *b, bson_t *view);
void docbuild_blob_free(docbuild_blob *b);

/* Parse s[0..len) as an array index the way MongoDB does for update paths: only decimal
 * digits, no sign, and no leading zero unless the index is "0". Returns false otherwise. */
bool docbuild_parse_index(const char *s, size_t len, size_t *out);

#endif
