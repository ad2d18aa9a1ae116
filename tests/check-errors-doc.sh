#!/bin/sh
# Every header function that returns an int status gets an `Errors:` list (CONVENTIONS.md:
# "every header function has a short contract comment ... and an `Errors:` list").
#
# The rule, kept simple so that it is predictable:
#   - a declaration is a line of a .h under src/, storage/, raft/ or cli/ that starts with
#     `int name(` (column 0; `static inline int` helpers and other return types are not
#     checked);
#   - its comment is the nearest /* ... */ block above it (a comment that starts a line),
#     skipping the lines of other declarations (so one comment may cover a group of
#     declarations), but not a blank line, a preprocessor line or a line starting with
#     `}`: those end the search; a comment at the end of the declaration's own line also
#     counts;
#   - that comment must contain `Errors:` (the codes it returns and when) or `Returns:`
#     (for an int that is a count, a boolean-like value, an exit code or a MongoDB code,
#     not a status).
# A header that breaks the rule fails the check, naming file, line and function.
# Run by `make check`; by hand: tests/check-errors-doc.sh [SRCDIR]
srcdir=${1:-${STRIPEDB_SRCDIR:-$(dirname "$0")/..}}
bad=0
for f in $(find "$srcdir/src" "$srcdir/storage" "$srcdir/raft" "$srcdir/cli" -name '*.h' | sort); do
	rel=${f#"$srcdir"/}
	out=$(awk -v file="$rel" '
		incomment {
			if (block) text = text "\n" $0
			if (index($0, "*/")) { incomment = 0; if (block) have = 1 }
			next
		}
		/^[ \t]*$/ || /^#/ || /^}/ { have = 0; text = ""; next }
		/^int [A-Za-z_][A-Za-z_0-9]*\(/ {
			own = index($0, "/*") ? substr($0, index($0, "/*")) : ""
			if (!(have && text ~ /Errors:|Returns:/) && own !~ /Errors:|Returns:/) {
				name = $0
				sub(/^int /, "", name)
				sub(/\(.*/, "", name)
				printf "%s:%d: %s: no Errors: (or Returns:) in the comment above it\n", file, NR, name
			}
		}
		/^[ \t]*\/\*/ { # a comment block of its own
			block = 1
			text = $0
			if (index($0, "*/")) have = 1; else incomment = 1
			next
		}
		index($0, "/*") && !index(substr($0, index($0, "/*")), "*/") {
			block = 0 # a trailing comment that goes on: skip its lines
			incomment = 1
		}
	' "$f")
	if [ -n "$out" ]; then
		printf '%s\n' "$out" >&2
		bad=1
	fi
done
exit $bad
