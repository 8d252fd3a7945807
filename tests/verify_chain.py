#!/usr/bin/env python3
"""An independent verifier of rewind's event chain, written from
docs/CHAIN.md alone. Usage: verify_chain.py LEDGER_DB [ANCHOR_FILE]
Prints {"ok": bool, "entries": n, "first_bad": {"seq": n, "code": "..."}}
and exits 0 (intact) or 1 (tampered)."""

import hashlib
import json
import sqlite3
import struct
import sys


def decode(data):
    """Return (seq, prev, kind, fields) or None if not canonical."""
    try:
        if data[:4] != b"RWC1":
            return None
        seq, = struct.unpack(">Q", data[4:12])
        prev = data[12:44]
        if len(prev) != 32:
            return None
        pos = 52  # skip time (8 bytes)
        klen, = struct.unpack(">H", data[pos:pos + 2]); pos += 2
        kind = data[pos:pos + klen]
        if len(kind) != klen or klen == 0 or any(c not in b"abcdefghijklmnopqrstuvwxyz-" for c in kind):
            return None
        pos += klen
        n, = struct.unpack(">I", data[pos:pos + 4]); pos += 4
        fields, last = {}, None
        for _ in range(n):
            nlen, = struct.unpack(">H", data[pos:pos + 2]); pos += 2
            name = data[pos:pos + nlen]
            if len(name) != nlen:
                return None
            name.decode("utf-8")
            pos += nlen
            if last is not None and name <= last:
                return None
            last = name
            vlen, = struct.unpack(">I", data[pos:pos + 4]); pos += 4
            value = data[pos:pos + vlen]
            if len(value) != vlen:
                return None
            pos += vlen
            fields[name] = value
        if pos != len(data):
            return None
        return seq, prev, kind, fields
    except (struct.error, UnicodeDecodeError):
        return None


def verify(db, anchor=None):
    con = sqlite3.connect(db)
    workspace = con.execute("SELECT value FROM meta WHERE key = 'workspace_id'").fetchone()[0].encode()
    expected, prev, hashes = 1, bytes(32), {}

    def bad(seq, code):
        return {"ok": False, "entries": expected - 1, "first_bad": {"seq": seq, "code": code}}

    for seq, data, stored in con.execute("SELECT seq, data, hash FROM chain ORDER BY seq"):
        if seq != expected:
            return bad(expected, "SEQ_GAP")
        entry = decode(bytes(data))
        if entry is None:
            return bad(expected, "DECODE_ERROR")
        h = hashlib.sha256(b"\x00" + bytes(data)).digest()
        if bytes(stored) != h:
            return bad(expected, "HASH_MISMATCH")
        e_seq, e_prev, kind, fields = entry
        if e_seq != expected:
            return bad(expected, "OUT_OF_ORDER")
        if e_prev != prev:
            return bad(expected, "BROKEN_LINK")
        if expected == 1 and (kind != b"genesis" or fields.get(b"workspace") != workspace):
            return bad(1, "GENESIS_MISMATCH")
        if anchor and anchor["seq"] == expected:
            hashes[expected] = h.hex()
        prev, expected = h, expected + 1
    entries = expected - 1
    if anchor:
        if anchor["seq"] > entries:
            return bad(entries + 1, "TRUNCATED_BELOW_ANCHOR")
        if hashes.get(anchor["seq"]) != anchor["head"]:
            return bad(anchor["seq"], "ANCHOR_MISMATCH")
    return {"ok": True, "entries": entries}


if __name__ == "__main__":
    anchor = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None
    result = verify(sys.argv[1], anchor)
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)
