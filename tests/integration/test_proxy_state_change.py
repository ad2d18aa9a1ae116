"""A shard's state-change error is not the proxy's (src/proxy/retry.c,
px_answer_mask_state_change). When a shard answers NotWritablePrimary, InterruptedDue-
ToReplStateChange, PrimarySteppedDown or a shutdown code, top-level or in a
writeConcernError, and the proxy has to pass the failure on, a driver that saw that code
would take it as news about the server that answered, the proxy (SDAM "Error handling":
mark it Unknown, clear its pool, wait for its monitor), and its monitor's awaitable hello
answers only after maxAwaitTimeMS (10 s): one shard's election stalled every client of the
proxy. The proxy answers HostUnreachable (6) instead, the shard's code name in errmsg,
without the shard's topologyVersion.

The shard's failCommand fail point makes the answers; pymongo's own SDAM and pool events
show what the driver did with them (no timing is measured)."""
import pymongo
import pytest

from proxy_helpers import ProxyCluster
from sdam_watch import STATE_CHANGE, SdamWatch, flush_events

@pytest.fixture
def cluster(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=1, proxies=1,
                      shard_args=["--enable-test-commands"])
    yield cl
    cl.close()


def _watched_client(cl, **kw):
    w = SdamWatch()
    opts = dict(directConnection=True, retryWrites=False, socketTimeoutMS=20000,
                event_listeners=[w])
    opts.update(kw)
    c = pymongo.MongoClient(f"mongodb://127.0.0.1:{cl.proxy_ports[0]}/", **opts)
    return c, w


def _fail(cl, data, times=1):
    sh = cl.shard_client(cl.shard_ids[0])
    sh.admin.command({"configureFailPoint": "failCommand", "mode": {"times": times},
                      "data": data})
    return sh


def _masked(details, code):
    assert details.get("code") == 6, details
    assert details.get("codeName") == "HostUnreachable", details
    assert f"({code}) from a shard" in details.get("errmsg", ""), details
    assert "topologyVersion" not in details, details


@pytest.mark.parametrize("code", [11602, 11600, 189])
def test_a_write_interrupted_by_a_shard_step_down_leaves_the_proxy_known(cluster, code):
    """A non-retryable update the shard answers with code (it may have run: the proxy
    must pass the failure on, not resend it): the client gets HostUnreachable, its view
    of the proxy stays a known mongos with its pool, and the next command just runs."""
    c, w = _watched_client(cluster)
    coll = c.sdb.t
    coll.insert_one({"_id": 1, "v": 0})
    coll.update_one({"_id": 1}, {"$inc": {"v": 1}})  # the proxy has learned the primary
    _fail(cluster, {"failCommands": ["update"], "errorCode": code})
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
    _masked(e.value.details, code)
    flush_events(c)
    assert w.unknown == [] and w.cleared == [], (w.unknown, w.cleared)
    # the fail point answered without running it: one increment, not two
    assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 1}
    c.close()


def test_a_write_concern_error_of_a_step_down_leaves_the_proxy_known(cluster):
    """The write ran on the shard but its majority is unknown: the writeConcernError's
    state-change code is masked the same way (drivers read it as a state change too)."""
    c, w = _watched_client(cluster)
    coll = c.sdb.t
    coll.insert_one({"_id": 1})
    _fail(cluster, {"failCommands": ["insert"],
                    "writeConcernError": {"code": 11602, "errmsg": "stepped down"}})
    with pytest.raises(pymongo.errors.WriteConcernError) as e:
        coll.insert_one({"_id": 2})
    wce = e.value.details
    assert wce.get("code") == 6, wce
    assert "InterruptedDueToReplStateChange (11602) from a shard: stepped down" in \
        wce.get("errmsg", ""), wce
    flush_events(c)
    assert w.unknown == [] and w.cleared == [], (w.unknown, w.cleared)
    assert coll.count_documents({}) == 2  # it ran
    c.close()


def test_a_cursor_whose_shard_stepped_down_leaves_the_proxy_known(cluster):
    """A getMore pinned to the member that was primary is not resent elsewhere
    (retry.c); its failure reaches the client, masked."""
    c, w = _watched_client(cluster)
    coll = c.sdb.t
    coll.insert_many([{"_id": i} for i in range(50)])
    cur = coll.find({}, batch_size=5)
    assert next(cur)["_id"] == 0
    _fail(cluster, {"failCommands": ["getMore"], "errorCode": 11602})
    with pytest.raises(pymongo.errors.OperationFailure) as e:
        list(cur)
    _masked(e.value.details, 11602)
    flush_events(c)
    assert w.unknown == [] and w.cleared == [], (w.unknown, w.cleared)
    assert coll.count_documents({}) == 50
    c.close()


def test_a_retryable_write_keeps_its_label(cluster):
    """A retryable write whose every resend the shard interrupts until the proxy's
    budget is spent: the answer keeps the shard's RetryableWriteError label (the shard
    recognises a resend of the same txnNumber), so the driver retries it, once, on the
    same proxy; its code is masked. The fail point fires on every attempt here, so the
    driver's retry fails as well."""
    c, w = _watched_client(cluster, retryWrites=True)
    coll = c.sdb.t
    coll.insert_one({"_id": 1, "v": 0})
    sh = _fail(cluster, {"failCommands": ["update"], "errorCode": 11602}, times=10000)
    try:
        with pytest.raises(pymongo.errors.OperationFailure) as e:
            coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
        _masked(e.value.details, 11602)
        assert "RetryableWriteError" in e.value.details.get("errorLabels", [])
        flush_events(c)
        assert w.unknown == [] and w.cleared == [], (w.unknown, w.cleared)
    finally:
        sh.admin.command({"configureFailPoint": "failCommand", "mode": "off"})
    assert coll.find_one({"_id": 1}) == {"_id": 1, "v": 0}
    c.close()


def test_no_state_change_code_reaches_the_client(cluster):
    """Every state-change code, once, on a non-retryable update: a refusal (nothing ran:
    wire_not_executed_code) is resent by the proxy and the update applies once; an
    interruption (it may have run) is passed on, masked. No code reaches the client as
    such, and the driver's view of the proxy never changes."""
    c, w = _watched_client(cluster)
    coll = c.sdb.t
    coll.insert_one({"_id": 1, "v": 0})
    coll.update_one({"_id": 1}, {"$inc": {"v": 1}})  # the proxy has learned the primary
    refusals = {10107, 13435, 10058, 13436, 91}
    applied = 1
    for code in sorted(STATE_CHANGE):
        _fail(cluster, {"failCommands": ["update"], "errorCode": code})
        if code in refusals:
            coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
            applied += 1
        else:
            with pytest.raises(pymongo.errors.OperationFailure) as e:
                coll.update_one({"_id": 1}, {"$inc": {"v": 1}})
            _masked(e.value.details, code)
    flush_events(c)
    assert w.unknown == [] and w.cleared == [], (w.unknown, w.cleared)
    # the fail point answers without running the update: each applied exactly once
    assert coll.find_one({"_id": 1}) == {"_id": 1, "v": applied}
    c.close()


@pytest.fixture
def two_shards(start_role, tmp_path):
    cl = ProxyCluster(start_role, tmp_path, shards=2, proxies=1,
                      shard_args=["--enable-test-commands"])
    cl.shard_collection("sdb.t", {"k": 1}, split_points=[{"k": 100}], shards=cl.shard_ids)
    yield cl
    cl.close()


@pytest.mark.parametrize("op", ["update_many", "delete_many"])
def test_a_multi_shard_write_error_of_a_step_down_leaves_the_proxy_known(two_shards, op):
    """A write sent to two shards, one of which answers 11602 (it may have run: not
    resent): the proxy reports it as its statements' writeErrors, and pymongo 3.11 reads
    a state-change code there too (topology._handle_error's OperationFailure branch: the
    proxy marked Unknown and its pool cleared). The entry's code is masked as well."""
    c, w = _watched_client(two_shards)
    coll = c.sdb.t
    coll.insert_many([{"_id": i, "k": i * 20, "v": 0} for i in range(10)])
    sh = two_shards.shard_client(two_shards.shard_ids[1])
    sh.admin.command({"configureFailPoint": "failCommand", "mode": {"times": 1},
                      "data": {"failCommands": [op.split("_")[0]], "errorCode": 11602}})
    with pytest.raises(pymongo.errors.WriteError) as e:
        if op == "update_many":
            coll.update_many({}, {"$inc": {"v": 1}})
        else:
            coll.delete_many({"v": 5})
    d = e.value.details
    assert d.get("code") == 6 and "(11602) from a shard" in d.get("errmsg", ""), d
    flush_events(c)
    assert w.unknown == [] and w.cleared == [], (w.unknown, w.cleared)
    c.close()
