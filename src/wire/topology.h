/* Topology changes for the SDAM streaming protocol (hello's topologyVersion).
 *
 * Spec: https://github.com/mongodb/specifications/blob/master/source/server-discovery-and-monitoring/server-monitoring.md
 * ("Streaming protocol", "topologyVersion"). Drivers hold an awaitable hello open on each
 * server; mongod answers it early when its topology view changes (election, step-down,
 * reconfig). A role whose hello hook reports state that can change (the metadata role:
 * isWritablePrimary, primary, hosts, electionId) calls this when that state changes so
 * drivers learn it at once instead of after maxAwaitTimeMS (10 s by default).
 *
 * Kept out of server.h until the lead folds it in; same module, same rules.
 */
#ifndef SDB_WIRE_TOPOLOGY_H
#define SDB_WIRE_TOPOLOGY_H

#include "wire/server.h"

/* Increment topologyVersion.counter and answer every held awaitable hello now, each reply
 * built afresh (the hello hook runs again). Loop thread only. */
void wire_server_topology_changed(wire_server *srv);

#endif
