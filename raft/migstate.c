/* The migration state table (see migstate.h). */
#include <string.h>

#include "raft/migstate.h"

static const char *const names[MIG__COUNT] = {
	[MIG_REGISTERED] = "registered",	[MIG_IMPORTING] = "importing",
	[MIG_REPLICATING] = "replicating",	[MIG_VERIFYING] = "verifying",
	[MIG_SWITCHING] = "switching",		[MIG_SWITCHED] = "switched",
	[MIG_CLEANING] = "cleaning",		[MIG_COMPLETE] = "complete",
	[MIG_ABORTED] = "aborted",		[MIG_ROLLING_BACK] = "rolling_back",
	[MIG_ROLLED_BACK] = "rolled_back",
};

#define B(s) (1u << (s))
static const unsigned allowed[MIG__COUNT] = {
	[MIG_REGISTERED] = B(MIG_IMPORTING) | B(MIG_ABORTED),
	[MIG_IMPORTING] = B(MIG_REPLICATING) | B(MIG_ABORTED),
	[MIG_REPLICATING] = B(MIG_VERIFYING) | B(MIG_ABORTED),
	[MIG_VERIFYING] = B(MIG_SWITCHING) | B(MIG_REPLICATING) | B(MIG_ABORTED),
	[MIG_SWITCHING] = B(MIG_SWITCHED) | B(MIG_REPLICATING) | B(MIG_ABORTED),
	[MIG_SWITCHED] = B(MIG_CLEANING) | B(MIG_ROLLING_BACK),
	[MIG_CLEANING] = B(MIG_COMPLETE),
	[MIG_COMPLETE] = 0,
	[MIG_ABORTED] = 0,
	[MIG_ROLLING_BACK] = B(MIG_ROLLED_BACK) | B(MIG_SWITCHED),
	[MIG_ROLLED_BACK] = 0,
};
#undef B

const char *migrate_state_name(mig_state s)
{
	return s >= 0 && s < MIG__COUNT ? names[s] : "unknown";
}

mig_state migrate_state_parse(const char *name)
{
	for (int i = 0; name && i < MIG__COUNT; i++)
		if (strcmp(names[i], name) == 0)
			return (mig_state)i;
	return MIG_UNKNOWN;
}

bool migrate_transition_ok(mig_state from, mig_state to)
{
	if (from < 0 || from >= MIG__COUNT || to < 0 || to >= MIG__COUNT)
		return false;
	return (allowed[from] >> to) & 1u;
}

bool migrate_state_terminal(mig_state s)
{
	return s == MIG_COMPLETE || s == MIG_ABORTED || s == MIG_ROLLED_BACK;
}

bool migrate_state_active(mig_state s)
{
	return s != MIG_REGISTERED && s >= 0 && s < MIG__COUNT && !migrate_state_terminal(s);
}
