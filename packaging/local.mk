# packaging: Debian, RPM and systemd files (issue #11). Nothing here is built or installed
# by `make install`: the Debian rules and the RPM spec install the unit, the default
# config file and the sysusers.d file themselves. packaging/build-deb.sh and
# packaging/build-rpm.sh build the packages from `make dist`'s tarball.
EXTRA_DIST += packaging/README.md packaging/stripedb.conf packaging/systemd/stripedb@.service \
	packaging/cluster.conf.example \
	packaging/sysusers.d/stripedb.conf packaging/build-deb.sh packaging/build-rpm.sh packaging/dist.sh \
	packaging/rpm/stripedb.spec packaging/debian/changelog packaging/debian/control \
	packaging/debian/copyright packaging/debian/rules packaging/debian/source/format \
	packaging/debian/stripedb.install packaging/debian/stripedb.dirs packaging/debian/stripedb.docs \
	packaging/debian/stripedb.postinst \
	tests/packaging/check-files.sh tests/packaging/test-deb.sh \
	tests/packaging/test-rpm.sh tests/integration/test_packaging.py

# Fast checks of the docs and the default config against the binary's option table, the
# ctl subcommands, `man --warnings`, the versions and `systemd-analyze verify` of the unit.
TESTS += tests/packaging/check-files.sh
