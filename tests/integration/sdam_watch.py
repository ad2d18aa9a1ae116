"""What a pymongo client did with the errors it got: SDAM and pool events of the
server it talks to (test_proxy_state_change.py, test_proxy_shard_wire_failover.py)."""
import threading
import weakref

from pymongo import monitoring, topology
from pymongo.server_type import SERVER_TYPE

# The SDAM spec's state-change codes (wire_state_change_code in src/wire/server.h).
STATE_CHANGE = {10107, 13435, 10058, 13436, 11602, 189, 11600, 91}


class SdamWatch(monitoring.ServerListener, monitoring.ConnectionPoolListener):
    """What the driver did to its view of the proxy: descriptions that became Unknown and
    pools it cleared."""

    def __init__(self):
        self.lock = threading.Lock()
        self.unknown = []
        self.cleared = []

    def opened(self, event):
        pass

    def closed(self, event):
        pass

    def description_changed(self, event):
        if (event.new_description.server_type == SERVER_TYPE.Unknown
                and event.previous_description.server_type !=
                SERVER_TYPE.Unknown):
            with self.lock:
                self.unknown.append(event.new_description.error)

    def pool_created(self, event):
        pass

    def pool_cleared(self, event):
        with self.lock:
            self.cleared.append(event.address)

    def pool_closed(self, event):
        pass

    def connection_created(self, event):
        pass

    def connection_ready(self, event):
        pass

    def connection_closed(self, event):
        pass

    def connection_check_out_started(self, event):
        pass

    def connection_check_out_failed(self, event):
        pass

    def connection_checked_out(self, event):
        pass

    def connection_checked_in(self, event):
        pass


def flush_events(client):
    """Deliver now the SDAM events client's topology has queued. pymongo 3.11 publishes a
    server description change through a queue that its events thread empties once a
    second (common.EVENTS_QUEUE_FREQUENCY): an Unknown marked by an operation's error is
    not in SdamWatch.unknown right after the error, and `unknown == []` checked then holds
    whatever the driver did. (Pool events are published at once.)"""
    q = client._topology._events
    if q is not None:
        topology.process_events_queue(weakref.ref(q))
