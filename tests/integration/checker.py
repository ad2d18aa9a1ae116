"""History checker for the migration tests (issue #8).

Input: the operations a client workload recorded (migration_helpers.Workload.history:
(kind, writer, _id, value, start, end, outcome, result)) and the final documents on the
owning shards ({_id: doc}). Every _id is written by one writer, one operation at a time, so
the writes of an _id form a sequence; each write has a unique value.

The model of an _id is the set of states it may be in (None = absent, else the value of
field v). An acknowledged operation must be consistent with at least one state:
    insert ok       -> the _id was absent          (else: a lost delete or a duplicate)
    insert dup      -> the _id was present
    update ok n     -> n == 1 iff present          (n == 0 when present: a lost write)
    delete ok n     -> n == 1 iff present
and moves the state; an operation whose outcome is unknown (network error) may or may not
have been applied (in its place in the sequence). A read [t0, t1] must return a state of the
sequence after some prefix that contains every write acknowledged before t0 and no write
that started after t1 (linearizable per _id: in particular a read after a traffic switch
sees every write acknowledged before it). The final document of each _id must be one of the
states at the end (nothing lost, nothing duplicated, nothing resurrected), and no document
may exist that no write could have produced.

    verdict = check(history, final_docs)
    assert verdict["ok"], verdict["violations"][:10]
"""


def _step(states, op, val, outcome, result):
    """Apply one write to a set of states; returns (new states, violation or None)."""
    def apply(s):
        if op == "insert":
            return val if s is None else s
        if op == "update":
            return val if s is not None else None
        return None  # delete

    if outcome == "unknown":
        return states | {apply(s) for s in states}, None
    if outcome == "fail":
        if op == "insert" and result == "dup":
            ok = {s for s in states if s is not None}
            return (ok, None) if ok else (states, "duplicate-key error but the _id was absent")
        return states, None  # a definite error: not applied
    # acknowledged
    if op == "insert":
        ok = {s for s in states if s is None}
        if not ok:
            return {val}, "acknowledged insert but the _id already existed (lost delete?)"
        return {val}, None
    present = {s for s in states if s is not None}
    absent = {s for s in states if s is None}
    want_present = result == 1
    if want_present and not present:
        return {apply(s) for s in states}, f"{op} matched 1 but the _id was absent"
    if not want_present and not absent:
        return {apply(s) for s in states}, f"{op} matched 0 but the _id existed (lost write)"
    keep = present if want_present else absent
    return {apply(s) for s in keep}, None


def check(history, final_docs):
    by_id = {}
    reads = []
    for e in history:
        if e[0] == "read":
            reads.append(e)
        else:
            by_id.setdefault(e[2], []).append(e)
    violations = []
    stats = {"writes": 0, "acked": 0, "unknown": 0, "reads": len(reads), "ids": 0}
    prefix_states = {}  # _id -> [states after 0, 1, ... ops]
    for _id, ops in by_id.items():
        ops.sort(key=lambda e: e[4])  # one writer: start order = program order
        states = {None}
        seq = [states]
        for kind, w, _, val, t0, t1, outcome, result in ops:
            stats["writes"] += 1
            stats["acked"] += outcome == "ok"
            stats["unknown"] += outcome == "unknown"
            states, v = _step(states, kind, val, outcome, result)
            if v:
                violations.append({"_id": _id, "op": kind, "value": val, "at": t0, "why": v})
            seq.append(states)
        prefix_states[_id] = (ops, seq)
        final = final_docs.get(_id)
        got = None if final is None else final.get("v")
        if got not in states:
            violations.append({"_id": _id, "why": f"final value {got!r} not in the model "
                               f"{sorted(states, key=repr)!r}"})
    stats["ids"] = len(by_id)
    for _id in final_docs:
        if _id not in by_id:
            violations.append({"_id": _id, "why": "document no write produced"})
    for kind, _, _id, val, t0, t1, outcome, result in reads:
        if outcome != "ok":
            continue
        ops, seq = prefix_states.get(_id, ([], [{None}]))
        # prefixes from the last write acknowledged before the read to the last write
        # started before it ended
        lo = max((i + 1 for i, e in enumerate(ops) if e[5] < t0 and e[6] != "fail"),
                 default=0)
        hi = max((i + 1 for i, e in enumerate(ops) if e[4] < t1), default=0)
        allowed = set()
        for k in range(lo, hi + 1):
            allowed |= seq[k]
        if val not in allowed:
            violations.append({"_id": _id, "op": "read", "at": t0, "why":
                               f"read {val!r}, allowed {sorted(allowed, key=repr)!r}"})
    return {"ok": not violations, "violations": violations, "stats": stats}
