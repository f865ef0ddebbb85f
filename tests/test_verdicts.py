"""Verdicts a CI can trust: no green run that measured nothing, bounded error storms, honest causes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.plugin.lifecycle.log_repeats import RepeatFilter
from vllm_load.report.results import validity_checks
from vllm_load.metrics.judge.slo import parse_slo

CHAT = str(ROOT / "locustfiles/chat.py")


def summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_a_chat_run_below_the_chat_templates_minimum_is_refused_before_it_starts(tmp_path):
    res = run_in_process(["-f", CHAT, "--headless", "-u", "4", "-r", "4", "-t", "20s", "--input-tokens", "2-40",
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=90)
    assert res.returncode == 2, res.stdout[-2000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("vllm-load: error:")]
    # the chat minimum (template 8 + 1 word with Mistral's template), not the completions one (2)
    assert len(errors) == 1 and "9-token minimum of a chat prompt" in errors[0], res.stderr[-2000:]
    assert "PyTorch was not found" not in res.stderr  # transformers' import notice is silenced
    assert not (tmp_path / "run" / "llm_stats.json").exists()  # refused before any load


def test_completions_keep_their_own_smaller_minimum(tmp_path):
    res = run_in_process(["-f", str(ROOT / "locustfiles/completions.py"), "--headless", "-u", "2", "-r", "2", "-t", "2s",
                          "--input-tokens", "2-12", "--output-tokens", "4", "--run-dir", str(tmp_path / "run")],
                         cwd=tmp_path, timeout=90)
    assert res.returncode == 0, res.stderr[-2000:]
    assert min(r["input_tokens"] for r in map(json.loads, (tmp_path / "run" / "requests.jsonl").open())) >= 2


def test_a_run_whose_every_request_fails_exits_non_zero_even_when_an_slo_allows_errors(tmp_path, emulator_factory):
    emu = emulator_factory("--fault", "500:1")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "4", "-r", "4", "-t", "4s", "--host", emu.url,
                          "--slo", "error_rate<=100%", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 4, res.stdout[-2000:]
    assert "RUN INVALID: only 0 of" in res.stdout and "the run measured nothing" in res.stdout
    data = summary_of(run_dir)
    assert data["valid"] is False and data["exit_code"] == 4
    junit = (run_dir / "junit.xml").read_text()
    assert 'classname="vllm_load.run" name="requests succeeded &gt;= 1"' in junit and "the run measured nothing" in junit
    # the same error on every request is one counted line on the console and a bounded log
    assert len([line for line in res.stdout.splitlines() if line.startswith("failed x")]) == 1
    # (each user backs off after a 5xx: ~10 attempts per user in 4 s, where it used to be hundreds)
    assert data["summary"]["failed"] > 10 and len(res.stderr) < 20_000, len(res.stderr)
    # --min-requests 0 opts out: the error_rate SLO then governs alone
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "2s", "--host", emu.url,
                          "--slo", "error_rate<=100%", "--min-requests", "0", "--run-dir", str(tmp_path / "r2")],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:]


def test_a_task_that_raises_the_same_error_every_time_writes_a_bounded_log(tmp_path, emulator_factory):
    emu = emulator_factory()
    lf = tmp_path / "raising.py"
    lf.write_text(
        "from locust import User, constant, task\n"
        "import vllm_load.plugin.load.users  # noqa: F401  (the plugin)\n\n"
        "class Broken(User):\n"
        "    wait_time = constant(0)\n\n"
        "    @task\n"
        "    def generate(self):\n"
        "        raise ValueError('the same mistake')\n")
    res = run_in_process(["-f", str(lf), "--headless", "-u", "4", "-r", "4", "-t", "3s", "--host", emu.url,
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    # tens of thousands of raises in 3 s: one traceback, then one line per power of ten
    assert res.stderr.count("Traceback") == 1, res.stderr[-3000:]
    counted = [line for line in res.stderr.splitlines() if "the same error" in line and "times so far" in line]
    assert counted and len(counted) <= 8 and len(res.stderr) < 30_000, len(res.stderr)
    # Locust counts every one; the run measured nothing, and says both
    assert res.returncode == 4 and "user tasks raised" in res.stdout, res.stdout[-2000:]
    assert "RUN INVALID: no request completed: the run measured nothing" in res.stdout


def test_a_prompt_failure_that_every_request_would_repeat_stops_the_swarm_at_once(tmp_path, emulator_factory):
    emu = emulator_factory()
    lf = tmp_path / "badprompts.py"
    lf.write_text(
        "from vllm_load.errors import UsageError\n"
        "from vllm_load.plugin.requests.request_source import RequestSource\n"
        "from vllm_load.plugin.load.users import ChatUser  # noqa: F401\n\n"
        "def build_request(self, api):\n"
        "    raise UsageError('record 7 is longer than max_model_len: drop it')\n\n"
        "RequestSource.build_request = build_request\n")
    from vllm_load.plugin.requests.request_source import RequestSource

    original = RequestSource.build_request  # the locustfile patches the class: this process's later runs need it back
    try:
        res = run_in_process(["-f", str(lf), "--headless", "--processes", "2", "-u", "4", "-r", "4", "-t", "60s",
                              "--host", emu.url, "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=60)
    finally:
        RequestSource.build_request = original
    assert res.returncode == 2, (res.stdout[-2000:], res.stderr[-2000:])
    errors = [line for line in res.stderr.splitlines() if line.startswith("vllm-load: error:")]
    assert errors == ["vllm-load: error: record 7 is longer than max_model_len: drop it"], res.stderr[-3000:]
    assert "Traceback" not in res.stderr and len(res.stderr) < 20_000
    assert "the run was stopped: record 7" in res.stdout


def test_a_wrong_tokenizer_fails_the_run_unless_an_input_drift_slo_accepts_it(tmp_path, emulator_factory):
    # the server counts with Tekken, the client builds prompts with Mistral's SentencePiece
    emu = emulator_factory("--tokenizer", "builtin:mistral-tekken", "--ttft", "0.01", "--itl", "0.002")
    # ended by a count: what is judged is the prompts' token counts against the server's
    args = ["-f", CHAT, "--headless", "-u", "4", "-r", "4", "-t", "60s", "--num-requests", "12", "--host", emu.url,
            "--output-tokens", "8"]
    res = run_in_process([*args, "--run-dir", str(tmp_path / "a")], cwd=tmp_path)
    assert res.returncode == 4, res.stdout[-2000:]
    assert "the tokenizer does not match the server's: pass --tokenizer" in res.stdout
    assert summary_of(tmp_path / "a")["summary"]["input_drift_fraction"] > 0.5
    res = run_in_process([*args, "--slo", "input_drift<=100%", "--run-dir", str(tmp_path / "b")], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:]
    res = run_in_process([*args, "--slo", "input_drift<=1%", "--run-dir", str(tmp_path / "c")], cwd=tmp_path)
    assert res.returncode == 3, res.stdout[-2000:]


def test_validity_rules():
    base = {"requests": 100, "succeeded": 100, "usage_missing": 0, "input_drift_requests": 1,
            "input_drift_max_abs": 3}
    assert all(c.passed for c in validity_checks(base, []))
    drifted = {**base, "input_drift_requests": 2}
    assert [c.passed for c in validity_checks(drifted, [])] == [True, False]
    assert len(validity_checks(drifted, [parse_slo("input_drift<=5%")])) == 1  # the SLO governs drift
    empty = {**base, "requests": 3, "succeeded": 0, "input_drift_requests": 0}
    assert not validity_checks(empty, [])[0].passed
    assert validity_checks({**base, "succeeded": 4}, [], min_requests=5)[0].passed is False
    # a swarm whose processes were still starting when it ended says so (32 processes on 2 cores, 20 s: 0 ready)
    starting = {**base, "requests": 0, "succeeded": 0, "processes": 32, "processes_ready": 5}
    assert "only 5 of its 32 load processes were ready when it ended" in validity_checks(starting, [])[0].detail
    assert "load processes" not in validity_checks({**starting, "processes_ready": 32}, [])[0].detail
    assert parse_slo("input_drift<=100%").stat == "share" and parse_slo("input_drift<=3").stat == ""


def test_repeat_filter_logs_the_first_and_then_each_power_of_ten():
    f = RepeatFilter()
    passed = []
    for i in range(1, 1001):
        rec = logging.LogRecord("locust.user.task", logging.ERROR, __file__, 1, "%s\n%s",
                                (ValueError("boom"), f"Traceback … frame {i}"), None)
        if f.filter(rec):
            passed.append((i, rec.getMessage()))
    assert [i for i, _ in passed] == [1, 10, 100, 1000]
    assert passed[0][1].startswith("boom\nTraceback")
    assert passed[-1][1] == "ValueError: boom (the same error 1000 times so far; logged at every power of ten)"
    other = logging.LogRecord("locust.user.task", logging.ERROR, __file__, 1, "%s\n%s", (KeyError("x"), ""), None)
    assert f.filter(other)  # another error is logged in full



def test_a_worker_drops_its_shutting_down_line_beside_the_early_web_ui_line():
    """Both filters sit on ``locust.main``; the early one (every role, at import) once hid the worker's from the
    check that adds it, and a --processes 2 run printed "Shutting down (exit code 0)" three times."""
    from vllm_load.plugin.lifecycle import log_repeats

    logger = logging.getLogger("locust.main")
    before = list(logger.filters)
    try:
        log_repeats.quiet_early()
        log_repeats.quiet("worker")
        log_repeats.quiet("worker")  # idempotent: one filter per message set
        def shown(msg: str) -> bool:
            return all(f.filter(logging.LogRecord("locust.main", logging.INFO, __file__, 1, msg, (), None))
                       for f in logger.filters)
        assert not shown("Shutting down (exit code 0)") and not shown("Starting web interface at http://x")
        assert shown("Starting Locust 2.47.0")
        assert len([f for f in logger.filters if isinstance(f, log_repeats.QuietFilter)]) == 2
    finally:
        logger.filters[:] = before

def _pinned(core: int):
    def pin() -> None:
        os.sched_setaffinity(0, {core})
    return pin


needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin to")


@pytest.mark.e2e
@pytest.mark.quiet_cores
@needs_two_cores
def test_a_cpu_hog_on_the_clients_core_is_named_as_contention_not_add_workers(tmp_path, emulator_process_factory):
    cores = sorted(os.sched_getaffinity(0))
    emu = emulator_process_factory("--ttft", "0.02", "--itl", "0.005")
    os.sched_setaffinity(emu.p.pid, {cores[1]})
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def client() -> None:  # the client on the hogs' core, at a lower priority: the kernel keeps it waiting
        os.sched_setaffinity(0, {cores[0]})
        os.nice(19)

    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", CHAT, "--headless", "-u", "4", "-r", "4",
                             "-t", "8s", "--host", emu.url, "--output-tokens", "16", "--run-dir", str(run_dir)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=client)
    hogs: list[subprocess.Popen] = []
    try:
        # the hogs spin only while the load runs (at start-up they would slow the imports thirtyfold)
        for line in proc.stderr:
            if "All users spawned" in line and not hogs:
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_pinned(cores[0]))
                        for _ in range(3)]
            if "--run-time limit reached" in line:
                break
    finally:
        for h in hogs:
            h.kill()
    stdout, _ = proc.communicate(timeout=120)
    assert hogs, "the run never spawned its users"
    client_verdict = summary_of(run_dir)["summary"]["client"]
    assert client_verdict["saturated"] and client_verdict["cause"] == "contention", client_verdict
    assert proc.returncode == 5 and summary_of(run_dir)["valid"] is False  # a gate fails it, naming the cause
    assert client_verdict["loop_lag_max"] >= 0.05 and client_verdict["cpu_wait_max"] >= 0.025
    assert "another process (e.g. a server on this host) competes for these cores" in stdout
    assert "add workers" not in stdout


@pytest.mark.e2e
@pytest.mark.quiet_cores
@needs_two_cores
def test_a_client_at_its_own_cpu_limit_is_told_to_add_workers(tmp_path, emulator_process_factory):
    cores = sorted(os.sched_getaffinity(0))
    emu = emulator_process_factory("--ttft", "0.02", "--itl", "0.005")
    os.sched_setaffinity(emu.p.pid, {cores[1]})
    lf = tmp_path / "busy.py"
    lf.write_text(  # a user task that computes between requests: the client's own CPU is the limit
        "import time\n"
        "from locust import task\n"
        "from vllm_load.plugin.load.users import ChatUser\n\n"
        "class Busy(ChatUser):\n"
        "    @task\n"
        "    def generate(self):\n"
        "        end = time.perf_counter() + 0.2\n"
        "        while time.perf_counter() < end:\n"
        "            pass\n"
        "        super().generate()\n")
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # 8 users: while some wait on the server, the others' computing keeps the core busy (with 4, the loop's
    # CPU in the second of its worst lag measured 88 % in one run, under the 90 % limit)
    res = subprocess.run([sys.executable, "-m", "locust", "-f", str(lf), "--headless", "-u", "8", "-r", "8",
                          "-t", "9s", "--host", emu.url, "--output-tokens", "4", "--run-dir", str(run_dir)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                         preexec_fn=_pinned(cores[0]))
    client_verdict = summary_of(run_dir)["summary"]["client"]
    print(client_verdict)
    assert client_verdict["saturated"] and client_verdict["cause"] == "client", client_verdict
    assert "add workers" in res.stdout


def test_batch_1_and_batch_8_send_the_same_instruction_and_report_records_per_second(tmp_path, emulator_factory):
    from vllm_load.workload.inputs.datasets import BATCH_INSTRUCTION

    received = tmp_path / "received.jsonl"
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--request-log", str(received))
    reviews = tmp_path / "reviews.csv"
    reviews.write_text("review\n" + "".join(f"\"review number {i}, fine phone\"\n" for i in range(40)))
    rates = {}
    for k in (1, 8):
        run_dir = tmp_path / f"k{k}"
        res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "3s", "--host", emu.url,
                              "--dataset", str(reviews), "--dataset-batch", str(k), "--run-dir", str(run_dir)],
                             cwd=tmp_path)
        assert res.returncode == 0, res.stdout[-2000:]
        s = summary_of(run_dir)["summary"]
        assert s["records_per_request"] == k and s["records"] == k * s["succeeded"]
        assert s["record_rate"] == pytest.approx(k * s["request_rate"])
        assert f"records {s['records']} ({k} per request)" in res.stdout
        assert "records/s" in (run_dir / "report.html").read_text()
        rates[k] = s["record_rate"]
    bodies = [json.loads(line)["body"] for line in received.read_text().splitlines()]
    contents = [b["messages"][0]["content"] for b in bodies]
    # every request: a digest line, then the one instruction, then 1 or 8 numbered records
    assert all(c.split("\n")[1] == BATCH_INSTRUCTION for c in contents)
    assert {c.count("\n") - 1 for c in contents} == {1, 8}
    # the answer budget is per record: 8 records ask for 8 answer lines' worth of tokens
    budgets = {c.count("\n") - 1: b["max_tokens"] for c, b in zip(contents, bodies)}
    assert budgets[8] == 8 * budgets[1] and budgets[1] >= 4


def test_a_task_raising_in_a_loop_is_named_as_the_cause_not_a_lack_of_workers():
    """The evidence (a client at its CPU limit) is the same as a real lack of workers; the exceptions, outnumbering
    the requests, name the task and its error instead."""
    from vllm_load.metrics.judge.client_health import ClientHealth, looping_errors

    tb = ('  File "/usr/lib/python3/site-packages/locust/user/task.py", line 340, in execute_task\n    task(self)\n'
          '  File "/home/me/lf.py", line 9, in ask\n    self.llm.chat("hello there")\n'
          '  File "/work/main/vllm_load/plugin/requests/llm.py", line 126, in chat\n    check_messages(messages)\n')
    errors = [(12339, "self.llm.chat(messages): messages must be a non-empty list", tb), (3, "other", "")]
    assert looping_errors(errors, requests=0) == (12342, "'self.llm.chat(messages): messages must be a non-empty "
                                                         "list' in ask (lf.py:9), 12339 times")
    assert looping_errors(errors, requests=20000) is None  # a few failing calls among many requests: not the cause
    assert looping_errors([(49, "x", tb)], requests=0) is None
    health = ClientHealth()
    hot = {"t": 0.0, "cpu": 99.0, "lag": 0.3, "streams": 0, "cpu_at_lag": 99.0, "wait_at_lag": 0.0}
    health.add("local", hot)
    health.add("local", dict(hot, t=3.0))
    plain = health.verdict()
    assert plain.cause == "client" and "add workers" in plain.advice
    named = health.verdict(user_errors=looping_errors(errors, requests=0))
    assert named.saturated and named.cause == "user_error" and "add workers" not in named.advice
    assert "in ask (lf.py:9), 12339 times" in named.advice and "fix the task" in named.advice
    assert ClientHealth().verdict(user_errors=(60, "x")).cause is None  # a kept time is not blamed on anything
    # the web UI's live summary judges as the end does: the task is named while the run goes on
    from vllm_load.metrics.stats import LLMStats
    from vllm_load.plugin.webui.webui import live_summary

    live = live_summary(LLMStats(), time.time() - 5, health, errors)["client"]
    assert live["cause"] == "user_error" and "in ask (lf.py:9)" in live["advice"], live
    assert live_summary(LLMStats(), time.time() - 5, health)["client"]["cause"] == "client"


def test_a_user_calling_self_llm_wrongly_is_told_so_with_one_exit_code(tmp_path, emulator_factory):
    """The issue's run: ``self.llm.chat("hello there")`` in a task. One cause (the task and its exception), and
    every line's exit code the process's own."""
    emu = emulator_factory()
    lf = tmp_path / "wrong.py"
    lf.write_text("from locust import task\n"
                  "from vllm_load.plugin.load.users import LLMUser\n\n"
                  "class Mine(LLMUser):\n"
                  "    @task\n"
                  "    def ask(self):\n"
                  "        self.llm.chat('hello there')\n")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(lf), "--headless", "-u", "4", "-r", "4", "-t", "4s", "--host", emu.url,
                          "--run-dir", str(run_dir)], cwd=tmp_path, judge_trust=True)
    assert res.returncode == 4, res.stdout[-3000:]  # it measured nothing: invalid comes first
    assert "RUN INVALID: no request completed" in res.stdout
    assert "exit code 5" not in res.stdout and "add workers" not in res.stdout, res.stdout[-3000:]
    client = summary_of(run_dir)["summary"]["client"]
    # late or not (a busy host makes it so), never blamed on the client's capacity: the task is named
    assert not client["saturated"] or (client["cause"] == "user_error" and "in ask (wrong.py:7)" in client["advice"])
    assert "UNTRUSTWORTHY RUN: exit code" not in res.stdout


def test_an_invalid_and_untrustworthy_run_states_one_exit_code_everywhere(tmp_path):
    """The console, summary.md and the report say the exit code the process ends with (they said 5, it exited 4)."""
    from vllm_load.metrics.stats import LLMStats
    from vllm_load.metrics.summary_parts import ClientVerdict
    from vllm_load.metrics.judge.verdict import judge
    from vllm_load.report.results import render_validity, summary_markdown

    late = {"saturated": True, "reasons": ["local: event loop lagged 300 ms"], "cause": "client", "advice": "x"}
    summary = LLMStats().summary(duration=1.0).replace(client=ClientVerdict(late)).to_json()
    verdict = judge(summary, [], None, 1, False, 0)
    assert verdict.exit_code == 4 and verdict.invalid and not verdict.trust.passed
    said = render_validity(verdict) + summary_markdown(summary, verdict, "t")
    assert "exit code 5" not in said and "UNTRUSTWORTHY RUN too (exit code 4" in said
    alone = judge(summary, [], None, 0, False, 0)  # --min-requests 0: only the trust fails
    assert alone.exit_code == 5 and "UNTRUSTWORTHY RUN: exit code 5" in render_validity(alone)


def test_summary_md_shows_a_servers_words_as_text_not_as_html_or_table_cells():
    """A server's error text went into summary.md raw: a ``<script>`` in it was HTML to any Markdown viewer, a ``|``
    split the SLO table's row, and backticks could close the table's fence."""
    from vllm_load.metrics.judge.slo import parse_slo_option
    from vllm_load.metrics.stats import LLMStats
    from vllm_load.metrics.judge.verdict import judge
    from vllm_load.report.results import summary_markdown

    summary = LLMStats().summary(duration=1.0).to_json()
    summary["error_examples"] = {"x": "HTTP 500: <script>alert(1)</script> | ```"}
    verdict = judge(summary, parse_slo_option(["error_rate<=0"]), None, 0, True, 0)
    md = summary_markdown(summary, verdict, "run <b>1</b>")
    assert "<script>" not in md and "<b>" not in md and "# run &lt;b&gt;1&lt;/b&gt;" in md
    for line in md.splitlines():
        if line.startswith("| `"):
            assert line.count(" | ") == 2, line  # three cells, whatever the detail says
