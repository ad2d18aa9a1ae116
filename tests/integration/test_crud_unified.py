"""MongoDB's unified-format CRUD spec tests against an embedded shard (issue #4).

One shard per spec file, started as the only member of a replica set (its hello reports
setName, so the runner sees the "replicaset" topology, as a driver would) and with
--enable-test-commands (the failPoint operations send configureFailPoint failCommand);
crud_unified.py plays the driver. Each file reports passed/failed/skipped (printed, visible
with -s or on failure) and fails when any test of the file fails. Skips carry their reason:
server version requirements a server advertising 6.0 does not meet (or the "sharded"/
"load-balanced" topology of a file that runs on nothing else; test_crud_report.py runs every
file through a proxy too), or a refusal listed in docs/compat.md (a feature stripedb refuses
clearly; never counted as a pass).
"""
import os

import pytest

import crud_unified
from conftest import start_one_member_set

DIR = crud_unified.compat_dir()
FILES = sorted(f for f in os.listdir(DIR) if f.endswith(".json")) if DIR else []


@pytest.mark.skipif(not DIR, reason="spec files not found: set STRIPEDB_COMPAT_DIR or put "
                    "them in ../shared/compat/mongodb-crud-unified")
@pytest.mark.parametrize("name", FILES)
def test_crud_unified_file(start_role, tmp_path, name):
    _, port = start_one_member_set(start_role, tmp_path / "shard",
                                   extra=["--enable-test-commands"])
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
    fname, results = crud_unified.run_file(uri, os.path.join(DIR, name))
    counts, text = crud_unified.summarize(fname, results)
    print(text)
    assert counts["passed"] + counts["failed"] + counts["skipped"] == len(results)
    failed = [(d, detail) for d, st, detail in results if st == "failed"]
    assert failed == [], text
    for d, st, detail in results:
        if st == "skipped":
            assert detail, f"skip without a reason: {d}"


def test_crud_unified_files_present():
    """Every file of the compatibility data set is run: as many as its README's table says."""
    if not DIR:
        pytest.skip("spec files not found")
    import re
    with open(os.path.join(os.path.dirname(DIR), "README.md")) as f:
        m = re.search(r"^\| mongodb-crud-unified/ \|.*\| (\d+) files \|$", f.read(), re.M)
    assert m, "shared/compat/README.md names no count for mongodb-crud-unified"
    assert len(FILES) == int(m.group(1))
