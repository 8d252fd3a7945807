"""Drive `rewind mcp` with the official Python MCP client (the `mcp` package).

Usage: client.py SCENARIO REWIND_BIN WORKDIR [PROFILE] [MODE]
Scenarios: lifecycle, session, progress, cancel, warm. MODE is `legacy`
(initialize) or `auto` (server/discover, falling back to initialize).
Exit 0 when every assertion holds; an AssertionError otherwise.
"""

import asyncio
import json
import os
import subprocess
import sys

import jsonschema
from mcp import Client, StdioServerParameters

PROFILES = {
    "lean": {"checkpoint", "rewind", "guard_effect"},
    "recovery": {"checkpoint", "rewind", "guard_effect", "list", "replay", "diff",
                 "status", "backtrack_candidates", "backtrack_commit"},
}
PROFILES["all"] = PROFILES["recovery"] | {"verify"}
LEAN_BUDGET_TOKENS = 1000


def client(binary, workdir, profile="all", mode="legacy"):
    params = StdioServerParameters(command=binary, args=["mcp", "--profile", profile],
                                   cwd=workdir, env={**os.environ, "RUST_BACKTRACE": "0"})
    return Client(params, mode=mode, read_timeout_seconds=120)


def compact(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


class Checked:
    """Calls tools and checks every result against the MCP contract."""

    def __init__(self, c, tools):
        self.c = c
        self.schemas = {t.name: t.output_schema for t in tools}
        self.called = set()

    async def ok(self, name, args=None, **kw):
        r = await self.c.call_tool(name, args or {}, **kw)
        text = " ".join(getattr(b, "text", "") for b in r.content)
        assert not r.is_error, f"{name}({args}) failed: {text}"
        assert r.structured_content is not None, f"{name}: no structuredContent"
        jsonschema.validate(r.structured_content, self.schemas[name])
        # The text block carries the same JSON, for clients without structured output.
        assert json.loads(r.content[0].text) == r.structured_content
        self.called.add(name)
        return r.structured_content

    async def err(self, name, args, *needles):
        r = await self.c.call_tool(name, args)
        assert r.is_error, f"{name}({args}) should fail, got {r.structured_content}"
        assert r.structured_content is None, "error results carry no structuredContent"
        text = " ".join(getattr(b, "text", "") for b in r.content)
        for n in needles:
            assert n in text, f"{name} error {text!r} lacks {n!r}"
        self.called.add(name)
        return text


async def lifecycle(binary, workdir, profile, mode):
    async with client(binary, workdir, profile, mode) as c:
        info = c.server_info
        assert info is not None and info.name == "rewind", info
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split()[-1]
        assert info.version == version, (info.version, version)
        assert c.instructions and "checkpoint" in c.instructions and "guard_effect" in c.instructions
        tools = (await c.list_tools()).tools
        names = {t.name for t in tools}
        assert names == PROFILES[profile], (profile, names)
        for t in tools:
            assert t.description, t.name
            s = t.input_schema
            assert s["type"] == "object" and s.get("additionalProperties") is False, (t.name, s)
            for field, prop in s.get("properties", {}).items():
                assert prop.get("description"), f"{t.name}.{field} has no description"
            assert t.output_schema and t.output_schema["type"] == "object", t.name
            jsonschema.Draft202012Validator.check_schema(t.output_schema)
            a = t.annotations
            for hint in ("read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint"):
                assert getattr(a, hint) is not None, f"{t.name}: {hint} not explicit"
            if t.name in ("rewind", "replay", "backtrack_commit"):
                assert a.destructive_hint and not a.read_only_hint, t.name
            if t.name in ("list", "status", "diff", "verify", "backtrack_candidates"):
                assert a.read_only_hint, t.name
        size = len(compact([t.model_dump(exclude_none=True, by_alias=True) for t in tools])) + len(c.instructions)
        print(json.dumps({"profile": profile, "mode": mode, "protocol": c.protocol_version,
                          "chars": size, "tokens": size // 4}))
        if profile == "lean":
            assert size / 4 < LEAN_BUDGET_TOKENS, f"lean profile is {size / 4:.0f} tokens"


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def read(path):
    with open(path) as f:
        return f.read()


async def session(binary, workdir, profile, mode):
    for i in range(5):
        write(os.path.join(workdir, "src", f"m{i}.py"), f"print({i})\n")
    write(os.path.join(workdir, "README"), "v1\n")
    write(os.path.join(workdir, "cache", "blob"), "v1\n")
    async with client(binary, workdir, "all", mode) as c:
        k = Checked(c, (await c.list_tools()).tools)
        # Before any checkpoint: an empty history, not an error.
        await k.err("list", {}, "checkpoint")
        base = await k.ok("checkpoint", {"label": "base"})
        assert base["added"] >= 6 and not base["unchanged"], base
        # Damage from the shell, as an agent's command would do it.
        subprocess.run("rm -rf src && echo broken > README && touch new.txt", shell=True, cwd=workdir, check=True)
        st = await k.ok("status", {})
        paths = {ch["path"]: ch["status"] for ch in st["changes"]}
        assert paths.get("README") == "modified" and paths.get("new.txt") == "added", paths
        assert paths.get("src") == "deleted" or paths.get("src/m0.py") == "deleted", paths
        # Only under the paths asked for (D322).
        only = await k.ok("status", {"paths": ["src"]})
        assert only["total"] == 6 and all(ch["path"].startswith("src") for ch in only["changes"]), only
        assert "warnings" not in only, only
        # A mistyped path is said, as the CLI says it (helper-76).
        typo = await k.ok("status", {"paths": ["srcc"]})
        assert typo["total"] == 0 and "srcc" in " ".join(typo.get("warnings", [])), typo
        d = await k.ok("diff", {"from": base["id"], "patch": True, "paths": ["README"]})
        assert d["total"] == 1 and "-v1" in d["patch"] and "+broken" in d["patch"], d
        plan = await k.ok("rewind", {"id": "base", "dry_run": True})
        assert plan["dry_run"] and plan["plan"], plan
        r = await k.ok("rewind", {"id": base["id"], "report": "rm -rf src was a dead end", "expect": plan["plan_fingerprint"]})
        assert r["rewound_to"] == base["id"] and r["safety_checkpoint"], r
        assert read(os.path.join(workdir, "README")) == "v1\n"
        assert read(os.path.join(workdir, "src", "m3.py")) == "print(3)\n"
        assert not os.path.exists(os.path.join(workdir, "new.txt"))
        # Failure memory: the report is shown where the next attempt starts.
        cands = await k.ok("backtrack_candidates", {})
        first = cands["candidates"][0]
        assert first["id"] == base["id"], cands
        assert [a["note"] for a in first["failed_attempts"]] == ["rm -rf src was a dead end"], cands
        assert first["failed_attempts"][0]["abandoned_at"] == r["safety_checkpoint"]
        lst = await k.ok("list", {})
        assert lst["head"] == base["id"] and any(ck.get("note") for ck in lst["checkpoints"]), lst
        # Forward again, then back with backtrack_commit.
        rp = await k.ok("replay", {"id": r["safety_checkpoint"]})
        assert read(os.path.join(workdir, "README")) == "broken\n", rp
        await k.err("backtrack_commit", {"id": base["id"], "note": "  "}, "note")
        bc = await k.ok("backtrack_commit", {"id": base["id"], "note": "second try failed too"})
        assert read(os.path.join(workdir, "README")) == "v1\n", bc
        cands = await k.ok("backtrack_candidates", {"limit": 1})
        notes = [a["note"] for a in cands["candidates"][0]["failed_attempts"]]
        assert "rm -rf src was a dead end" in notes and "second try failed too" in notes, notes
        # What a rewind leaves as it is is listed with why (D168): here a
        # directory the base holds that `.rewind/ignore` now excludes.
        write(os.path.join(workdir, ".rewind", "ignore"), "cache/\n")
        write(os.path.join(workdir, "cache", "blob"), "the live cache\n")
        write(os.path.join(workdir, "README"), "v3\n")
        # A name that is not UTF-8 is given by its bytes too (D128).
        with open(os.path.join(os.fsencode(workdir), b"bad\xffname"), "w") as f:
            f.write("x")
        st = await k.ok("status", {})
        hexes = [ch.get("path_hex") for ch in st["changes"]]
        assert "626164ff6e616d65" in hexes, st
        r = await k.ok("rewind", {"id": base["id"]})
        assert [kp["path"] for kp in r["kept"]] == ["cache"] and r["kept"][0]["reason"], r
        assert read(os.path.join(workdir, "cache", "blob")) == "the live cache\n"
        assert read(os.path.join(workdir, "README")) == "v1\n"
        os.remove(os.path.join(workdir, ".rewind", "ignore"))
        # The effect barrier: the first firing is admitted, the second refused.
        g1 = await k.ok("guard_effect", {"key": "charge-order-1", "kind": "payment", "payload": {"amount": 100}})
        assert g1["decision"] == "admitted" and g1["code"] == "FIRST_FIRING", g1
        g2 = await k.ok("guard_effect", {"key": "charge-order-1", "kind": "payment", "payload": {"amount": 100}})
        assert g2["decision"] == "refused" and g2["code"] == "SPENT", g2
        g3 = await k.ok("guard_effect", {"key": "charge-order-1", "payload": {"amount": 999}})
        assert g3["code"] == "PAYLOAD_MISMATCH", g3
        v = await k.ok("verify", {"deep": True})
        assert v["ok"] and v["entries"] > 5, v
        # Pagination: pages of one add up to the whole list, in order.
        whole = await k.ok("list", {"limit": 200})
        seen, cursor = [], None
        while True:
            page = await k.ok("list", {"limit": 1, **({"cursor": cursor} if cursor else {})})
            seen += [ck["id"] for ck in page["checkpoints"]]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        assert seen == [ck["id"] for ck in whole["checkpoints"]] and len(seen) == whole["total"], (seen, whole)
        # A checkpoint made between two pages neither repeats an item on
        # the next page nor hides one: a cursor is a place in the history,
        # not an offset (D184). A limit of 0 gives the count only.
        first = await k.ok("list", {"limit": 1})
        between = await k.ok("checkpoint", {"label": "between pages"})
        rest = await k.ok("list", {"limit": 200, "cursor": first["next_cursor"]})
        ids = [ck["id"] for ck in first["checkpoints"] + rest["checkpoints"]]
        assert ids == [ck["id"] for ck in whole["checkpoints"]], (ids, whole)
        assert between["id"] not in ids, (between, ids)
        none = await k.ok("list", {"limit": 0})
        assert none["checkpoints"] == [] and none["total"] == whole["total"] + 1, none
        assert "next_cursor" not in none, f"a cursor a pager with limit 0 loops on: {none}"
        # Errors a model can act on; none changes anything.
        before = await k.ok("list", {"limit": 200})
        await k.err("rewind", {"id": "nosuchid"}, "call `list`")
        await k.err("rewind", {"id": base["id"], "bogus": 1}, "unknown field")
        await k.err("rewind", {}, "missing field `id`")
        await k.err("list", {"cursor": "garbage"}, "next_cursor")
        await k.err("guard_effect", {"key": ""}, "key")
        await k.err("guard_effect", {"key": "charge-order-2", "payload": 5}, "JSON object or a string")
        await k.err("guard_effect", {"key": "charge-order-2", "payload": [1, 2]}, "JSON object or a string")
        await k.err("guard_effect", {"key": "charge-order-1\u0000x"}, "control character")
        await k.err("diff", {"paths": ["../outside"]}, "outside")
        stale = await k.err("rewind", {"id": base["id"], "expect": "0000000000000000"}, "plan changed", "`dry_run`", "plan_fingerprint")
        assert "--dry-run" not in stale, f"a CLI command offered to the model: {stale!r}"
        after = await k.ok("list", {"limit": 200})
        assert before == after, "a failed call changed the history"
        missing = PROFILES["all"] - k.called
        assert not missing, f"tools never called: {missing}"
        # A pruned checkpoint: the error names the tools this model has,
        # not a CLI command it cannot run (D187).
        gc = subprocess.run([binary, "gc", "--keep-last", "1", "--force", "--json"],
                            cwd=workdir, capture_output=True, text=True, check=True)
        gone = json.loads(gc.stdout)["pruned"][0]
        gone = gone["id"] if isinstance(gone, dict) else gone
        text = await k.err("rewind", {"id": gone}, "PRUNED", "call `list`")
        assert "`rewind " not in text, text
        print(json.dumps({"session": "ok", "checkpoints": after["total"]}))


def big_tree(workdir, files):
    for d in range(files // 500):
        os.makedirs(os.path.join(workdir, f"d{d}"), exist_ok=True)
        for i in range(500):
            with open(os.path.join(workdir, f"d{d}", f"f{i}"), "w") as f:
                f.write(f"{d}/{i}\n")


async def progress(binary, workdir, profile, mode):
    big_tree(workdir, 5000)
    seen = []

    async def on_progress(p, total, message):
        seen.append((p, message))

    async with client(binary, workdir, "all", mode) as c:
        r = await c.call_tool("checkpoint", {}, progress_callback=on_progress)
        assert not r.is_error, r.content
        assert seen, "no progress notification for a call made with a progress token"
        values = [p for p, _ in seen]
        assert values == sorted(values) and len(set(values)) == len(values), f"progress must increase: {values}"
        assert all(m and m.startswith("checkpoint") for _, m in seen), seen
        # Without a token, no notifications.
        n = len(seen)
        await c.call_tool("status", {})
        assert len(seen) == n
        print(json.dumps({"progress_notifications": n}))


async def cancel(binary, workdir, profile, mode):
    """The server runs with REWIND_FAILPOINT=capture:dir and a pause (a slow
    disk), so the checkpoint is still walking when the client cancels."""
    big_tree(workdir, 1000)
    async with client(binary, workdir, "all", mode) as c:
        task = asyncio.create_task(c.call_tool("checkpoint", {"label": "cancelled"}))
        await asyncio.sleep(0.5)
        assert not task.done(), "the checkpoint finished before it could be cancelled"
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        # The server is still serving, and the cancelled capture committed nothing.
        r = await c.call_tool("list", {})
        text = " ".join(getattr(b, "text", "") for b in r.content)
        assert r.is_error or r.structured_content["total"] == 0, f"a cancelled checkpoint left history: {text}"
        print(json.dumps({"cancel": "ok"}))


async def warm(binary, workdir, profile, mode):
    """The server keeps its workspace open between calls (D63). Other
    processes are not locked out and see what it wrote; a `.rewind/`
    replaced between calls, or a mount started or stopped, is noticed and
    the workspace reopened. With REWIND_TEST_MOUNT=1 (root, /dev/fuse) the
    mount part runs too."""
    def cli(*args, check=True):
        out = subprocess.run([binary, *args, "--json"], cwd=workdir, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 or not check, f"rewind {' '.join(args)}: {out.stderr}"
        return json.loads(out.stdout) if out.stdout.strip() else {}

    labels = lambda listing: [ck.get("label") for ck in listing["checkpoints"]]
    f = os.path.join(workdir, "a.txt")
    write(f, "1\n")
    async with client(binary, workdir, "all", mode) as c:
        k = Checked(c, (await c.list_tools()).tools)
        await k.ok("checkpoint", {"label": "one"})
        # No lock held between calls: a CLI checkpoint is not queued behind it.
        write(f, "2\n")
        two = cli("checkpoint", "two")
        lst = await k.ok("list", {})
        assert lst["head"] == two["id"] and "two" in labels(lst), lst
        # A new .rewind/ at the same path: the server must not write to the
        # ledger it had open (now deleted).
        subprocess.run(["rm", "-rf", os.path.join(workdir, ".rewind")], check=True)
        cli("init")
        write(f, "3\n")
        three = await k.ok("checkpoint", {"label": "three"})
        assert labels(cli("list")) == ["three"], cli("list")
        if os.environ.get("REWIND_TEST_MOUNT") == "1":
            out = subprocess.run([binary, "mount", workdir], cwd="/", capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            try:
                write(f, "4\n")
                assert cli("doctor")["fuse"]["dirty_dirs"] == "all", "a fresh mount is all dirty"
                four = await k.ok("checkpoint", {"label": "four"})
                assert four["modified"] == 1, four
                # Only a capture through the daemon commits its dirty set:
                # a workspace kept from before the mount would walk instead.
                assert cli("doctor")["fuse"]["dirty_dirs"] == 0, cli("doctor")
                r = await k.ok("rewind", {"id": three["id"]})
                assert r["written"] == 1 and read(f) == "3\n", r
            finally:
                out = subprocess.run([binary, "unmount", workdir], cwd="/", capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            write(f, "5\n")
            five = await k.ok("checkpoint", {"label": "five"})
            assert five["modified"] == 1 and read(f) == "5\n", five
            assert "five" in labels(cli("list")), cli("list")
        print(json.dumps({"warm": "ok"}))


def main():
    scenario, binary, workdir = sys.argv[1:4]
    profile = sys.argv[4] if len(sys.argv) > 4 else "all"
    mode = sys.argv[5] if len(sys.argv) > 5 else "legacy"
    fn = {"lifecycle": lifecycle, "session": session, "progress": progress, "cancel": cancel,
          "warm": warm}[scenario]
    asyncio.run(fn(binary, workdir, profile, mode))


if __name__ == "__main__":
    main()
