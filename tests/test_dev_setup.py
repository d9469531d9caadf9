"""`./dev setup` and `./dev test` install Debian's chromium for the browser tests when it is
missing and apt-get may run as root; otherwise one line says what to install. Run here on
stand-ins for id, sudo and apt-get, so nothing is installed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.graphs import REPO


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def browser_step(tmp_path, *, uid: int, sudo: str | None, apt: str | None,
                 chromium_exists: bool = False) -> tuple[int, str, list[str]]:
    """(status, output, apt-get command lines) of `./dev browser` on stand-in commands."""
    bin_dir, log = tmp_path / "bin", tmp_path / "apt.log"
    bin_dir.mkdir(exist_ok=True)
    stub(bin_dir, "id", f"echo {uid}")
    if sudo is not None:
        stub(bin_dir, "sudo", sudo)
    if apt is not None:
        stub(bin_dir, "apt-get", f'echo "$@" >> {log}\n{apt}')
    chromium = tmp_path / "chromium"
    if chromium_exists:
        stub(tmp_path, "chromium", "true")
    # only the stand-ins and the shell's basics: no real sudo or apt-get is reachable
    basics = tmp_path / "basics"
    basics.mkdir(exist_ok=True)
    for tool in ("env", "cat", "sed", "dirname", "sha256sum", "cut"):
        real = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                              text=True).stdout.strip()
        if real and not (basics / tool).exists():
            (basics / tool).symlink_to(real)
    env = {"PATH": f"{bin_dir}:{basics}", "SEMBACK_CHROMIUM": str(chromium),
           "HOME": str(tmp_path)}
    bash = subprocess.run(["sh", "-c", "command -v bash"], capture_output=True,
                          text=True).stdout.strip()
    done = subprocess.run([bash, str(REPO / "dev"), "browser"], env=env,
                          capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout + done.stderr, calls


def test_as_root_chromium_is_installed_with_apt_get(tmp_path):
    code, output, calls = browser_step(tmp_path, uid=0, sudo=None, apt="exit 0")
    assert code == 0
    assert calls == ["update -qq", "install -y -qq chromium"]
    assert "installing Debian's chromium" in output


def test_with_passwordless_sudo_apt_get_runs_under_sudo(tmp_path):
    code, output, calls = browser_step(
        tmp_path, uid=1000, sudo='[ "$1" = -n ] && shift; [ "$#" -eq 1 ] && exit 0; exec "$@"',
        apt="exit 0")
    assert code == 0 and calls == ["update -qq", "install -y -qq chromium"]


@pytest.mark.parametrize(("uid", "sudo", "apt"), [
    (1000, "exit 1", "exit 0"),  # sudo asks for a password
    (1000, None, "exit 0"),  # no sudo at all
    (0, None, None),  # root, but not Debian: no apt-get
])
def test_without_permission_one_line_says_what_to_install(tmp_path, uid, sudo, apt):
    code, output, calls = browser_step(tmp_path, uid=uid, sudo=sudo, apt=apt)
    assert code == 0 and calls == []
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1
    assert "browser tests will be skipped" in lines[0]
    assert "apt-get install chromium" in lines[0]


def test_a_failed_install_says_so_in_one_line(tmp_path):
    code, output, calls = browser_step(tmp_path, uid=0, sudo=None, apt="exit 100")
    assert code == 0 and calls == ["update -qq"]
    assert output.splitlines()[-1].startswith("note: apt-get could not install chromium")


def test_an_installed_browser_is_left_alone(tmp_path):
    code, output, calls = browser_step(tmp_path, uid=0, sudo=None, apt="exit 0",
                                       chromium_exists=True)
    assert code == 0 and calls == [] and output == ""


def test_ci_runs_the_readme_command_which_sets_up_the_browser():
    ci = (REPO / ".ci" / "run").read_text()
    assert "./dev test" in ci and "apt-get" not in ci
    assert os.access(REPO / "dev", os.X_OK)
    dev = (REPO / "dev").read_text()
    for command in ("setup", "test"):  # both README commands take the browser step
        assert re.search(rf"\n  {command}\)\n    setup\n    setup_browser( ;;)?\n", dev), command


# --- llama-server, built in ./dev setup --------------------------------------------------

STUB_PYTHON = """#!/bin/sh
case "$*" in
  *importlib.metadata*) echo 0.3.36 ;;
  "- "*llama-server)
    echo "check $*" >> "$LOG"
    if [ -n "$CHECK_FAILS" ]; then
      echo "llama-server died on its first request (exit status -4): illegal instruction"
      exit 1
    fi ;;
  *"pip download"*)
    for last; do :; done
    src="$last/src/llama_cpp_python-0.3.36/vendor/llama.cpp"
    mkdir -p "$src" && touch "$src/CMakeLists.txt"
    tar -czf "$last/llama_cpp_python-0.3.36.tar.gz" -C "$last/src" llama_cpp_python-0.3.36
    rm -rf "$last/src"
    echo "$*" >> "$LOG" ;;
esac
exit 0
"""
STUB_CMAKE = """#!/bin/sh
echo "cmake $*" >> "$LOG"
[ -n "$CMAKE_FAILS" ] && exit 1
if [ "$1" = --build ]; then
  mkdir -p "$2/bin" && printf '#!/bin/sh\\n' > "$2/bin/llama-server"
fi
exit 0
"""


PORTABLE_CPU = "fpu sse4_2 avx f16c fma avx2"
AVX512_CPU = PORTABLE_CPU + " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"


def setup_with_stand_ins(tmp_path, fails: bool = False, cpu: str = PORTABLE_CPU,
                         check_fails: bool = False) -> tuple[int, str, list[str]]:
    """(status, output, logged commands) of `./dev setup` in a copy of the repository's
    set-up files, on a stand-in Python (pip, and the built server's check) and cmake, for a
    CPU with the flags `cpu`: nothing is downloaded or built."""
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    for name in ("dev", "requirements.txt", "requirements.lock", "pyproject.toml"):
        (repo / name).write_bytes((REPO / name).read_bytes())
    # PostgreSQL's binaries as set-up looks for them: never the real apt-get
    pg_bin = tmp_path / "postgresql" / "15" / "bin"
    pg_bin.mkdir(parents=True, exist_ok=True)
    for tool in ("initdb", "pg_ctl"):
        stub(pg_bin, tool, "true")
    (repo / "dev").chmod(0o755)
    stub(repo / ".venv" / "bin", "python", STUB_PYTHON)
    bin_dir, log = tmp_path / "bin", tmp_path / "commands.log"
    bin_dir.mkdir(exist_ok=True)
    stub(bin_dir, "cmake", STUB_CMAKE)
    chromium = tmp_path / "chromium"
    stub(tmp_path, "chromium", "true")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log), "HOME": str(tmp_path),
           "SEMBACK_CHROMIUM": str(chromium), "SEMBACK_CPU_FLAGS": cpu,
           "SEMBACK_POSTGRES_LIB": str(tmp_path / "postgresql"),
           **({"CMAKE_FAILS": "1"} if fails else {}),
           **({"CHECK_FAILS": "1"} if check_fails else {})}
    done = subprocess.run(["bash", str(repo / "dev"), "setup"], env=env, capture_output=True,
                          text=True, timeout=120)
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout + done.stderr, calls


def test_setup_builds_llama_server_from_the_installed_llama_cpp_python_source(tmp_path):
    code, output, calls = setup_with_stand_ins(tmp_path)
    assert code == 0, output
    download, configure, build = calls
    assert "--no-binary :all: llama-cpp-python==0.3.36" in download
    assert configure.split()[2].endswith("llama_cpp_python-0.3.36/vendor/llama.cpp")
    flags = set(configure.split())
    # portable AVX2 as llama-cpp-python's own build, static, nothing fetched while building
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_AVX512=OFF", "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"} <= flags
    assert "--target llama-server" in build
    venv = tmp_path / "repo" / ".venv"
    assert os.access(venv / "bin" / "llama-server", os.X_OK)
    assert (venv / ".llama-server.version").read_text().strip() == "0.3.36 avx2 avx2"
    # once built, a second set-up leaves it alone
    assert setup_with_stand_ins(tmp_path)[2] == calls


def test_on_a_cpu_with_avx512_the_server_is_built_for_it_and_checked(tmp_path):
    code, output, calls = setup_with_stand_ins(tmp_path, cpu=AVX512_CPU)
    assert code == 0, output
    download, configure, build, check = calls
    flags = set(configure.split())
    # AVX-512 and the VNNI this CPU reports, never AMX, nothing the CPU lacks
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON",
            "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DBUILD_SHARED_LIBS=OFF"} <= flags
    assert not {f for f in flags if f.startswith(("-DGGML_AVX512_VBMI", "-DGGML_AVX512_BF16",
                                                  "-DGGML_AVX_VNNI"))}
    assert "--target llama-server" in build
    # the built server answered a first request before it was kept
    assert check.startswith("check - ") and check.endswith(".venv/bin/llama-server")
    venv = tmp_path / "repo" / ".venv"
    assert (venv / ".llama-server.version").read_text().strip() == "0.3.36 avx512 avx512"
    assert setup_with_stand_ins(tmp_path, cpu=AVX512_CPU)[2] == calls


def test_an_avx512_server_that_fails_its_check_is_built_again_portable(tmp_path):
    code, output, calls = setup_with_stand_ins(tmp_path, cpu=AVX512_CPU, check_fails=True)
    assert code == 0, output
    assert [c.split()[0] for c in calls] == ["-m", "cmake", "cmake", "check", "-m", "cmake",
                                             "cmake"]
    assert "-DGGML_AVX512=ON" in calls[1].split()
    assert "-DGGML_AVX512=OFF" in calls[5].split()
    assert "died on its first request (exit status -4): illegal instruction" in output
    assert ("note: the AVX-512 llama-server failed its first request on this machine; "
            "building the portable (AVX2) one") in output
    venv = tmp_path / "repo" / ".venv"
    assert os.access(venv / "bin" / "llama-server", os.X_OK)
    # the stamp says what was built; the AVX-512 build is not tried again on this machine
    assert (venv / ".llama-server.version").read_text().strip() == "0.3.36 avx512 avx2"
    assert setup_with_stand_ins(tmp_path, cpu=AVX512_CPU, check_fails=True)[2] == calls


def test_a_failed_llama_server_build_leaves_set_up_working_in_process(tmp_path):
    code, output, calls = setup_with_stand_ins(tmp_path, fails=True)
    assert code == 0
    assert "note: llama-server did not build; the embedded model will run in-process" in output
    assert not (tmp_path / "repo" / ".venv" / "bin" / "llama-server").exists()
