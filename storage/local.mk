# storage: sources and unit tests of this folder (included by the top Makefile.am)

# --- update engine and aggregation pipeline (owner: sb) ---
noinst_HEADERS += storage/decimal.h storage/update.h storage/update_int.h storage/pipeline.h storage/pipeline_int.h storage/pipeline_ext.h storage/docbuild.h
libstripedb_a_SOURCES += storage/decimal.c storage/update.c storage/update_apply.c storage/update_pipeline.c storage/docbuild.c storage/pipeline.c storage/pipeline_expr.c storage/pipeline_arith.c \
	storage/pipeline_expr_ext.c storage/pipeline_expr_str.c storage/pipeline_expr_conv.c \
	storage/pipeline_expr_date.c \
	storage/pipeline_parse.c storage/pipeline_bucket.c storage/pipeline_bucketauto.c \
	storage/pipeline_facet.c storage/pipeline_lookup.c storage/pipeline_graph.c \
	storage/pipeline_sample.c storage/pipeline_redact.c \
	storage/pipeline_expr_var.c storage/pipeline_expr_array.c storage/pipeline_expr_obj.c

check_PROGRAMS += tests/unit/test_storage_update
tests_unit_test_storage_update_SOURCES = tests/unit/test_storage_update.c
tests_unit_test_storage_update_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_update_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_update
check_PROGRAMS += tests/unit/test_storage_pipeline
tests_unit_test_storage_pipeline_SOURCES = tests/unit/test_storage_pipeline.c tests/unit/pipeline_check.h
tests_unit_test_storage_pipeline_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_pipeline_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_pipeline
check_PROGRAMS += tests/unit/test_storage_pipeline_lookup
tests_unit_test_storage_pipeline_lookup_SOURCES = tests/unit/test_storage_pipeline_lookup.c tests/unit/pipeline_check.h
tests_unit_test_storage_pipeline_lookup_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_pipeline_lookup_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_pipeline_lookup
check_PROGRAMS += tests/unit/test_storage_pipeline_exparr
tests_unit_test_storage_pipeline_exparr_SOURCES = tests/unit/test_storage_pipeline_exparr.c tests/unit/pipeline_check.h
tests_unit_test_storage_pipeline_exparr_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_pipeline_exparr_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_pipeline_exparr
check_PROGRAMS += tests/unit/test_storage_pipeline_expr_ext
tests_unit_test_storage_pipeline_expr_ext_SOURCES = tests/unit/test_storage_pipeline_expr_ext.c tests/unit/pipeline_check.h
tests_unit_test_storage_pipeline_expr_ext_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_pipeline_expr_ext_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_pipeline_expr_ext
check_PROGRAMS += tests/unit/test_storage_decimal
tests_unit_test_storage_decimal_SOURCES = tests/unit/test_storage_decimal.c
tests_unit_test_storage_decimal_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_decimal_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_decimal
# benchmark (never in make check): see tests/bench/README.md "Decimal128 $sum"
EXTRA_DIST += tests/bench/decimal_sum_bench.py tests/integration/test_storage_page_size.py
# --- end sb ---

# --- query core: keyenc path matcher projection sortspec (owner: sa); the comparison order
# itself is src/common/bsonval.c (shared with raft/), tested by test_storage_bsonval ---
noinst_HEADERS += storage/keyenc.h storage/path.h storage/matcher.h storage/collation.h \
	storage/matcher_int.h storage/projection.h storage/sortspec.h storage/validator.h \
	storage/validator_int.h
libstripedb_a_SOURCES += storage/keyenc.c storage/path.c storage/matcher.c storage/matcher_bits.c storage/collation.c \
	storage/projection.c storage/sortspec.c storage/bounds.c storage/validator.c \
	storage/validator_schema.c

check_PROGRAMS += tests/unit/test_storage_bsonval
tests_unit_test_storage_bsonval_SOURCES = tests/unit/test_storage_bsonval.c
tests_unit_test_storage_bsonval_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_bsonval_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_bsonval
check_PROGRAMS += tests/unit/test_storage_collation
tests_unit_test_storage_collation_SOURCES = tests/unit/test_storage_collation.c
tests_unit_test_storage_collation_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_collation_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_collation
check_PROGRAMS += tests/unit/test_storage_keyenc
tests_unit_test_storage_keyenc_SOURCES = tests/unit/test_storage_keyenc.c
tests_unit_test_storage_keyenc_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_keyenc_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_keyenc
check_PROGRAMS += tests/unit/test_storage_validator
tests_unit_test_storage_validator_SOURCES = tests/unit/test_storage_validator.c
tests_unit_test_storage_validator_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_validator_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_validator
check_PROGRAMS += tests/unit/test_storage_matcher
tests_unit_test_storage_matcher_SOURCES = tests/unit/test_storage_matcher.c
tests_unit_test_storage_matcher_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_matcher_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_matcher
check_PROGRAMS += tests/unit/test_storage_projection
tests_unit_test_storage_projection_SOURCES = tests/unit/test_storage_projection.c
tests_unit_test_storage_projection_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_projection_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_projection
# --- end sa ---

# --- store, planner and their tests (owner: sc, issue #4) ---
noinst_HEADERS += storage/store.h storage/query.h storage/store_int.h storage/docdiff.h
libstripedb_a_SOURCES += storage/docdiff.c storage/store.c storage/checkpoint.c storage/store_rekey.c storage/catalog.c storage/keys.c storage/scan.c storage/copy.c storage/oplog.c storage/index.c storage/partial.c storage/check.c storage/query.c storage/session.c storage/filtering.c
check_PROGRAMS += tests/unit/test_storage_store
tests_unit_test_storage_store_SOURCES = tests/unit/test_storage_store.c tests/unit/store_fixture.h
tests_unit_test_storage_store_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_store_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_store
check_PROGRAMS += tests/unit/test_storage_index
tests_unit_test_storage_index_SOURCES = tests/unit/test_storage_index.c tests/unit/store_fixture.h
tests_unit_test_storage_index_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_index_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_index
check_PROGRAMS += tests/unit/test_storage_checkpoint
tests_unit_test_storage_checkpoint_SOURCES = tests/unit/test_storage_checkpoint.c tests/unit/store_fixture.h
tests_unit_test_storage_checkpoint_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_checkpoint_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_checkpoint
check_PROGRAMS += tests/unit/test_storage_partial
tests_unit_test_storage_partial_SOURCES = tests/unit/test_storage_partial.c
tests_unit_test_storage_partial_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_partial_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_partial
check_PROGRAMS += tests/unit/test_storage_docdiff
tests_unit_test_storage_docdiff_SOURCES = tests/unit/test_storage_docdiff.c
tests_unit_test_storage_docdiff_CFLAGS = $(UNIT_CFLAGS)
tests_unit_test_storage_docdiff_LDADD = $(UNIT_LDADD)
TESTS += tests/unit/test_storage_docdiff
# --- end sc ---
