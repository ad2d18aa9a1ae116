/* MongoDB error code names (codeName in error replies).
 * Source: src/mongo/base/error_codes.yml of the MongoDB server (6.0), for the codes in
 * server.h and msg.h and the other common ones drivers look at. */
#include <stdio.h>
#include <stddef.h>

#include "wire/msg.h"
#include "wire/server.h"

static const struct {
	int code;
	const char *name;
} code_names[] = {
	{0, "OK"},
	{1, "InternalError"},
	{2, "BadValue"},
	{4, "NoSuchKey"},
	{5, "GraphContainsCycle"},
	{6, "HostUnreachable"},
	{7, "HostNotFound"},
	{8, "UnknownError"},
	{9, "FailedToParse"},
	{10, "CannotMutateObject"},
	{11, "UserNotFound"},
	{12, "UnsupportedFormat"},
	{13, "Unauthorized"},
	{14, "TypeMismatch"},
	{15, "Overflow"},
	{16, "InvalidLength"},
	{17, "ProtocolError"},
	{18, "AuthenticationFailed"},
	{20, "IllegalOperation"},
	{22, "InvalidBSON"},
	{23, "AlreadyInitialized"},
	{24, "LockTimeout"},
	{26, "NamespaceNotFound"},
	{27, "IndexNotFound"},
	{28, "PathNotViable"},
	{31, "RoleNotFound"},
	{37, "CannotCreateIndex"},
	{40, "ConflictingUpdateOperators"},
	{43, "CursorNotFound"},
	{46, "LockBusy"},
	{48, "NamespaceExists"},
	{50, "MaxTimeMSExpired"},
	{52, "DollarPrefixedFieldName"},
	{53, "InvalidIdField"},
	{54, "NotSingleValueField"},
	{59, "CommandNotFound"},
	{61, "ShardKeyNotFound"},
	{66, "ImmutableField"},
	{67, "CannotCreateIndex"},
	{68, "IndexAlreadyExists"},
	{70, "ShardNotFound"},
	{64, "WriteConcernFailed"},
	{72, "InvalidOptions"},
	{73, "InvalidNamespace"},
	{79, "UnknownReplWriteConcern"},
	{85, "IndexOptionsConflict"},
	{86, "IndexKeySpecsConflict"},
	{89, "NetworkTimeout"},
	{91, "ShutdownInProgress"},
	{93, "InvalidReplicaSetConfig"},
	{96, "OperationFailed"},
	{100, "UnsatisfiableWriteConcern"},
	{112, "WriteConflict"},
	{115, "CommandNotSupported"},
	{117, "ConflictingOperationInProgress"},
	{121, "DocumentValidationFailure"},
	{118, "NamespaceNotSharded"},
	{125, "CommandFailed"},
	{133, "FailedToSatisfyReadPreference"},
	{159, "DurationOverflow"},
	{166, "CommandNotSupportedOnView"},
	{169, "CommandOnShardedViewNotSupportedOnMongod"},
	{189, "PrimarySteppedDown"},
	{197, "InvalidIndexSpecificationOption"},
	{202, "NetworkInterfaceExceededTimeLimit"},
	{204, "TimeProofMismatch"},
	{205, "ClusterTimeFailsRateLimiter"},
	{211, "KeyNotFound"},
	{217, "IncompleteTransactionHistory"},
	{224, "QueryFeatureNotAllowed"},
	{225, "TransactionTooOld"},
	{238, "NotImplemented"},
	{251, "NoSuchTransaction"},
	{256, "TransactionCommitted"},
	{260, "InvalidResumeToken"},
	{262, "ExceededTimeLimit"},
	{263, "OperationNotSupportedInTransaction"},
	{279, "ClientDisconnect"},
	{280, "ChangeStreamFatalError"},
	{286, "ChangeStreamHistoryLost"},
	{361, "CollectionUUIDMismatch"},
	{462, "IngressRequestRateLimitExceeded"},
	{10058, "LegacyNotPrimary"},
	{10107, "NotWritablePrimary"},
	{10334, "BSONObjectTooLarge"},
	{11000, "DuplicateKey"},
	{11600, "InterruptedAtShutdown"},
	{11601, "Interrupted"},
	{11602, "InterruptedDueToReplStateChange"},
	{13297, "DatabaseDifferCase"},
	{13388, "StaleConfig"},
	{13435, "NotPrimaryNoSecondaryOk"},
	{13436, "NotPrimaryOrSecondary"},
	{40352, "Location40352"},
	{40413, "IDLDuplicateField"},
	{40414, "IDLFailedToParse"},
	{40415, "IDLUnknownField"},
};

const char *wire_code_name(int code)
{
	/* mongod names a code without an ErrorCodes entry (an assertion id such as 31254 or
	 * 15975) "Location<code>" (ErrorCodes::errorString); one buffer per thread */
	static _Thread_local char location[24];
	for (size_t i = 0; i < sizeof code_names / sizeof code_names[0]; i++)
		if (code_names[i].code == code)
			return code_names[i].name;
	if (code <= 0)
		return "UnknownError";
	snprintf(location, sizeof location, "Location%d", code);
	return location;
}

bool wire_state_change_code(int64_t code)
{
	switch (code) {
	case 10107: /* NotWritablePrimary */
	case 13435: /* NotPrimaryNoSecondaryOk */
	case 10058: /* LegacyNotPrimary */
	case 13436: /* NotPrimaryOrSecondary */
	case 11602: /* InterruptedDueToReplStateChange */
	case 189:   /* PrimarySteppedDown */
	case 11600: /* InterruptedAtShutdown */
	case 91:    /* ShutdownInProgress */
		return true;
	default:
		return false;
	}
}

bool wire_not_executed_code(int64_t code)
{
	switch (code) {
	case 10107: /* NotWritablePrimary */
	case 13435: /* NotPrimaryNoSecondaryOk */
	case 10058: /* LegacyNotPrimary */
	case 13436: /* NotPrimaryOrSecondary */
	case 91:    /* ShutdownInProgress */
		return true;
	default:
		return false;
	}
}
