# tests: the integration suite (pytest) runs from `make check` through a driver script;
# unit tests are added by each module's local.mk; fuzz targets by tests/fuzz/local.mk.
TESTS += tests/check-layers.sh tests/check-errors-doc.sh tests/check-lint.sh tests/check-format.sh tests/integration/run.sh
EXTRA_DIST += tests/check-layers.sh tests/check-errors-doc.sh tests/check-lint.sh tests/check-format.sh .clang-tidy .clang-format tests/integration/run.sh tests/integration/conftest.py tests/integration/pytest.ini \
	tests/fresh/test-fresh-root.sh
AM_TESTS_ENVIRONMENT = STRIPEDB_BIN=$(abs_top_builddir)/stripedb; export STRIPEDB_BIN; \
	STRIPEDB_SRCDIR=$(abs_top_srcdir); export STRIPEDB_SRCDIR; \
	STRIPEDB_LINT_CFLAGS='$(DEFS) $(DEFAULT_INCLUDES) $(INCLUDES) $(AM_CPPFLAGS) $(CPPFLAGS) $(AM_CFLAGS)'; \
	export STRIPEDB_LINT_CFLAGS;

# Every integration test file goes into the tarball: listing them one by one in the local.mk
# files had left 28 of them out (a tarball's `make check` could not run the whole suite).
dist-hook: dist-integration-tests
dist-integration-tests:
	$(MKDIR_P) $(distdir)/tests/integration
	cp -p $(srcdir)/tests/integration/*.py $(srcdir)/tests/integration/*.js \
		$(distdir)/tests/integration/
.PHONY: dist-integration-tests
