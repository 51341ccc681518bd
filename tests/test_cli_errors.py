"""Expected faults, through the real console script and the app: a bad Redis URL is refused
when the app is made, and every command with Redis out of reach says so in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import conveyor
from conveyor.urls import ACCEPTED, check_url, public_url
from helpers import env_with_src, free_port

CONVEYOR = str(Path(sys.executable).with_name("conveyor"))
TESTS = Path(__file__).parent


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = env_with_src()
    full.pop("CONVEYOR_REDIS_URL", None)
    full.update(env)
    return subprocess.run([CONVEYOR, *args], env=full, capture_output=True, text=True,
                          timeout=60, cwd=TESTS)


BAD_URLS = [
    ("localhost:6411", "no scheme"),
    ("127.0.0.1:6379", "no scheme"),
    ("http://127.0.0.1:6379/0", "scheme 'http://' is not supported"),
    ("redis//127.0.0.1:6379", "no scheme"),
    ("redis://127.0.0.1:notaport/0", "port 'notaport' is not a number"),
    ("redis://127.0.0.1:70000/0", "port '70000' is not a number"),
    ("redis://127.0.0.1:6379/zero", "database 'zero' is not a number"),
    ("redis:///0", "no host"),
    ("unix://", "no socket path"),
    ("redis+sentinel://s1/mymaster", "is not host:port"),
]


@pytest.mark.parametrize(("url", "why"), BAD_URLS)
def test_a_bad_url_is_refused_when_the_app_is_made(url: str, why: str) -> None:
    with pytest.raises(conveyor.ConfigurationError) as caught:
        conveyor.Conveyor(url)
    assert why in str(caught.value)
    if "sentinel" not in url:
        assert ACCEPTED in str(caught.value)


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0", "redis://localhost", "rediss://user:pw@host:6380/1",
    "unix:///tmp/redis.sock", "redis+cluster://10.0.0.1:7000/0", "redis://[::1]:6379/0",
    "redis+sentinel://s1:26379,s2:26379/mymaster/0", "rediss+sentinel://s1:26379/main",
])
def test_good_urls_are_accepted(url: str) -> None:
    assert check_url(url) == url
    assert conveyor.Conveyor(url).url == url


def test_passwords_never_show() -> None:
    assert public_url("redis://:s3cret@host:1/0") == "redis://:***@host:1/0"
    assert public_url("rediss://ann:s3cret@host:1/0") == "rediss://ann:***@host:1/0"
    assert public_url("redis://host:1/0") == "redis://host:1/0"
    assert "s3cret" not in repr(conveyor.Conveyor("redis://ann:s3cret@host:1/0"))


@pytest.mark.parametrize(("url", "why"), BAD_URLS[:3])
def test_a_command_with_a_bad_url_says_so_in_one_line(url: str, why: str) -> None:
    done = run("info", "--url", url)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and why in done.stderr
    assert "Traceback" not in done.stderr


COMMANDS = [
    ("info",), ("stats",), ("stats", "--json"), ("dead", "list", "cli"),
    ("dead", "purge", "cli", "--yes"), ("job", "cli~abc"), ("advice", "cli"),
    ("cancel", "cli~abc"), ("workflow", "wf~abc"), ("dead", "requeue", "cli", "--yes"),
    ("pause", "cli"), ("resume", "cli"),
    ("top", "-n", "1"), ("limits", "cli"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_every_command_with_redis_down_says_so_in_one_line(args: tuple[str, ...]) -> None:
    url = f"redis://:topsecret@127.0.0.1:{free_port()}/0"  # nothing listens there
    done = run(*args, CONVEYOR_REDIS_URL=url)
    assert done.returncode == 1, done.stderr
    shown = url.replace("topsecret", "***")
    assert done.stderr.strip() == (
        f"Error: cannot reach Redis at {shown}: connection refused; check that redis-server"
        " is running and listens there (pass --url or --app, or set CONVEYOR_REDIS_URL)")


def test_an_app_with_redis_down_is_named_by_its_url() -> None:
    port = free_port()
    done = run("info", "--app", "apps.cli_app:app",
               CONVEYOR_REDIS_URL=f"redis://127.0.0.1:{port}/0")
    assert done.returncode == 1
    assert f"cannot reach Redis at redis://127.0.0.1:{port}/0" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_host_is_named() -> None:
    done = run("info", "--url", "redis://no-such-host.invalid:6379/0")
    assert done.returncode == 1 and "unknown host; check the host name" in done.stderr
