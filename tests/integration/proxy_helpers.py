"""A whole stripedb cluster on loopback for the proxy tests: one metadata member, N
embedded shards and M proxies, each a real `stripedb` process on free ports.

    cl = ProxyCluster(start_role, tmp_path, shards=3, proxies=2)
    cl.shard_collection("db.c", {"k": 1}, split_points=[{"k": 100}], shards=[...])
    cl.proxy_client(0).db.c.insert_one(...)
    cl.shard_client(1).db.c.find()          # look at one shard directly
"""
import pymongo

from conftest import assert_clean_exit, free_port, http_get, wait_until
from metadata_cluster import Cluster


def install_filtering(cl, ns, key):
    """Give each shard of cl (a ProxyCluster) the filtering metadata of ns that a
    deployment's coordinator installs (src/coordinator/filtering.h): the chunks metadata
    routes to it, with the collection version (the largest token). ProxyCluster shards
    through the metadata member and starts no coordinator, so without this its shards have
    none and the proxies fall back to per-chunk requests (src/proxy/shardver.c). Returns
    the chunks."""
    chunks = cl.routing(ns)["chunks"]
    cver = max(ch["token"] for ch in chunks)
    for sid in cl.shard_ids:
        mine = [{"id": str(ch["id"]), "min": ch["min"], "max": ch["max"], "token": ch["token"]}
                for ch in chunks if ch["shard"] == sid]
        r = cl.shard_client(sid).admin.command({"stripedbSetFiltering": ns, "key": key,
                                                "chunks": mine, "collectionVersion": cver})
        if r["nChunks"] != len(mine):
            raise AssertionError(f"{sid} installed {r['nChunks']} chunks of {len(mine)}")
    return chunks


def shard_cmd_count(cl, sid, cmd):
    """stripedb_shard_commands_total{cmd} of shard sid (cl: a ProxyCluster or MigCluster)."""
    st, body = http_get(cl.shard_procs[sid].http_port, "/metrics")
    assert st == 200
    for line in body.decode().splitlines():
        if line.startswith("stripedb_shard_commands_total{") and f'cmd="{cmd}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class ProxyCluster:
    def __init__(self, start_role, tmp_path, shards=3, proxies=2, proxy_args=(),
                 meta_members=1, shard_args=()):
        self.start_role = start_role
        self.meta = Cluster(start_role, tmp_path, meta_members,
                            election_ms=300 if meta_members == 1 else 500)
        self.meta.leader()
        self.metadata_addr = self.meta.seeds()
        self.shard_ids = []
        self.shard_ports = {}
        self.shard_procs = {}
        for i in range(shards):
            sid = f"shard-{chr(ord('a') + i)}"
            port = free_port()
            d = tmp_path / sid
            d.mkdir()
            self.shard_procs[sid] = start_role(
                ["--role=shard", f"--listen=127.0.0.1:{port}", f"--data-dir={d}"]
                + list(shard_args))
            self.shard_ids.append(sid)
            self.shard_ports[sid] = port
            self.meta_cmd({"addShard": sid, "uri": f"mongodb://127.0.0.1:{port}/"})
        self.proxy_ports = []
        self.proxy_procs = []
        for _ in range(proxies):
            self.add_proxy(proxy_args)
        self._clients = []

    def add_proxy(self, extra=(), wait=True):
        port = free_port()
        p = self.start_role(["--role=proxy", f"--listen=127.0.0.1:{port}",
                             f"--metadata={self.metadata_addr}"] + list(extra), wait=wait)
        self.proxy_ports.append(port)
        self.proxy_procs.append(p)
        return port

    def meta_cmd(self, cmd):
        return self.meta.write(cmd)

    def meta_query(self, cmd):
        return self.meta.members[0].cmd(cmd)

    def _client(self, port, **kw):
        opts = dict(directConnection=True, serverSelectionTimeoutMS=10000,
                    connectTimeoutMS=5000, socketTimeoutMS=60000, retryWrites=False)
        opts.update(kw)
        c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/", **opts)
        self._clients.append(c)
        return c

    def proxy_client(self, i=0, **kw):
        return self._client(self.proxy_ports[i], **kw)

    def proxies_client(self, **kw):
        """One client given every proxy (mongos load balancing)."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.proxy_ports)
        opts = dict(serverSelectionTimeoutMS=10000, retryWrites=False)
        opts.update(kw)
        c = pymongo.MongoClient(f"mongodb://{hosts}/", **opts)
        self._clients.append(c)
        return c

    def shard_client(self, sid):
        return self._client(self.shard_ports[sid])

    def create_database(self, name, tenant=None):
        cmd = {"createDatabase": name}
        if tenant:
            cmd["tenant"] = tenant
        return self.meta.write(cmd, ok_codes=(48, 11000))  # already there is fine

    def shard_collection(self, ns, key, split_points=None, num_chunks=None, shards=None):
        self.create_database(ns.split(".", 1)[0])
        cmd = {"shardCollection": ns, "key": key}
        if split_points is not None:
            cmd["splitPoints"] = split_points
        if num_chunks is not None:
            cmd["numChunks"] = num_chunks
        cmd["shards"] = list(shards or self.shard_ids)
        r = self.meta_cmd(cmd)
        self.wait_routing(r.get("routingVersion", 0))
        return r

    def routing(self, ns):
        return self.meta_query({"getRoutingTable": ns})

    def wait_routing(self, version):
        """Proxies long-poll metadata; nothing to wait for beyond metadata having it."""
        wait_until(lambda: self.routing_version() >= version, 10, what="routing version")

    def routing_version(self):
        return self.meta_query({"metadataStatus": 1})["routingVersion"]

    def metric(self, i, name):
        """Sum of the samples of metric `name` on proxy i (Prometheus text)."""
        st, body = http_get(self.proxy_procs[i].http_port, "/metrics")
        assert st == 200
        total = 0.0
        for line in body.decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop_proxy_clean(self, i=0):
        """Close the clients, stop proxy i gracefully and assert it exits 0 with no
        sanitizer report (LeakSanitizer runs at exit: conftest.assert_clean_exit)."""
        for c in self._clients:
            c.close()
        assert_clean_exit(self.proxy_procs[i])

    def close(self):
        """Close clients and stop the proxies first (while shards and metadata still
        answer, so they stop at once)."""
        for c in self._clients:
            c.close()
        for p in self.proxy_procs:
            p.stop()
