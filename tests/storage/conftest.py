"""What the storage tests share: a PostgreSQL server of their own.

Without a server the tests that use it skip, saying why, unless AUTOTUNE_REQUIRE_POSTGRES=1
(.ci/run sets it): then they fail."""

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REQUIRED = os.environ.get("AUTOTUNE_REQUIRE_POSTGRES") == "1"


def _unavailable(reason: str):
    if REQUIRED:
        pytest.fail(f"AUTOTUNE_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(f"no PostgreSQL server for these tests: {reason}")


def _pg_bin() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parts[4]) if Path(p).parts[4].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of its own on 127.0.0.1 (trust auth: a throw-away test server),
    with a database ``autotune``; yields its URL, and stops and removes it after the session
    (one server for every test: each names its studies apart)."""
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        _unavailable("psycopg2 is not installed (pip install 'autotune[postgres]')")
    pg = _pg_bin()
    if pg is None:
        _unavailable(
            "PostgreSQL's binaries (initdb, pg_ctl) are not installed (apt-get install postgresql)"
        )
    as_postgres = []
    folder = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    if os.geteuid() == 0:  # the server refuses to run as root
        as_postgres = ["runuser", "-u", "postgres", "--"]
        try:
            shutil.chown(folder, "postgres")
        except (LookupError, OSError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            _unavailable(f"no user postgres to run the server as ({exc})")
    from autotune.execution.runner import free_port

    port, data = free_port(), folder / "data"

    def run(*argv):
        return subprocess.run(
            [*as_postgres, *map(str, argv)], capture_output=True, text=True, timeout=120
        )

    started = False
    try:
        steps = [
            (pg / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"),
            (
                pg / "pg_ctl",
                "-D",
                data,
                "-l",
                folder / "server.log",
                "-w",
                "-o",
                f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off",
                "start",
            ),
            (pg / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "autotune"),
        ]
        for step in steps:
            done = run(*step)
            started = started or step[0].name == "pg_ctl"
            if done.returncode:
                log = folder / "server.log"
                _unavailable(
                    f"{step[0].name} failed: {(done.stderr or done.stdout)[-800:]}"
                    + (log.read_text()[-800:] if log.exists() else "")
                )
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/autotune"
    finally:
        if started:
            run(pg / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)
