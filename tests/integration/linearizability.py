"""A linearizability checker for histories of compare-and-set registers (Knossos-style).

The algorithm is Wing & Gong's search for a linearization, with Lowe's memoisation of
(set of linearized operations, register state) ("Testing for linearizability", 2016):
walk the history's call/return events in time order; at a call, try to linearize that
operation now (if the model allows it) and restart from the front; at a return whose
operation was not linearized yet, backtrack. The history is linearizable when every
operation that returned has been linearized.

Operations whose outcome is unknown (timeouts, connection lost, leadership lost before
commit) have no return event: they may take effect at any point after their call, or
never. Registers are independent objects, so each key is checked on its own (locality,
Herlihy & Wing 1990).

Each operation is a dict:
    {"key": K, "call": t0, "ret": t1 or None, "kind": "read", "value": V}
    {"key": K, "call": t0, "ret": t1 or None, "kind": "cas", "expect": X, "new": Y,
     "outcome": "ok" | "fail" | "unknown", "current": C (for fail)}
A failed CAS reports the current value it saw, so it is also a read of C != X; one that
cannot say (a findAndModify matching nothing) has no "current" and only tells state != X.
    {"key": K, "call": t0, "ret": t1 or None, "kind": "write", "value": V,
     "outcome": "ok" | "unknown"}
A blind write sets the register whatever it held.
"""
import time


def step(state, op):
    """Apply op to the register model: (allowed, new_state)."""
    if op["kind"] == "read":
        return state == op["value"], state
    if op["kind"] == "write":
        return True, op["value"]
    if op["outcome"] == "fail":
        if "current" not in op:
            return state != op["expect"], state
        cur = op["current"]
        return state == cur and cur != op["expect"], state
    # ok or unknown: linearized as having taken effect (an unknown CAS that did not
    # take effect is the same as an operation never linearized)
    return state == op["expect"], op["new"]


class _Entry:
    __slots__ = ("op", "oid", "is_call", "match", "prev", "next")

    def __init__(self, op, oid, is_call):
        self.op, self.oid, self.is_call = op, oid, is_call
        self.match = self.prev = self.next = None


def check_register(ops, init, budget_s=60.0):
    """Check one register's history. Returns (ok, detail): ok True/False, or None
    when the time budget ran out (inconclusive)."""
    events = []
    for i, op in enumerate(ops):
        call = _Entry(op, i, True)
        events.append((op["call"], 0, call))
        if op["ret"] is not None:
            ret = _Entry(op, i, False)
            call.match = ret
            events.append((op["ret"], 1, ret))
    # calls before returns at equal times: more overlap, never a false alarm
    events.sort(key=lambda e: (e[0], e[1]))
    head = _Entry(None, -1, True)
    prev = head
    n_ret = 0
    for _, _, e in events:
        prev.next, e.prev = e, prev
        prev = e
        n_ret += 0 if e.is_call else 1

    def lift(e):
        e.prev.next = e.next
        if e.next:
            e.next.prev = e.prev
        m = e.match
        if m:
            m.prev.next = m.next
            if m.next:
                m.next.prev = m.prev

    def unlift(e):
        m = e.match
        if m:
            m.prev.next = m
            if m.next:
                m.next.prev = m
        e.prev.next = e
        if e.next:
            e.next.prev = e

    deadline = time.monotonic() + budget_s
    state, linearized = init, 0
    stack, cache = [], set()
    entry = head.next
    steps = 0
    while n_ret > 0:
        steps += 1
        if steps % 10000 == 0 and time.monotonic() > deadline:
            return None, f"inconclusive after {budget_s}s ({len(ops)} operations)"
        if entry is None:  # only unknown calls left after the last return: cannot happen
            break          # while a return remains, but stay safe
        if entry.is_call:
            allowed, new_state = step(state, entry.op)
            if allowed:
                key = (linearized | (1 << entry.oid), new_state)
                if key not in cache:
                    cache.add(key)
                    stack.append((entry, state))
                    state, linearized = new_state, key[0]
                    lift(entry)
                    if entry.match:
                        n_ret -= 1
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if not stack:
                return False, _describe(entry.op)
            e, state = stack.pop()
            linearized &= ~(1 << e.oid)
            unlift(e)
            if e.match:
                n_ret += 1
            entry = e.next
    return True, f"{len(ops)} operations linearizable"


def _describe(op):
    return "no linearization explains " + repr({k: v for k, v in op.items()})


def check(history, inits, budget_s=60.0):
    """Check every register of a history (list of op dicts with a "key"). inits maps a
    key to its initial value. Returns (ok, {key: detail})."""
    by_key = {}
    for op in history:
        by_key.setdefault(op["key"], []).append(op)
    result, details = True, {}
    for key, ops in by_key.items():
        ok, detail = check_register(ops, inits[key], budget_s)
        details[key] = detail
        if ok is False:
            result = False
        elif ok is None and result is True:
            result = None
    return result, details
