#!/bin/bash
# Fast consistency checks of the packaged files against the binary (run by `make check`):
#   - every option of `stripedb --help` is documented in stripedb(1) and stripedb.conf(5)
#     and listed (commented out) in packaging/stripedb.conf; every role and every command
#     of the usage lines (ctl, dev, ...) in stripedb(1);
#     every subcommand of `stripedb ctl --help` in stripedb-ctl(1);
#   - packaging/stripedb.conf is accepted by the real parser as shipped and with every key
#     uncommented (exit 2 "no role given" and nothing else);
#   - `man --warnings` renders each page without a warning;
#   - `systemd-analyze verify` accepts packaging/systemd/stripedb@.service (as an
#     instance, with ExecStart pointed at the built binary and the man pages on MANPATH);
#   - the version in the man pages, debian/changelog and the RPM spec is the binary's;
#   - every dependency of configure.ac is in the Build-Depends and the BuildRequires.
# Env: STRIPEDB_BIN (default ./stripedb), STRIPEDB_SRCDIR (default: this script's ../..).
# Exit 0 when every check passed, 1 otherwise (each failure is one line on stdout), 77
# (skipped) when the binary is missing.
set -u
src=${STRIPEDB_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${STRIPEDB_BIN:-./stripedb}
if [ ! -x "$bin" ]; then
	echo "SKIP: no stripedb binary at $bin (set STRIPEDB_BIN)"
	exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sdb-check-files.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
checks=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { checks=$((checks + 1)); }

man1="$src/man/stripedb.1"
ctl1="$src/man/stripedb-ctl.1"
conf5="$src/man/stripedb.conf.5"
conf="$src/packaging/stripedb.conf"
unit="$src/packaging/systemd/stripedb@.service"

# roff escapes every dash: data-dir is written data\-dir.
esc() { printf '%s' "$1" | sed 's/-/\\\\-/g'; }

# --- options ---
opts=$("$bin" --help | sed -n 's/^  --\([a-z0-9-]*\)=.*/\1/p')
[ -n "$opts" ] || fail "no option found in '$bin --help'"
for o in $opts; do
	e=$(esc "$o")
	grep -q -- "^\.BI \\\\-\\\\-$e= " "$man1" && ok || fail "stripedb.1: option --$o not documented"
	[ "$o" = config ] && continue
	grep -q -- "^\.B $e\$" "$conf5" && ok || fail "stripedb.conf.5: key $o not documented"
	grep -q -- "^# $o = " "$conf" && ok || fail "packaging/stripedb.conf: key $o not listed ('# $o = ...')"
done
# keys of the shipped config file that the binary does not know
for k in $(sed -n 's/^# \([a-z][a-z0-9-]*\) = .*/\1/p' "$conf" | sort -u); do
	[ "$k" = role ] && continue
	printf '%s\n' $opts | grep -qx -- "$k" && ok || fail "packaging/stripedb.conf: unknown key $k"
done

# --- roles ---
roles=$("$bin" --help | sed -n 's/^roles: \([a-z, ]*\)\..*/\1/p' | tr -d ,)
[ -n "$roles" ] || fail "no role list in '$bin --help'"
for r in $roles; do
	grep -q -- "^\.B $r\$" "$man1" && ok || fail "stripedb.1: role $r not documented under ROLES"
	grep -q -- "^\[$r\]\$" "$conf" && ok || fail "packaging/stripedb.conf: no [$r] section"
done

# --- top-level commands (`stripedb ctl|dev|... `) of the usage lines ---
cmds=$("$bin" --help | sed -n '1,/^$/s/^\(usage:\)\? *stripedb \([a-z][a-z-]*\)\( .*\)\?$/\2/p')
[ -n "$cmds" ] || fail "no command found in the usage lines of '$bin --help'"
for c in $cmds; do
	grep -q -- "^\.B $(esc "$c")\$" "$man1" && ok || fail "stripedb.1: command '$c' not documented under COMMANDS"
done

# --- ctl subcommands ---
subs=$("$bin" ctl --help | sed -n '/^subcommands:/,/^$/s/^  \([a-z][a-z-]*\) .*/\1/p')
[ -n "$subs" ] || fail "no subcommand in '$bin ctl --help'"
for s in $subs; do
	grep -q -E -- "^\.B[IR]? \"?$(esc "$s")( |\"|\$)" "$ctl1" && ok || fail "stripedb-ctl.1: subcommand $s not documented"
done

# --- build dependencies: every SDB_DEP([VAR], [MODULE >= V], [DEBIAN-PACKAGE]) of
# configure.ac is a Build-Depends of debian/control and a BuildRequires of the spec ---
deps=$(sed -n 's/^SDB_DEP(\[[A-Z0-9_]*\], *\[\([^] ]*\)[^]]*\], *\[\([^]]*\)\]).*/\1 \2/p' "$src/configure.ac")
[ -n "$deps" ] || fail "no SDB_DEP found in configure.ac"
while read -r mod debpkg; do
	[ -n "$mod" ] || continue
	grep -q -E "^(Build-Depends:)? +$debpkg( |,|\$)" "$src/packaging/debian/control" && ok ||
		fail "packaging/debian/control: Build-Depends lacks $debpkg (configure.ac needs $mod)"
	grep -q -F "BuildRequires:  pkgconfig($mod)" "$src/packaging/rpm/stripedb.spec" && ok ||
		fail "packaging/rpm/stripedb.spec: no 'BuildRequires:  pkgconfig($mod)'"
done <<<"$deps"

# --- the shipped config file through the real parser ---
check_conf() { # FILE WHAT
	local out rc
	out=$(STRIPEDB_CONFIG=/nonexistent "$bin" --config="$1" 2>&1 </dev/null)
	rc=$?
	# libmongoc maps /dev/shm/mongoc-PID before main() (src/main.c re-executes without
	# it); when a killed process of another program left that name for a pid this run
	# reuses, the library warns on stderr before stripedb runs: not the parser's output
	out=$(printf '%s\n' "$out" | grep -v 'mongoc: Falling back to malloc for counters\.$')
	if [ "$rc" = 2 ] && [ "$out" = "stripedb: no role given: use --role=metadata|proxy|coordinator|ratelimit|shard" ]; then
		ok
	else
		fail "$2: parser said (exit $rc): $out"
	fi
}
check_conf "$conf" "packaging/stripedb.conf as shipped"
sed -E 's/^# ([a-z][a-z0-9-]*) = /\1 = /' "$conf" | grep -v '^role = ' >"$tmp/uncommented.conf"
n=$(grep -c -E '^[a-z][a-z0-9-]* = ' "$tmp/uncommented.conf")
[ "$n" -ge 20 ] && ok || fail "packaging/stripedb.conf: only $n keys found when uncommented"
check_conf "$tmp/uncommented.conf" "packaging/stripedb.conf with every key uncommented"

# --- man pages render without warnings ---
if command -v man >/dev/null 2>&1; then
	for p in "$man1" "$ctl1" "$conf5"; do
		w=$(MANWIDTH=80 man --warnings -l "$p" 2>&1 >/dev/null)
		[ -z "$w" ] && ok || fail "man --warnings $(basename "$p"): $w"
	done
else
	echo "note: man not installed, rendering not checked"
fi

# --- versions ---
ver=$("$bin" --version | sed -n 's/^stripedb //p')
for p in "$man1" "$ctl1" "$conf5"; do
	grep -q "^\.TH .* \"stripedb $ver\" " "$p" && ok || fail "$(basename "$p"): .TH does not name stripedb $ver"
done
head -n1 "$src/packaging/debian/changelog" | grep -q "^stripedb ($ver) " && ok ||
	fail "packaging/debian/changelog: top entry is not version $ver"
grep -q "^Version: *$ver\$" "$src/packaging/rpm/stripedb.spec" && ok ||
	fail "packaging/rpm/stripedb.spec: Version is not $ver"

# --- systemd unit ---
if command -v systemd-analyze >/dev/null 2>&1; then
	mkdir -p "$tmp/unit" "$tmp/man/man1" "$tmp/man/man5"
	cp "$man1" "$ctl1" "$tmp/man/man1/" && cp "$conf5" "$tmp/man/man5/"
	absbin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
	sed "s#^ExecStart=/usr/bin/stripedb #ExecStart=$absbin #" "$unit" >"$tmp/unit/stripedb@shard.service"
	grep -q "^ExecStart=$absbin --role=%i --config=/etc/stripedb/stripedb.conf\$" "$tmp/unit/stripedb@shard.service" && ok ||
		fail "stripedb@.service: unexpected ExecStart"
	# Documentation=man:... is checked against our pages when man is installed.
	manopt=--man=yes
	command -v man >/dev/null 2>&1 || manopt=--man=no
	w=$(cd "$tmp/unit" && MANPATH="$tmp/man" systemd-analyze verify "$manopt" ./stripedb@shard.service 2>&1)
	[ $? = 0 ] && [ -z "$w" ] && ok || fail "systemd-analyze verify stripedb@.service: $w"
else
	echo "note: systemd-analyze not installed, the unit is not verified"
fi

echo "check-files: $checks checks passed, $fails failed"
[ "$fails" = 0 ]
