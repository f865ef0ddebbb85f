"""The results store: one schema on SQLite (the embedded default, a file beside the runs) and on PostgreSQL (a
team's, ``--results-db postgresql://…``), written one run at a time, atomically and idempotently.

Why SQLite for the embedded store, not DuckDB: it ships with Python (no dependency), and two masters ending at once
both write (SQLite's writers queue on the file's lock, with a timeout; DuckDB lets one process open a file for
writing and fails the other). The reads a history needs (a few metrics of a few thousand runs) are an index's,
not a column store's.

A run is one transaction: its row, labels, metrics, SLO results and windows land together or not at all (a
writer killed mid-run leaves nothing), and a run recorded twice is one row (``INSERT … ON CONFLICT DO NOTHING``:
the second writer's transaction finds the row and writes nothing). The schema carries its version; a store of an
older version is migrated on open, one of a newer version refused with one line."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.features import history
from vllm_load.redact import redact_urls

#: this release's schema; ``MIGRATIONS[v]`` takes a store from v-1 to v
SCHEMA_VERSION = 1
#: the embedded store's file, under the reports folder
DEFAULT_FILE = "history.sqlite"
#: how long a writer waits for another's transaction (SQLite's lock; PostgreSQL's row lock waits anyway)
BUSY_TIMEOUT_S = 60.0

_TABLES = (
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, started DOUBLE PRECISION NOT NULL, ended DOUBLE PRECISION NOT NULL,
        recorded DOUBLE PRECISION NOT NULL, fingerprint TEXT NOT NULL, target_kind TEXT NOT NULL,
        model TEXT NOT NULL, server_version TEXT NOT NULL, trusted INTEGER NOT NULL, valid INTEGER NOT NULL,
        exit_code INTEGER NOT NULL, verdict TEXT NOT NULL, requests INTEGER NOT NULL, report TEXT NOT NULL,
        load TEXT NOT NULL)""",
    # a run's files as it wrote them, apart from its row: a listing or a series never reads past a row's first page
    """CREATE TABLE IF NOT EXISTS run_files (
        run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE, config TEXT NOT NULL,
        summary TEXT NOT NULL, stats TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS labels (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE, key TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (run_id, key))""",
    """CREATE TABLE IF NOT EXISTS metrics (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE, metric TEXT NOT NULL, stat TEXT NOT NULL,
        value DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, metric, stat))""",
    """CREATE TABLE IF NOT EXISTS slo_results (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE, slo TEXT NOT NULL, passed INTEGER NOT NULL,
        value DOUBLE PRECISION, detail TEXT NOT NULL, PRIMARY KEY (run_id, slo))""",
    """CREATE TABLE IF NOT EXISTS windows (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE, metric TEXT NOT NULL,
        t_s DOUBLE PRECISION NOT NULL, value DOUBLE PRECISION NOT NULL, count INTEGER NOT NULL,
        PRIMARY KEY (run_id, metric, t_s))""",
    "CREATE INDEX IF NOT EXISTS runs_by_fingerprint ON runs (fingerprint, started)",
    "CREATE INDEX IF NOT EXISTS runs_by_start ON runs (started)",
    "CREATE INDEX IF NOT EXISTS metrics_by_name ON metrics (metric, stat)",
    "CREATE INDEX IF NOT EXISTS labels_by_key ON labels (key, value)",
)
MIGRATIONS: dict[int, tuple[str, ...]] = {1: _TABLES}
_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS vllm_load_schema (version INTEGER NOT NULL)"
#: the columns of ``runs``, in order (a record's ``row``)
RUN_COLUMNS = ("run_id", "started", "ended", "recorded", "fingerprint", "target_kind", "model", "server_version",
               "trusted", "valid", "exit_code", "verdict", "requests", "report", "load")
#: the columns of ``run_files``: config.json, summary.json and llm_stats.json as the run wrote them
FILE_COLUMNS = ("config", "summary", "stats")
#: what the listing reads of a run
LISTED = RUN_COLUMNS


@dataclass(frozen=True)
class RunRecord:
    """One run as the store keeps it (built by ``record.of_run_dir``)."""

    row: dict[str, Any]  # RUN_COLUMNS and FILE_COLUMNS
    labels: dict[str, str] = field(default_factory=dict)
    metrics: list[tuple[str, str, float]] = field(default_factory=list)  # (metric, stat, value)
    slos: list[tuple[str, bool, float | None, str]] = field(default_factory=list)  # (slo, passed, value, detail)
    windows: list[tuple[str, float, float, int]] = field(default_factory=list)  # (metric, t_s, median, count)

    @property
    def run_id(self) -> str:
        return str(self.row["run_id"])


def _sqlite_file(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url)


def describe(url: str) -> str:
    """The store as said on the console and in logs: a PostgreSQL URL without its credentials; a file under the
    working folder by its path from there, as the report's path is said (the embedded store is kept by its
    absolute path, and a README run printed a temporary folder's)."""
    if history.is_postgres(url):
        return redact_urls(url)
    path = _sqlite_file(url)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def check_url(url: str) -> None:
    """Refuse a store the run could not write, before the run: one line (exit 2)."""
    history.check_url(url)
    if history.is_postgres(url):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise UsageError("--results-db postgresql://… needs psycopg: pip install 'vllm-load[postgres]'") from None
        return
    parent = _sqlite_file(url).resolve().parent
    if parent.exists() and not os.access(parent, os.W_OK):
        raise UsageError(f"--results-db {url}: its folder {parent} is not writable")


class Store:
    """An open store. ``with Store.open(url) as store: store.record(rec)``."""

    def __init__(self, conn: Any, postgres: bool, url: str) -> None:
        self.conn, self.postgres, self.url = conn, postgres, url

    @classmethod
    def open(cls, url: str) -> Store:
        check_url(url)
        if history.is_postgres(url):
            import psycopg

            try:
                conn: Any = psycopg.connect(url, connect_timeout=10)
            except psycopg.Error as exc:  # its message names host and user, never the password
                raise UsageError(f"cannot open the results store {describe(url)}: "
                                 f"{str(exc).strip().splitlines()[0]}") from None
            store = cls(conn, True, url)
        else:
            path = _sqlite_file(url)
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA foreign_keys=ON")
            except sqlite3.Error as exc:
                raise UsageError(f"cannot open the results store {path}: {exc}") from None
            store = cls(conn, False, url)
        store._migrate()
        return store

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def _sql(self, text: str) -> str:
        return text if self.postgres else text.replace("%s", "?")

    def execute(self, text: str, params: Sequence[Any] = ()) -> Any:
        cur = self.conn.cursor()
        cur.execute(self._sql(text), tuple(params))
        return cur

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction; SQLite's takes the write lock at once (``BEGIN IMMEDIATE``), so that two writers queue
        instead of one failing at its first write."""
        if self.postgres:
            with self.conn.transaction():
                yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def version(self) -> int:
        row = self.execute("SELECT MAX(version) FROM vllm_load_schema").fetchone()
        return int(row[0] or 0)

    def _migrate(self) -> None:
        """Create the tables, or bring an older store up to this release's schema, in one transaction (two
        processes opening a new store at once: the second waits, then finds it made)."""
        with self.transaction():
            if self.postgres:  # PostgreSQL's DDL does not queue on a row: one lock for the whole migration
                self.execute("SELECT pg_advisory_xact_lock(7301)")
            self.execute(_VERSION_TABLE)
            found = self.version()
            if found > SCHEMA_VERSION:
                raise UsageError(f"the results store {describe(self.url)} has schema {found}, newer than this "
                                 f"vllm-load's {SCHEMA_VERSION}: upgrade vllm-load to write to it")
            for v in range(found + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[v]:
                    self.execute(statement)
                self.execute("INSERT INTO vllm_load_schema (version) VALUES (%s)", (v,))

    def record(self, rec: RunRecord) -> bool:
        """Write one run; False when it was there already (nothing written)."""
        with self.transaction():
            cols = ", ".join(RUN_COLUMNS)
            cur = self.execute(f"INSERT INTO runs ({cols}) VALUES ({', '.join(['%s'] * len(RUN_COLUMNS))}) "
                               "ON CONFLICT (run_id) DO NOTHING", [rec.row[c] for c in RUN_COLUMNS])
            if cur.rowcount == 0:
                return False
            rid = rec.run_id
            self.execute("INSERT INTO run_files (run_id, config, summary, stats) VALUES (%s, %s, %s, %s)",
                         [rid, *(rec.row[c] for c in FILE_COLUMNS)])
            self._many("INSERT INTO labels (run_id, key, value) VALUES (%s, %s, %s)",
                       [(rid, k, v) for k, v in sorted(rec.labels.items())])
            self._many("INSERT INTO metrics (run_id, metric, stat, value) VALUES (%s, %s, %s, %s)",
                       [(rid, *m) for m in rec.metrics])
            self._many("INSERT INTO slo_results (run_id, slo, passed, value, detail) VALUES (%s, %s, %s, %s, %s)",
                       [(rid, s, int(p), v, d) for s, p, v, d in rec.slos])
            self._many("INSERT INTO windows (run_id, metric, t_s, value, count) VALUES (%s, %s, %s, %s, %s)",
                       [(rid, *w) for w in rec.windows])
        return True

    def _many(self, text: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            self.conn.cursor().executemany(self._sql(text), rows)

    def count(self, fingerprint: str = "") -> int:
        """The runs in the store (``fingerprint``: of that load only)."""
        where, params = self._where(fingerprint, None, 0.0, 0.0)
        return int(self.execute(f"SELECT COUNT(*) FROM runs{where}", params).fetchone()[0])

    def runs(self, fingerprint: str = "", labels: dict[str, str] | None = None, since: float = 0.0,
             until: float = 0.0, limit: int = 0, newest_first: bool = False, trusted_only: bool = False,
             run_id: str = "") -> list[dict[str, Any]]:
        """Runs (``LISTED`` columns and their labels), oldest first unless ``newest_first``."""
        where, params = self._where(fingerprint, labels, since, until)
        for column, wanted in (("trusted", 1 if trusted_only else None), ("run_id", run_id or None)):
            if wanted is not None:
                where += (" AND " if where else " WHERE ") + f"runs.{column} = %s"
                params.append(wanted)
        order = "DESC" if newest_first else "ASC"
        text = (f"SELECT {', '.join(LISTED)} FROM runs{where} ORDER BY started {order}, run_id {order}"
                + (f" LIMIT {int(limit)}" if limit else ""))
        rows = [dict(zip(LISTED, r)) for r in self.execute(text, params).fetchall()]
        found = self._labels([r["run_id"] for r in rows])
        for r in rows:
            r["labels"] = found.get(r["run_id"], {})
        return rows

    def _where(self, fingerprint: str, labels: dict[str, str] | None, since: float,
               until: float) -> tuple[str, list[Any]]:
        clauses, params = [], []  # type: tuple[list[str], list[Any]]
        if fingerprint:
            clauses.append("runs.fingerprint = %s")
            params.append(fingerprint)
        for k, v in sorted((labels or {}).items()):
            clauses.append("EXISTS (SELECT 1 FROM labels l WHERE l.run_id = runs.run_id AND l.key = %s AND "
                           "l.value = %s)")
            params += [k, v]
        if since:
            clauses.append("runs.started >= %s")
            params.append(since)
        if until:
            clauses.append("runs.started <= %s")
            params.append(until)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

    def _labels(self, run_ids: list[str]) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for i in range(0, len(run_ids), 500):  # bounded IN lists
            chunk = run_ids[i:i + 500]
            text = f"SELECT run_id, key, value FROM labels WHERE run_id IN ({', '.join(['%s'] * len(chunk))})"
            for rid, k, v in self.execute(text, chunk).fetchall():
                out.setdefault(rid, {})[k] = v
        return out

    def series(self, metric: str, stat: str, fingerprint: str = "", labels: dict[str, str] | None = None,
               since: float = 0.0, until: float = 0.0) -> list[dict[str, Any]]:
        """One metric's value per run, oldest first, with each run's trust (for the change points and the page)."""
        where, params = self._where(fingerprint, labels, since, until)
        join = " AND " if where else " WHERE "
        text = ("SELECT runs.run_id, runs.started, runs.trusted, runs.valid, runs.exit_code, runs.report, "
                f"metrics.value FROM runs JOIN metrics ON metrics.run_id = runs.run_id{where}{join}"
                "metrics.metric = %s AND metrics.stat = %s ORDER BY runs.started, runs.run_id")
        cols = ("run_id", "started", "trusted", "valid", "exit_code", "report", "value")
        return [dict(zip(cols, r)) for r in self.execute(text, [*params, metric, stat]).fetchall()]

    def windows(self, run_ids: list[str], metric: str) -> dict[str, list[float]]:
        """Each run's window medians of ``metric`` (its spread within the run: the interval the page draws)."""
        out: dict[str, list[float]] = {}
        for i in range(0, len(run_ids), 500):
            chunk = run_ids[i:i + 500]
            text = (f"SELECT run_id, value FROM windows WHERE metric = %s AND run_id IN "
                    f"({', '.join(['%s'] * len(chunk))}) ORDER BY run_id, t_s")
            for rid, v in self.execute(text, [metric, *chunk]).fetchall():
                out.setdefault(rid, []).append(float(v))
        return out

    def summary(self, run_id: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A run's summary.json and config.json as recorded (the baseline re-reads any metric from them)."""
        import json

        row = self.execute("SELECT summary, config FROM run_files WHERE run_id = %s", (run_id,)).fetchone()
        return (json.loads(row[0]), json.loads(row[1])) if row else None
