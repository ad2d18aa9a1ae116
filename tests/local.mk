# tests: the integration suite (pytest) runs from `make check` through a driver script;
# unit tests are added by each module's local.mk; fuzz targets by tests/fuzz/local.mk.
TESTS += tests/check-layers.sh tests/check-errors-doc.sh tests/integration/run.sh
EXTRA_DIST += tests/check-layers.sh tests/check-errors-doc.sh tests/integration/run.sh tests/integration/conftest.py tests/integration/pytest.ini \
	tests/fresh/test-fresh-root.sh
AM_TESTS_ENVIRONMENT = STRIPEDB_BIN=$(abs_top_builddir)/stripedb; export STRIPEDB_BIN; \
	STRIPEDB_SRCDIR=$(abs_top_srcdir); export STRIPEDB_SRCDIR;
