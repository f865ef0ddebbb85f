"""The results store on a real PostgreSQL (Debian's postgresql, started once for this module as an unprivileged user
on a free port of 127.0.0.1, its data in a temporary folder, stopped at the end): the same schema and answers as
SQLite, two writers at once losing nothing, a killed writer leaving nothing, runs recording themselves and gating on
their baseline there, its password never shown, and the Grafana dashboard's queries returning the series."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import ROOT, free_port, run_in_process, stop_process, wait_for
from tests.test_results_store import WRITER, kill_a_writer_mid_run, rec
from vllm_load.history.baseline import select
from vllm_load.history.cli import main as history
from vllm_load.history.store import Store

#: a real server, as the real vLLM's and the router's tests; on the quiet cores, as the gate test's baseline runs
#: must be trusted ones (on a busy host the embedded emulator falls behind and every run is rightly distrusted)
pytestmark = [pytest.mark.slow, pytest.mark.quiet_cores]
CHAT = str(ROOT / "locustfiles" / "chat.py")
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "vllm-load-history.json"


def _bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:  # CI installs it (.ci/run); a developer without it gets this, not a skip
        pytest.fail("PostgreSQL is not installed: apt-get install postgresql (as .ci/run does)")
    return Path(found[-1]).parent


def _as_postgres():
    """The server as the unprivileged postgres user when the tests run as root (it refuses root), dying with us."""
    user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    def become() -> None:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it dies with the test process
        if user is not None:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
    return become, user


@pytest.fixture(scope="module")
def pg():
    """A PostgreSQL server: yields its URL (no password in it) with PGPASSWORD set for this module's tests."""
    bindir = _bin()
    become, user = _as_postgres()
    folder = Path(tempfile.mkdtemp(prefix="vllm-load-pg-"))
    data, pwfile = folder / "data", folder / "pw"
    password = "pg-" + secrets.token_hex(12)
    pwfile.write_text(password + "\n")
    if user is not None:
        for p in (folder, pwfile):
            os.chown(p, user.pw_uid, user.pw_gid)
    subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "vllm_load", "--pwfile", str(pwfile),
                    "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8"], preexec_fn=become, check=True,
                   capture_output=True, timeout=120)
    port = free_port()
    server = subprocess.Popen([str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1",
                               "-k", str(folder), "-c", "fsync=off"], preexec_fn=become, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    saved = os.environ.get("PGPASSWORD")
    os.environ["PGPASSWORD"] = password
    url = f"postgresql://vllm_load@127.0.0.1:{port}/postgres"
    try:
        import psycopg

        def ready() -> bool:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else "exited"
                return False
        wait_for(ready, 60, "PostgreSQL accepting connections")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE history")
        yield {"url": url.rsplit("/", 1)[0] + "/history", "password": password, "port": port}
    finally:
        if saved is None:
            os.environ.pop("PGPASSWORD", None)
        else:
            os.environ["PGPASSWORD"] = saved
        stop_process(server)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def db(pg):
    """A database of its own for one test (the server is the module's)."""
    import psycopg

    name = "t" + secrets.token_hex(6)
    admin = pg["url"].rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return pg["url"].rsplit("/", 1)[0] + "/" + name


def _fill(store: Store) -> None:
    for i in range(8):
        store.record(rec(f"r{i}", 100.0 + i, fp="fpA" if i % 4 else "fpB", ttft=0.1 + 0.01 * (i >= 5),
                         labels={"commit": f"c{i}", "branch": "main" if i % 2 else "dev"}, trusted=int(i != 6)))


def test_the_same_schema_and_answers_on_postgresql_as_on_sqlite(db, tmp_path):
    with Store.open(db) as pgs, Store.open(str(tmp_path / "h.sqlite")) as lite:
        assert pgs.postgres and not lite.postgres
        for store in (pgs, lite):
            _fill(store)
            assert not store.record(rec("r1", 101.0))  # a run twice is one row on both
        for query in (lambda s: s.runs(), lambda s: s.runs("fpA", {"branch": "main"}, since=102.0),
                      lambda s: s.runs(newest_first=True, limit=3, trusted_only=True),
                      lambda s: s.series("ttft", "p99", "fpA"), lambda s: s.windows(["r1", "r2"], "ttft"),
                      lambda s: select(s, "last 3", "fpA", 200.0, "r7").runs, lambda s: s.summary("r3")):
            assert query(pgs) == query(lite)


def test_two_masters_ending_together_lose_nothing_on_postgresql(db):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, db, str(first), "120", "30"], cwd=ROOT, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for first in (0, 1000)]
    assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    news = [json.loads(p.communicate(timeout=120)[0])["new"] for p in procs]
    assert sum(news) == 270 and min(news) >= 120
    with Store.open(db) as store:
        assert store.count() == 270 and store.execute("SELECT COUNT(*) FROM metrics").fetchone()[0] == 270 * 3


def test_a_killed_writer_leaves_no_part_of_its_run_on_postgresql(db):
    kill_a_writer_mid_run(db)
    with Store.open(db) as store:
        assert [r["run_id"] for r in store.runs()] == ["before"]
        assert store.execute("SELECT COUNT(*) FROM labels WHERE run_id = %s", ("killed",)).fetchone()[0] == 0
        assert store.record(rec("after", 6.0))


def test_runs_record_themselves_in_postgresql_and_gate_on_their_baseline(db, pg, tmp_path):
    args = ["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "2s", "--results-db", db]
    for i in range(3):
        res = run_in_process([*args, "--label", f"commit=c{i}"], tmp_path)
        assert res.code == 0 and " recorded in postgresql://127.0.0.1:" in res.stdout, res.stdout + res.stderr
    res = run_in_process([*args, "--baseline", "last 3", "--slo", "ttft.p99<=baseline*1.5"], tmp_path)
    assert res.code == 0, res.stdout + res.stderr
    run_dir = tmp_path / res.run_dir  # relative to the run's folder
    data = json.loads((run_dir / "summary.json").read_text())
    check = data["slo"][0]
    with Store.open(db) as store:
        first_three = [r["run_id"] for r in store.runs(newest_first=True)][1:]
        assert store.count() == 4
    assert check["passed"] and "median of 3 runs: " + ", ".join(first_three) in check["detail"]
    assert data["baseline_runs"] == first_three
    shown = res.stdout + res.stderr + "".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file())
    assert pg["password"] not in shown


def test_a_wrong_password_is_one_line_without_it(db, pg, capsys, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "wrong-" + pg["password"])
    assert history(["--results-db", db, "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "password authentication failed" in err and pg["password"] not in err


def _grafana(sql: str, values: dict[str, str], since: float, until: float) -> str:
    """A panel's SQL as Grafana's PostgreSQL data source sends it: ``$__unixEpochFilter(col)`` is ``col >= FROM AND
    col <= TO`` in epoch seconds, ``$name`` and ``${name}`` the variables' values."""
    sql = re.sub(r"\$__unixEpochFilter\(([^)]+)\)", lambda m: f"{m.group(1)} >= {since} AND {m.group(1)} <= {until}",
                 sql)
    assert "$__" not in sql, sql  # a macro this expansion does not know
    return re.sub(r"\$\{?([a-z_]+)\}?", lambda m: values[m.group(1)], sql)


def test_the_grafana_dashboards_queries_return_the_series(db):
    import psycopg

    with Store.open(db) as store:
        _fill(store)
    dash = json.loads(DASHBOARD.read_text())
    values = {"fingerprint": "fpA", "metric": "ttft", "stat": "p99", "label": "branch", "datasource": ""}
    with psycopg.connect(db) as conn:
        for var in dash["templating"]["list"]:
            if var["type"] == "query":
                found = [r[0] for r in conn.execute(_grafana(var["query"], values, 0, 1e12)).fetchall()]
                assert values[var["name"]] in found, var["name"]
        results = {}
        for panel in dash["panels"]:
            for t in panel["targets"]:
                assert t["datasource"]["type"] == "grafana-postgresql-datasource"
                rows = conn.execute(_grafana(t["rawSql"], values, 100.0, 200.0)).fetchall()
                results[(panel["id"], t["refId"])] = rows
    # fpA's runs r1, r2, r3, r5, r6, r7; r6 untrusted, drawn apart; r5 on were 10 ms slower
    assert [round(r[1], 3) for r in results[(1, "A")]] == [0.1, 0.1, 0.1, 0.11, 0.11]
    assert [round(r[1], 3) for r in results[(1, "B")]] == [0.11]
    assert sorted({r[1] for r in results[(2, "A")]}) == ["dev", "main"] and len(results[(2, "A")]) == 5
    assert [r[0] for r in results[(4, "A")]] == [f"r{i}" for i in range(7, -1, -1)]
    assert results[(4, "A")][0][7] == "branch=main commit=c7"
