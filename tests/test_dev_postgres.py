"""`./dev setup` and `./dev test` install Debian's postgresql for the lake tests when its
server binaries are missing and apt-get may run as root, with the package's own cluster
kept from starting; otherwise one line says what to install. Run here on stand-ins for id,
sudo, apt-get and the system's folders, so nothing is installed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.graphs import REPO

BASICS = ("env", "cat", "sed", "dirname", "sort", "sh", "chmod", "rm", "mkdir", "printf")


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def postgres_step(tmp_path, *, uid: int, sudo: str | None, apt: str | None,
                  installed: bool = False, policy: str | None = None,
                  pg_config: bool = False) -> tuple[int, str, list[str]]:
    """(status, output, apt-get command lines) of `./dev postgres` on stand-in commands; the
    stand-in apt-get logs whether a policy-rc.d forbade starting services while it ran, and
    an install that succeeds puts initdb and pg_ctl under the stand-in's lib folder."""
    bin_dir, log = tmp_path / "bin", tmp_path / "apt.log"
    lib, rc_d = tmp_path / "postgresql", tmp_path / "policy-rc.d"
    bin_dir.mkdir(exist_ok=True)
    stub(bin_dir, "id", f"echo {uid}")
    if sudo is not None:
        stub(bin_dir, "sudo", sudo)
    if apt is not None:
        stub(bin_dir, "apt-get", f'echo "$@" >> {log}\n'
             f'if [ "$1" = install ] && [ -x {rc_d} ]; then\n'
             f'  {rc_d}; echo "policy $?" >> {log}\nfi\n{apt}')
    if installed or pg_config:
        where = tmp_path / "pg-bin" if pg_config else lib / "15" / "bin"
        where.mkdir(parents=True, exist_ok=True)
        stub(where, "initdb", "true")
        stub(where, "pg_ctl", "true")
        if pg_config:
            stub(bin_dir, "pg_config", f"echo {where}")
    if policy is not None:
        stub(tmp_path, "policy-rc.d", policy)
    # only the stand-ins and the shell's basics: no real sudo, apt-get or pg_config
    basics = tmp_path / "basics"
    basics.mkdir(exist_ok=True)
    for tool in BASICS:
        real = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                              text=True).stdout.strip()
        if real.startswith("/") and not (basics / tool).exists():
            (basics / tool).symlink_to(real)
    env = {"PATH": f"{bin_dir}:{basics}", "HOME": str(tmp_path),
           "SEMBACK_POSTGRES_LIB": str(lib), "SEMBACK_POLICY_RC_D": str(rc_d)}
    bash = subprocess.run(["sh", "-c", "command -v bash"], capture_output=True,
                          text=True).stdout.strip()
    done = subprocess.run([bash, str(REPO / "dev"), "postgres"], env=env,
                          capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout + done.stderr, calls


# the stand-in apt-get's install: the binaries appear where Debian puts them
INSTALLS = ('[ "$1" = install ] || exit 0\nbin="$(dirname "$0")/../postgresql/15/bin"\n'
            'mkdir -p "$bin"\nfor f in initdb pg_ctl; do printf "#!/bin/sh\\n" > "$bin/$f"; '
            'chmod 755 "$bin/$f"; done\nexit 0')


def test_as_root_postgresql_is_installed_with_its_cluster_kept_from_starting(tmp_path):
    code, output, calls = postgres_step(tmp_path, uid=0, sudo=None, apt=INSTALLS)
    assert code == 0, output
    assert calls == ["update -qq", "install -y -qq postgresql", "policy 101"]
    assert output.strip() == ("installing Debian's postgresql for the lake tests "
                              "(apt-get install postgresql)")
    assert not (tmp_path / "policy-rc.d").exists()  # ours, removed afterwards
    assert (tmp_path / "postgresql" / "15" / "bin" / "initdb").exists()


def test_with_passwordless_sudo_apt_get_runs_under_sudo(tmp_path):
    code, output, calls = postgres_step(
        tmp_path, uid=1000, sudo='[ "$1" = -n ] && shift; [ "$#" -eq 1 ] && exit 0; exec "$@"',
        apt=INSTALLS)
    assert code == 0, output
    assert calls == ["update -qq", "install -y -qq postgresql", "policy 101"]
    assert not (tmp_path / "policy-rc.d").exists()


def test_a_policy_already_there_is_left_as_it_is(tmp_path):
    code, output, calls = postgres_step(tmp_path, uid=0, sudo=None, apt=INSTALLS,
                                        policy="exit 101 # the image's")
    assert code == 0 and calls == ["update -qq", "install -y -qq postgresql", "policy 101"]
    assert (tmp_path / "policy-rc.d").read_text().endswith("exit 101 # the image's\n")


@pytest.mark.parametrize(("uid", "sudo", "apt"), [
    (1000, "exit 1", "exit 0"),  # sudo asks for a password
    (1000, None, "exit 0"),  # no sudo at all
    (0, None, None),  # root, but not Debian: no apt-get
])
def test_without_permission_one_line_says_what_to_install(tmp_path, uid, sudo, apt):
    code, output, calls = postgres_step(tmp_path, uid=uid, sudo=sudo, apt=apt)
    assert code == 0 and calls == []
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1
    assert "lake tests will be skipped" in lines[0]
    assert "apt-get install postgresql" in lines[0]


@pytest.mark.parametrize(("apt", "ran"), [
    ("exit 100", ["update -qq"]),  # apt-get fails
    ('[ "$1" = install ] && exit 100; exit 0', ["update -qq", "install -y -qq postgresql"]),
    ("exit 0", ["update -qq", "install -y -qq postgresql"]),  # installs no server binaries
])
def test_a_failed_install_says_so_in_one_line_and_removes_the_policy(tmp_path, apt, ran):
    code, output, calls = postgres_step(tmp_path, uid=0, sudo=None, apt=apt)
    assert code == 0 and [c for c in calls if not c.startswith("policy")] == ran
    assert output.splitlines()[-1].startswith("note: apt-get could not install postgresql")
    assert not (tmp_path / "policy-rc.d").exists()


@pytest.mark.parametrize("where", ["lib", "pg_config"])
def test_installed_server_binaries_are_left_alone(tmp_path, where):
    code, output, calls = postgres_step(tmp_path, uid=0, sudo=None, apt="exit 0",
                                        installed=where == "lib",
                                        pg_config=where == "pg_config")
    assert code == 0 and calls == [] and output == ""


def test_both_readme_commands_take_the_postgres_step():
    dev = (REPO / "dev").read_text()
    for command in ("setup", "test"):
        assert re.search(rf"\n  {command}\)\n    setup\n    setup_browser\n    setup_postgres"
                         r"( ;;)?\n", dev), command
