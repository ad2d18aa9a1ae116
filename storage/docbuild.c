/* Mutable document trees (see docbuild.h). */
#include "storage/docbuild.h"

#include <string.h>

#include "common/alloc.h"

static docbuild_node *node_new(bson_type_t type, const char *key)
{
	docbuild_node *n = sdb_calloc(1, sizeof *n);

	n->type = type;
	n->key = key != NULL ? sdb_strdup(key) : NULL;
	return n;
}

docbuild_node *docbuild_new_doc(const char *key)
{
	return node_new(BSON_TYPE_DOCUMENT, key);
}

docbuild_node *docbuild_new_array(const char *key)
{
	return node_new(BSON_TYPE_ARRAY, key);
}

docbuild_node *docbuild_new_null(const char *key)
{
	docbuild_node *n = node_new(BSON_TYPE_NULL, key);

	n->value.value_type = BSON_TYPE_NULL;
	return n;
}

static void fill_container(docbuild_node *c, const uint8_t *data, uint32_t len)
{
	bson_t b;
	bson_iter_t it;
	bool is_doc = c->type == BSON_TYPE_DOCUMENT;

	if (!bson_init_static(&b, data, len) || !bson_iter_init(&it, &b)) {
		return;
	}
	while (bson_iter_next(&it)) {
		docbuild_push(c, docbuild_from_iter(&it, is_doc));
	}
}

docbuild_node *docbuild_from_value(const bson_value_t *v, const char *key)
{
	docbuild_node *n;

	if (v->value_type == BSON_TYPE_DOCUMENT || v->value_type == BSON_TYPE_ARRAY) {
		n = node_new(v->value_type, key);
		fill_container(n, v->value.v_doc.data, v->value.v_doc.data_len);
		return n;
	}
	n = node_new(v->value_type, key);
	bson_value_copy(v, &n->value);
	return n;
}

docbuild_node *docbuild_from_iter(const bson_iter_t *iter, bool with_key)
{
	const char *key = with_key ? bson_iter_key(iter) : NULL;
	docbuild_node *n;

	if (BSON_ITER_HOLDS_DOCUMENT(iter) || BSON_ITER_HOLDS_ARRAY(iter)) {
		const uint8_t *data;
		uint32_t len;

		n = node_new(bson_iter_type(iter), key);
		if (BSON_ITER_HOLDS_DOCUMENT(iter)) {
			bson_iter_document(iter, &len, &data);
		} else {
			bson_iter_array(iter, &len, &data);
		}
		fill_container(n, data, len);
		return n;
	}
	n = node_new(bson_iter_type(iter), key);
	bson_value_copy(bson_iter_value((bson_iter_t *)iter), &n->value);
	return n;
}

docbuild_node *docbuild_from_bson(const bson_t *doc)
{
	docbuild_node *n = node_new(BSON_TYPE_DOCUMENT, NULL);

	fill_container(n, bson_get_data(doc), doc->len);
	return n;
}

docbuild_node *docbuild_clone(const docbuild_node *n)
{
	docbuild_node *c = node_new(n->type, n->key);

	if (n->type == BSON_TYPE_DOCUMENT || n->type == BSON_TYPE_ARRAY) {
		for (size_t i = 0; i < n->n; i++) {
			docbuild_push(c, docbuild_clone(n->kids[i]));
		}
	} else {
		bson_value_copy(&n->value, &c->value);
	}
	return c;
}

void docbuild_free(docbuild_node *n)
{
	if (n == NULL) {
		return;
	}
	if (n->type == BSON_TYPE_DOCUMENT || n->type == BSON_TYPE_ARRAY) {
		for (size_t i = 0; i < n->n; i++) {
			docbuild_free(n->kids[i]);
		}
		free(n->kids);
	} else {
		bson_value_destroy(&n->value);
	}
	free(n->key);
	free(n);
}

void docbuild_set_key(docbuild_node *n, const char *key)
{
	char *k = key != NULL ? sdb_strdup(key) : NULL;

	free(n->key);
	n->key = k;
}

static void append_children(bson_t *dst, const docbuild_node *c)
{
	char buf[16];
	const char *key;

	for (size_t i = 0; i < c->n; i++) {
		if (c->type == BSON_TYPE_ARRAY) {
			bson_uint32_to_string((uint32_t)i, &key, buf, sizeof buf);
			docbuild_append(dst, key, -1, c->kids[i]);
		} else {
			docbuild_append(dst, c->kids[i]->key, -1, c->kids[i]);
		}
	}
}

void docbuild_append(bson_t *dst, const char *key, int keylen, const docbuild_node *n)
{
	bson_t child;

	if (n->type == BSON_TYPE_DOCUMENT) {
		bson_append_document_begin(dst, key, keylen, &child);
		append_children(&child, n);
		bson_append_document_end(dst, &child);
	} else if (n->type == BSON_TYPE_ARRAY) {
		bson_append_array_begin(dst, key, keylen, &child);
		append_children(&child, n);
		bson_append_array_end(dst, &child);
	} else {
		bson_append_value(dst, key, keylen, &n->value);
	}
}

size_t docbuild_depth(const docbuild_node *n, size_t limit)
{
	typedef struct {
		const docbuild_node *n;
		size_t next; /* next child to visit */
	} frame;
	frame *st;
	size_t top = 0, cap = 16, best = 0;

	if (n->type != BSON_TYPE_DOCUMENT && n->type != BSON_TYPE_ARRAY)
		return 0;
	st = sdb_malloc(cap * sizeof *st);
	st[top++] = (frame){n, 0};
	best = 1;
	while (top > 0) {
		frame *f = &st[top - 1];

		if (f->next == f->n->n) {
			top--;
			continue;
		}
		const docbuild_node *k = f->n->kids[f->next++];

		if (k->type != BSON_TYPE_DOCUMENT && k->type != BSON_TYPE_ARRAY)
			continue;
		if (top + 1 > best)
			best = top + 1;
		if (best > limit)
			break;
		if (top == cap) {
			cap *= 2;
			st = sdb_realloc(st, cap * sizeof *st);
		}
		st[top++] = (frame){k, 0};
	}
	free(st);
	return best > limit ? limit + 1 : best;
}

void docbuild_to_bson(const docbuild_node *n, bson_t *out)
{
	bson_init(out);
	append_children(out, n);
}

void docbuild_value(const docbuild_node *n, bson_t *scratch, bson_value_t *v)
{
	bson_init(scratch);
	if (n->type == BSON_TYPE_DOCUMENT || n->type == BSON_TYPE_ARRAY) {
		append_children(scratch, n);
		memset(v, 0, sizeof *v);
		v->value_type = n->type;
		v->value.v_doc.data = (uint8_t *)bson_get_data(scratch);
		v->value.v_doc.data_len = scratch->len;
		return;
	}
	*v = n->value;
}

docbuild_node *docbuild_field(const docbuild_node *doc, const char *name, size_t len, size_t *idx)
{
	for (size_t i = 0; i < doc->n; i++) {
		const char *k = doc->kids[i]->key;

		if (k != NULL && strlen(k) == len && memcmp(k, name, len) == 0) {
			if (idx != NULL) {
				*idx = i;
			}
			return doc->kids[i];
		}
	}
	return NULL;
}

static void reserve(docbuild_node *c, size_t want)
{
	if (want <= c->cap) {
		return;
	}
	size_t cap = c->cap < 4 ? 4 : c->cap;

	while (cap < want) {
		cap *= 2;
	}
	c->kids = sdb_realloc(c->kids, cap * sizeof *c->kids);
	c->cap = cap;
}

void docbuild_push(docbuild_node *c, docbuild_node *child)
{
	docbuild_insert(c, c->n, child);
}

void docbuild_insert(docbuild_node *c, size_t i, docbuild_node *child)
{
	reserve(c, c->n + 1);
	if (i > c->n) {
		i = c->n;
	}
	memmove(&c->kids[i + 1], &c->kids[i], (c->n - i) * sizeof *c->kids);
	c->kids[i] = child;
	c->n++;
}

docbuild_node *docbuild_take(docbuild_node *c, size_t i)
{
	docbuild_node *k = c->kids[i];

	memmove(&c->kids[i], &c->kids[i + 1], (c->n - i - 1) * sizeof *c->kids);
	c->n--;
	return k;
}

void docbuild_replace(docbuild_node *c, size_t i, docbuild_node *child)
{
	docbuild_node *old = c->kids[i];

	docbuild_set_key(child, old->key);
	docbuild_free(old);
	c->kids[i] = child;
}

bool docbuild_parse_index(const char *s, size_t len, size_t *out)
{
	size_t v = 0;

	if (len == 0 || len > 9 || (len > 1 && s[0] == '0')) {
		return false;
	}
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9') {
			return false;
		}
		v = v * 10 + (size_t)(s[i] - '0');
	}
	*out = v;
	return true;
}

void docbuild_blob_set(docbuild_blob *b, const bson_t *doc)
{
	uint8_t *d = sdb_malloc(doc->len);

	memcpy(d, bson_get_data(doc), doc->len);
	free(b->data);
	b->data = d;
	b->len = doc->len;
}

void docbuild_blob_view(const docbuild_blob *b, bson_t *view)
{
	static const uint8_t empty[5] = {5, 0, 0, 0, 0};

	if (b->data == NULL || !bson_init_static(view, b->data, b->len)) {
		bson_init_static(view, empty, sizeof empty);
	}
}

void docbuild_blob_free(docbuild_blob *b)
{
	free(b->data);
	b->data = NULL;
	b->len = 0;
}
