# man: manual pages (stripedb(1), stripedb-ctl(1), stripedb.conf(5))
