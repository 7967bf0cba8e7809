"""Abuse of the live telemetry server of a real run: the run must not notice."""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

from ddp_engine.common.protocol import Connection, read_monitor_file
from ddp_engine.common.run_dir import read_status
from tests.conftest import endless_run, processes_mentioning, run_engine, wait_for
from tests.faults.conftest import fault_case


def _junk(rng: random.Random, i: int) -> bytes:
    kind = i % 5
    if kind == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))).replace(b"\n", b"")
    if kind == 1:
        return b"{" * rng.randint(1, 50)  # not JSON
    if kind == 2:
        return json.dumps({"no_type": i}).encode()
    if kind == 3:
        return json.dumps({"type": f"unknown-{i}", "stop": True}).encode()
    return b"x" * (70_000 + i)  # longer than the 64 KiB line limit


def _step(run_dir: Path) -> int:
    return int((read_status(run_dir) or {}).get("step", 0))


@fault_case("Protocol abuse on a live run: 10,000 random, malformed and oversized lines; 50 "
            "concurrent viewers; a viewer that never reads; a client without the token "
            "sending stop",
            "training goes on at every moment; bad lines are ignored, tokenless clients are "
            "closed without effect; good viewers keep getting metrics; the run then stops "
            "normally with nothing left")
def test_protocol_abuse_leaves_the_run_unaffected(tmp_path: Path, observed: list[str]) -> None:
    rng = random.Random(0)
    with endless_run(tmp_path, "--log-every", "5") as (_proc, run_dir):
        wait_for(lambda: _step(run_dir) >= 10 and (run_dir / "monitor.json").exists(), 120,
                 "the run to train and serve")
        info = read_monitor_file(run_dir)
        # a client without the token: stop and junk, then the server closes it
        rogue = socket.create_connection((info["host"], info["port"]), timeout=10)
        rogue.sendall(b'{"type":"stop"}\n{"type":"hello","token":"guess","protocol":1}\n')
        assert rogue.recv(1024) == b""  # closed, nothing sent
        rogue.close()
        viewers = [Connection(run_dir, timeout_s=30) for _ in range(50)]
        stuck = Connection(run_dir, timeout_s=30)  # never reads again
        stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        before = _step(run_dir)
        abuser = Connection(run_dir, timeout_s=30)
        sent = 0
        for i in range(10_000):
            abuser.sock.sendall(_junk(rng, i) + b"\n")
            sent += 1
        abuser.send({"type": "ping"})
        while (m := abuser.receive()) is not None and m["type"] != "pong":
            pass
        assert m is not None and m["type"] == "pong"  # still served after 10,000 bad lines
        wait_for(lambda: _step(run_dir) >= before + 20, 60, "training to go on meanwhile")
        fresh = 0
        for v in viewers:  # every viewer gets metrics newer than the abuse
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                m = v.receive()
                if m is not None and m.get("type") == "metrics" and m["step"] > before:
                    fresh += 1
                    break
        assert fresh == 50
        assert read_status(run_dir)["state"] == "running"
        for c in (*viewers, stuck, abuser):
            c.close()
        stopped = run_engine("stop", str(run_dir), timeout=120)
        assert stopped.returncode == 0 and stopped.stdout.startswith("stopped")
        assert not processes_mentioning(str(run_dir))
        observed.append(f"{sent} bad lines sent, ping answered after them; the tokenless "
                        f"client's stop was ignored and it was closed; 50/50 viewers got "
                        f"new metrics; training advanced from step {before} meanwhile; "
                        f"`ddp_engine stop`: {stopped.stdout.strip()}; no process left")
