"""The native receive thread: every chunk keeps its own landing time, however late the loop comes.

Both readers are tested: the native one (the C thread, built at install time) and the pure-Python
fallback (``VLLM_LOAD_NATIVE=0``), which is exact only while the loop keeps up.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import run_in_process
from vllm_load.client import native
from vllm_load.rundir.reqlog import read_log

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the native reader is Linux's (epoll)")


@linux_only
def test_the_native_reader_is_built_by_the_install():
    # setup.py builds it with optional=True: a failed build must show here, not as a silent fallback
    assert native.built(), "vllm_load/client/_rxnative.c was not built: is gcc (and python3-dev) installed?"


def _pair() -> tuple[socket.socket, socket.socket]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    cli = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    srv.close()
    return cli, peer


def _kernel_stamps_on(deadline_s: float = 5.0) -> None:
    """Linux turns receive stamping on for the first socket that asks through a deferred static key: segments
    that land before it is on carry no stamp (the reader then stamps them itself). Wait until a stamped
    socket of our own gets a kernel stamp, so a test counting kernel-stamped reads counts them all."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        cli, peer = _pair()
        with cli, peer:
            cli.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS
            peer.sendall(b"x")
            _data, ancillary, _flags, _addr = cli.recvmsg(16, 64)
            if ancillary:
                return
    raise AssertionError("the kernel never stamped a received segment")


def _pop_wait(reader, fd: int, maxlen: int = 65536, timeout: float = 5.0):
    """Pop once something is queued (the reader's thread reads asynchronously); the eventfd says when."""
    import select
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = reader.pop(fd, maxlen)
        if got is not None:
            return got
        select.select([reader.fileno()], [], [], 0.5)
        reader.drain()
    raise AssertionError("nothing was read")


@linux_only
def test_reader_queues_each_segment_with_its_own_stamp_and_splits_only_by_maxlen():
    from vllm_load.client import _rxnative
    reader = _rxnative.Reader()
    cli, peer = _pair()
    fd = cli.fileno()
    with cli, peer:
        cli.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS
        _kernel_stamps_on()  # this socket keeps it on from here
        reader.watch(fd)
        before = time.perf_counter()
        cli.sendall(b"request")  # the kernel stamps it leaving
        peer.recv(100)
        peer.sendall(b"first segment\n")
        data, stamp1 = _pop_wait(reader, fd, maxlen=5)  # a read never crosses segments; maxlen splits one
        # the kernel's wall-clock stamp, moved onto perf_counter as it was read (a wall clock set mid-run moves no
        # offset)
        assert data == b"first" and before <= stamp1 <= time.perf_counter()
        data, stamp = _pop_wait(reader, fd)
        assert data == b" segment\n" and stamp == stamp1  # the rest of the same segment: the same stamp
        assert reader.pop(fd, 100) is None and not reader.pending(fd)
        sent = reader.sent(fd)
        assert sent is not None and before <= sent <= stamp1  # the request left before its answer came
        assert reader.sent(fd) is None  # taken once
        time.sleep(0.02)  # two segments 20 ms apart are two stamps 20 ms apart
        peer.sendall(b"second\n")
        time.sleep(0.02)
        peer.sendall(b"third\n")
        peer.shutdown(socket.SHUT_WR)
        seen = []
        while True:
            data, stamp = _pop_wait(reader, fd)
            if not data:
                break
            seen.append((data, stamp))
        assert [d for d, _ in seen] == [b"second\n", b"third\n"]
        assert 0.015 < seen[1][1] - seen[0][1] < 0.05
        assert reader.pending(fd)  # the end is queued: a pooled connection would be dropped
        reader.unwatch(fd)
        with pytest.raises(ValueError):
            reader.pop(fd, 10)
        assert reader.stats()["watched"] == 0 and reader.stats()["kernel_stamped"] >= 3


@linux_only
def test_reader_reports_a_reset_as_the_error_it_was():
    from vllm_load.client import _rxnative
    reader = _rxnative.Reader()
    cli, peer = _pair()
    with cli:
        reader.watch(cli.fileno())
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close = RST
        peer.close()
        with pytest.raises(ConnectionResetError):
            _pop_wait(reader, cli.fileno())
        reader.unwatch(cli.fileno())


# The loop is blocked (CPU-bound, never yielding, the GIL held) for 50 ms at a time while the server
# sends a chunk every 10 ms: five chunks of every stream land during each block.
BLOCKING = textwrap.dedent("""
    import time
    import gevent
    from locust import events
    from vllm_load.plugin.load.users import ChatUser

    class Blocked(ChatUser):
        pass

    def block():
        while True:
            gevent.sleep(0.02)
            end = time.perf_counter() + 0.05
            while time.perf_counter() < end:
                pass

    @events.test_start.add_listener
    def _block(environment, **_kw):  # for the run's length (a run in the test's own process ends with it)
        blocker = gevent.spawn(block)
        environment.events.quitting.add_listener(lambda **_kw: blocker.kill(block=False))
""")


@pytest.mark.quiet_cores
@pytest.mark.parametrize("reader", ["native", "python"])
def test_gaps_read_10ms_while_the_loop_is_blocked_50ms(reader, emulator_process_factory, tmp_path):
    if reader == "native" and not native.built():
        pytest.fail("the native reader is not built")
    truth_file = tmp_path / "truth.jsonl"
    emu = emulator_process_factory("--ttft", "0.05", "--itl", "0.01", "--timing-log", str(truth_file))
    (tmp_path / "blocked.py").write_text(BLOCKING)
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(tmp_path / "blocked.py"), "--headless", "-u", "4", "-r", "4", "-t", "4s", "--host",
                          emu.url, "--input-tokens", "32", "--output-tokens", "30", "--run-dir", str(run_dir),
                          "--allow-untrustworthy"],  # the blocked loop lags: judged below, not by the exit code
                         cwd=tmp_path, env_extra={"VLLM_LOAD_NATIVE": "1" if reader == "native" else "0"})
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["client"]["readers"] == [reader]  # the run says which reader timed it
    truth = {t["id"]: t for t in map(json.loads, truth_file.read_text().splitlines())}
    errors, shared, e2e_errors, gaps = [], 0, [], 0
    for r in read_log(next(run_dir.glob("requests*.jsonl"))):
        if not r["ok"]:
            continue
        offs, sent = r["chunk_offsets"], truth[r["response_id"]]["sent"]
        e2e_errors.append(abs(r["e2e"] - truth[r["response_id"]]["done"]))
        assert len(offs) == len(sent) == 30
        gaps += 29
        # one stamp for two chunks the server wrote a gap apart is a merge; written microseconds apart (the
        # emulator descheduled, then catching up) they land together, and one stamp is their truth
        merged = {i for i in range(1, 30) if offs[i] == offs[i - 1] and sent[i] - sent[i - 1] >= 0.001}
        shared += len(merged)
        # a merge moves its own gap (to 0) and the one before it (by the chunk's lateness): the native reader's
        # other gaps are judged below, the merges by their count and by the run's own account of them
        errors.extend(abs((offs[i] - offs[i - 1]) - (sent[i] - sent[i - 1])) for i in range(1, 30)
                      if reader == "python" or not ({i, i + 1} & merged))
    assert gaps >= 29 * 8, res.stdout[-2000:]
    # either reader ends the E2E as the [DONE] landed (its stamp), not when the 50 ms block let the loop get to it
    # (the Python reader's E2E once ran 12 ms long here; 7.7 ms at p99 at 256 streams, benchmarks/CHANGELOG.md). The
    # truth is stamped in the emulator's user space after its write: a VM that descheduled it there put one of 240
    # at 5.6 ms once
    assert max(e2e_errors) < 0.010, sorted(e2e_errors)[-5:]
    if reader == "native":
        # every gap reads 10 ms: off by a packet's trip through loopback (p99), and at most by the
        # emulator being descheduled between its write and its truth stamp (max: 14.5 ms once for one gap of 232
        # on this VM, p99 under 1 ms in that run; the failure this guards reads 0 and ~50 ms, and shares stamps)
        # the reader thread held off its CPU past a gap merges that stream's next chunk into the kernel's segment
        # (CI's busy host: 17 of ~250 once, each counted by the run). A reader waiting on the blocked loop would merge
        # most gaps, four of every five chunks of a 50 ms block; the run must count every merge its late reads made.
        # Two chunks the kernel delivered in one segment read together on time: no late read, none counted (1 of
        # 1,392 gaps once beside the full suite, with 0 late reads): at most 1 % of the gaps so
        assert shared <= 0.1 * gaps, (shared, gaps, summary["client"])
        assert shared - summary["late_merged_gaps"] <= 0.01 * gaps, (shared, gaps, summary["client"])
        # p99 under 1 ms on a quiet VM, 1.38 ms once beside CI's full suite: the bound is 3 ms, far under the ~40 ms
        # a reader waiting on the blocked loop puts on every gap it does not merge
        assert statistics.quantiles(errors, n=100)[98] < 0.003, sorted(errors)[-10:]
        assert max(errors) < 0.025, sorted(errors)[-10:]
    else:
        # the fallback reads when the loop gets round to it: the chunks that queued during a block
        # coalesce into one kernel segment, and the gaps read 0 and ~50 ms (what the native reader fixes)
        assert shared > 0 and max(errors) > 0.02
        # and the run says so: its reader read chunks long after they landed (the merged segment keeps the
        # newest stamp, so the lag seen is from the last chunk merged, not the first)
        assert summary["client"]["saturated"] and summary["client"]["read_lag_max"] >= 0.005
        assert any("python reader read a chunk" in r for r in summary["client"]["reasons"]), summary["client"]


def _kernel_at_least(major: int, minor: int) -> bool:
    release = os.uname().release.split("-")[0].split(".")
    return (int(release[0]), int(release[1])) >= (major, minor)


@linux_only
def test_without_cap_sys_nice_the_thread_asks_for_a_short_slice():
    # a container without CAP_SYS_NICE gets neither real time nor nice -10: the thread then asks for a 0.1 ms
    # slice (EEVDF, Linux 6.12+), so its wake-ups preempt the busy event loop instead of queueing behind it
    if not native.built():
        pytest.fail("the native reader is not built")
    cmd = [sys.executable, "-m", "vllm_load.cli", "native"]
    if os.geteuid() == 0:  # drop the capability, as a container's default set does
        cmd = ["setpriv", "--bounding-set", "-sys_nice", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, native.ENV: "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    # a kernel before 6.12 ignores the slice: the thread must not claim it then
    assert ("with a 0.1 ms slice;" in out.stdout) == _kernel_at_least(6, 12), out.stdout


@linux_only
def test_the_hub_hands_a_wave_over_in_stretches_so_due_work_runs_between():
    # a wave of completions all at once: each switch records a request and sends the next; handed over in
    # one go, anything due meanwhile (an open-loop arrival, a heartbeat) waited behind the whole wave
    import gevent
    from gevent.hub import Waiter
    from types import SimpleNamespace

    if not native.built():
        pytest.fail("the native reader is not built")
    reads = native.NativeReads()
    real = reads.reader  # kept: its eventfd stays open under the loop's watcher
    wave = list(range(10_000, 10_020))
    reads.reader = SimpleNamespace(drain=lambda: [(fd, [], 0, 0, 0, None) for fd in wave])
    done: list[int] = []

    def request(fd: int) -> None:
        waiter = Waiter()
        reads.waiters[fd] = (waiter, float("inf"))
        waiter.get()
        end = time.perf_counter() + 0.0005  # this request's own work: 0.5 ms
        while time.perf_counter() < end:
            pass
        done.append(fd)

    users = [gevent.spawn(request, fd) for fd in wave]
    gevent.sleep(0)  # every user parks in its wait
    assert len(reads.waiters) == len(wave)
    gevent.get_hub().loop.run_callback(reads._wake)
    seen: list[int] = []
    gevent.spawn(lambda: seen.append(len(done)))  # due right after the wave's news came in
    gevent.joinall(users, timeout=10)
    reads._wake_watcher.stop()
    reads._sweeper.stop()
    del real
    assert sorted(done) == wave  # every one handed over, in the end
    assert seen and seen[0] < len(wave) / 2, seen  # and the due work ran before the wave was through


@linux_only
def test_news_is_applied_when_drained_so_a_previous_body_never_ends_the_next(monkeypatch):
    # A keep-alive connection: its previous body ended, the next request waits for its headers, and the
    # thread reports the socket again before that request's greenlet runs (switches run in stretches); that
    # report still carries the previous body's end. Applied when the greenlet had registered its new body, it
    # completed that request with nothing in it ("stream ended before [DONE] after 0 tokens", 1 request in 424
    # against a real vLLM).
    import gevent

    from vllm_load.client.sse import StreamState

    if not native.built():
        pytest.fail("the native reader is not built")
    monkeypatch.setattr(native, "HANDOFF_S", 0.0)  # one switch per stretch: every later one waits a loop turn
    reads = native.NativeReads()
    real = reads.reader
    fd, other = 10_500, 10_501
    fields = dict(offsets=[0.01], tokens=[1], response_id="cmpl-x", content="hi", reasoning="", text="hi",
                  finish_reason="length", prompt_tokens=3, completion_tokens=1, cached_tokens=None, continuous=True,
                  done=True, done_at=0.02, answer_at=0.01, reasoning_streamed=0, reasoning_reported=None, late_merged=0)
    parsed = native._rxnative.Parsed(tuple(fields.values()))
    assert [getattr(parsed, k) for k in fields] == list(fields.values())

    class Thread:  # the C thread's view of one socket: its body's state is reset when a body starts
        state = 1  # the previous body's end
        body_parsed = None

        def drain(self):
            news, self.news = self.news, []
            return [native._rxnative.Drained((f, [], self.state if f == fd else 0, 0, 0,
                                              self.body_parsed if f == fd else None)) for f in news]

        def body(self, *args):
            self.state = 0

        def lines(self, f, flush=False):  # the C reader's named results, as it makes them
            return native._rxnative.Taken(([], self.state, 0, None))

    thread = Thread()
    reads.reader = thread
    got = []

    def request(f: int) -> None:
        reads.wait(f, None)  # its headers
        if f == fd:
            got.append(reads.stream_body(fd, True, -1, sink, 0.0, None))

    sink = StreamState()
    users = [gevent.spawn(request, other), gevent.spawn(request, fd)]
    gevent.sleep(0)
    hub = gevent.get_hub()
    thread.news = [other, fd]
    hub.loop.run_callback(reads._wake)  # both have news; `other` is switched to first, `fd` waits its turn
    gevent.sleep(0)
    thread.news = [fd]
    hub.loop.run_callback(reads._wake)  # reported again before its greenlet ran: still the old body's end
    deadline = time.monotonic() + 5
    while fd not in reads.bodies:  # the request took its headers and waits for its new body
        assert time.monotonic() < deadline and not got, got
        gevent.sleep(0.001)
    thread.state, thread.body_parsed, thread.news = 1, parsed, [fd]
    hub.loop.run_callback(reads._wake)  # its own body's end
    gevent.joinall(users, timeout=5)
    reads._wake_watcher.stop()
    reads._sweeper.stop()
    del real
    assert got and got[0].state == 1
    assert sink.done and sink.chunk_tokens == [1] and sink.content == "hi"  # the new body's own result


def _settled(reader, fd: int, timeout: float = 5.0) -> tuple:
    """The first drained (lines, state, parsed) of ``fd`` with a state (ended, failed or declined); the eventfd
    says when there is news."""
    import select
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        select.select([reader.fileno()], [], [], 0.5)
        for f, lines, state, _bytes, _err, parsed in reader.drain():
            if f == fd and state:
                return lines, state, parsed
    raise AssertionError(f"fd {fd} never settled")


def _expect_outcome(reader, block: bytes, body: bytes, close: bool = False):
    """Send ``block`` + ``body`` as the answer to an expected request; what the thread made of it: ("taken",
    (chunked, length, keep_alive, start), the drained state, the parsed result) or ("declined", raw head)."""
    cli, peer = _pair()
    fd = cli.fileno()
    with cli, peer:
        reader.watch(fd)
        try:
            assert reader.expect(fd, 1000.0, False) is False  # nothing queued before the request
            cli.sendall(b"POST / HTTP/1.1\r\n\r\n")
            peer.recv(100)
            peer.sendall(block + body)
            if close:  # a body delimited by the close
                peer.shutdown(socket.SHUT_WR)
            lines, state, parsed = _settled(reader, fd)
            if state == native.DECLINED:
                assert reader.accepted(fd) is None
                return "declined", reader.head(fd)
            return "taken", reader.accepted(fd), state, parsed, lines
        finally:
            reader.unwatch(fd)


SSE_BODY = b'data: {"id":"c","choices":[{"index":0,"text":"x","finish_reason":null}]}\n\ndata: [DONE]\n\n'
UVICORN = (b"HTTP/1.1 200 OK\r\ndate: Tue, 24 Nov 2026 12:00:00 GMT\r\nserver: uvicorn\r\n"
           b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n")


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)


@linux_only
def test_the_thread_takes_a_200s_head_exactly_as_head_parse_reads_it_or_leaves_it_to_python():
    # expect(): the C thread parses the answer's header block itself and reads the body on, so a request
    # wakes the loop once. Whatever it takes must read as direct.Head.parse reads it; anything it is unsure
    # of (not an HTTP/1.1 200, an odd length) is left raw for Python, whole.
    import random

    from vllm_load.client import _rxnative
    from vllm_load.client.direct import Head

    reader = _rxnative.Reader()
    must_take = [
        UVICORN,
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(SSE_BODY),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\nConnection: Close\r\n\r\n",
        b"HTTP/1.1 200\r\ntransfer-encoding:chunked\r\nconnection:  keep-alive \r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
    ]
    rng = random.Random(20)
    fields = [b"content-type: text/event-stream", b"transfer-encoding: chunked", b"Transfer-Encoding: identity",
              b"content-length: %d" % len(SSE_BODY), b"Content-Length: 0%d" % len(SSE_BODY), b"content-length: +12",
              b"content-length: 1_2", b"connection: close", b"Connection: keep-alive", b"connection: close, x",
              b"x-note: a\nconnection: close", b"\x0bconnection: close", b"connection:\x0cclose\x0b",
              b"no colon here", b"server: uvicorn", b"retry-after: 3"]
    statuses = [b"HTTP/1.1 200 OK", b"HTTP/1.1 200", b"HTTP/1.0 200 OK", b"HTTP/1.1 2000 X", b"HTTP/1.1 429 Slow",
                b"HTTP/1.1 500 Oops", b"HTTP/2 200", b"http/1.1 200 OK"]
    cases = [(b, True) for b in must_take]
    for _ in range(160):
        lines = [rng.choice(statuses[:2] * 3 + statuses)] + rng.sample(fields, rng.randint(0, 5))
        cases.append((b"\r\n".join(lines) + b"\r\n\r\n", False))
    taken = declined = 0
    for block, must in cases:
        try:
            head = Head.parse(block)
        except ValueError:
            head = None
        framed = head is not None and head.status == 200
        if not framed:
            body = b""
        else:
            body = _chunked(SSE_BODY) if head.chunked else SSE_BODY[:head.length] if head.length >= 0 else SSE_BODY
        got = _expect_outcome(reader, block, body, close=framed and not head.chunked and head.length < 0)
        if got[0] == "declined":
            assert not must, block
            assert got[1] == block  # left whole for Python's head(), nothing of it eaten
            declined += 1
            continue
        taken += 1
        chunked, length, keep_alive, start = got[1]
        assert head is not None and head.status == 200, block
        assert (chunked, length, keep_alive) == (head.chunked, head.length, head.keep_alive), block
        assert start == 1000.0 and got[2] == 1  # the body read to its end
    assert taken >= 40 and declined >= 40, (taken, declined)  # both ways were exercised


@linux_only
def test_an_expected_answer_cut_anywhere_is_taken_and_a_closed_one_is_left_to_python():
    from vllm_load.client import _rxnative
    from vllm_load.client.sse import StreamState

    reader = _rxnative.Reader()
    answer = UVICORN + _chunked(SSE_BODY)
    for cut in (5, len(UVICORN) - 3, len(UVICORN) - 1, len(UVICORN), len(UVICORN) + 4):
        cli, peer = _pair()
        fd = cli.fileno()
        with cli, peer:
            reader.watch(fd)
            reader.expect(fd, 1000.0, False)
            before = reader.stats()["bytes"]
            peer.sendall(answer[:cut])
            deadline = time.monotonic() + 5
            while reader.stats()["bytes"] - before < cut:  # two reads: the first part is read before the rest
                assert time.monotonic() < deadline, "the first part was never read"
                time.sleep(0.001)
            peer.sendall(answer[cut:])
            _lines, state, parsed = _settled(reader, fd)
            assert state == 1, (cut, state)
            sink = StreamState()
            sink.absorb(parsed)
            assert sink.done and sink.text == "x"
            assert reader.accepted(fd)[:3] == (True, -1, True)
            reader.unwatch(fd)
    # the server closes before any answer: left to Python, whose head() reads the end
    cli, peer = _pair()
    with cli:
        fd = cli.fileno()
        reader.watch(fd)
        reader.expect(fd, 1000.0, False)
        peer.close()
        assert _settled(reader, fd)[1] == native.DECLINED and reader.head(fd) == b""
        reader.unwatch(fd)


def test_a_stamp_read_across_a_wall_clock_set_is_taken_at_its_read(monkeypatch):
    """The Python reader's half of ``monotonic_of_stamp`` (benchmarks/wall_clock_step.py measures the C thread's
    against the emulator: a 3 s step once made one gap in 5,544 read 3 s): a stamp is moved onto perf_counter by the
    wall clock's lead; when that lead moved since the previous read, the clock was set while the stamp waited, so
    the read's own time stands in, and the next stamp, of the set clock, is exact again."""
    from vllm_load.client import rxstamp

    wall = {"lead": 1_000.0}
    monkeypatch.setattr(rxstamp.time, "time", lambda: time.perf_counter() + wall["lead"])
    monkeypatch.setattr(rxstamp, "_lead_seen", [])
    landed = time.perf_counter() - 0.002
    at, age = rxstamp.on_perf(landed + wall["lead"])
    assert at == pytest.approx(landed, abs=1e-6) and age == pytest.approx(0.002, abs=1e-3)
    wall["lead"] += 3.0  # the wall clock set 3 s forward while the next packet waited
    before = time.perf_counter()
    at, age = rxstamp.on_perf(landed + 1_000.0)  # stamped before the set: 3 s early on the set clock
    assert before <= at <= time.perf_counter() and age == 0.0
    landed = time.perf_counter() - 0.001
    at, age = rxstamp.on_perf(landed + wall["lead"])
    assert at == pytest.approx(landed, abs=1e-6) and age == pytest.approx(0.001, abs=1e-3)
