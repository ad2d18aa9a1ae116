# man: manual pages (stripedb(1), stripedb-ctl(1), stripedb.conf(5)), installed by
# `make install` into $(mandir)/man1 and man5 and shipped in the tarball.
dist_man_MANS += man/stripedb.1 man/stripedb-ctl.1 man/stripedb.conf.5
