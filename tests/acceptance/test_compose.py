"""compose.yaml run for real, as the README's compose section says, on images built from Debian
(``deploy/compose/local-images.sh``): ``up -d``, the API's ``/healthz``, a token from ``run --rm api
token``, a server created against the composed simulator (its job succeeds), Prometheus in the
stack scraping every z9 service (``up == 1``), every service passing compose.yaml's health check,
then ``down -v`` leaving no container, network or volume behind.

With podman (``deploy/compose/podman-compose.sh``, podman-compose) or, where a Docker engine
answers, ``docker compose``; as root (debootstrap). The stack runs from a copy of compose.yaml and
deploy/ in a temporary folder (its own .env, z9.env and secrets), as a project of its own name, on
free host ports and with a z9 image tag of its own: nothing of a developer's stack or ``z9 dev``
is touched. Skipped, with the reason, when neither engine can run it, unless
``Z9_REQUIRE_COMPOSE=1`` (``.ci/run`` installs podman and debootstrap and sets it).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ports import free_port
from tests.support import poll_sync

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = ROOT / "deploy" / "compose" / "containers.conf"
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def _podman_compose() -> str | None:
    beside = Path(sys.executable).parent / "podman-compose"
    return str(beside) if beside.exists() else shutil.which("podman-compose")


def _works(argv: list[str], env: dict[str, str] | None = None) -> bool:
    try:
        return subprocess.run(argv, check=False, capture_output=True, timeout=60, env=env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _engine() -> tuple[str | None, str]:
    """("podman" | "docker", "") or (None, why neither can run the stack)."""
    why = []
    if os.geteuid() != 0:
        why.append("not root (debootstrap makes the Debian base as root)")
    if not (shutil.which("debootstrap") or Path("/usr/sbin/debootstrap").exists()):
        why.append("no debootstrap (apt-get install debootstrap)")
    if not shutil.which("podman"):
        why.append("no podman (apt-get install podman runc netavark aardvark-dns)")
    elif not _works(["podman", "info"], PODMAN_ENV):
        why.append("`podman info` fails")
    elif not _podman_compose():
        why.append("no podman-compose (the [test] extra)")
    elif not why:
        return "podman", ""
    if shutil.which("docker") and _works(["docker", "info"]) and _works(["docker", "compose", "version"]):
        if not why:
            return "docker", ""
    else:
        why.append("no Docker engine with compose (`docker info`, `docker compose version`)")
    return None, "; ".join(why)


ENGINE, WHY_NOT = _engine()
if ENGINE is None:
    if os.environ.get("Z9_REQUIRE_COMPOSE") == "1":
        raise RuntimeError(f"Z9_REQUIRE_COMPOSE=1 but neither podman nor docker can run the stack: {WHY_NOT}")
    pytest.skip(f"neither podman nor docker can run the compose stack: {WHY_NOT}", allow_module_level=True)
ENGINE_ENV = PODMAN_ENV if ENGINE == "podman" else None


class Stack:
    """The compose project under test, in its own folder."""

    def __init__(self, folder: Path, project: str, env: dict[str, str]) -> None:
        self.folder, self.project, self.env = folder, project, env

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        if ENGINE == "podman":
            argv = [str(self.folder / "deploy" / "compose" / "podman-compose.sh"), "-p", self.project, *args]
        else:
            argv = ["docker", "compose", "-f", "compose.yaml", "-p", self.project, *args]
        try:
            return subprocess.run(argv, check=False, cwd=self.folder, env=self.env, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            # podman-compose waits for ever on a container that failed to start ("netavark: No such
            # file or directory" without iptables): say what it printed, not only that it hung
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise AssertionError(f"compose {' '.join(args)} still running after {timeout} s; its stderr:\n"
                                 f"{err[-4000:]}") from None

    def ok(self, *args: str, timeout: float = 300) -> str:
        out = self.compose(*args, timeout=timeout)
        assert out.returncode == 0, f"compose {' '.join(args)}: {out.returncode}\n{out.stdout}\n{out.stderr}"
        return out.stdout

    def left(self) -> dict[str, list[str]]:
        """The containers, networks and volumes of the project that are still there."""
        found = {}
        for what, argv in (("containers", ["ps", "-a", "--format", "{{.Names}}"]),
                           ("networks", ["network", "ls", "--format", "{{.Name}}"]),
                           ("volumes", ["volume", "ls", "--format", "{{.Name}}"])):
            out = subprocess.run([ENGINE, *argv], check=False, capture_output=True, text=True, timeout=60, env=ENGINE_ENV)
            assert out.returncode == 0, out.stderr
            found[what] = [n for n in out.stdout.split() if n.startswith((f"{self.project}_", f"{self.project}-"))]
        return found

    def running(self) -> dict[str, str]:
        """service -> its running container (podman-compose names them project_service_1, docker
        compose project-service-1)."""
        out = subprocess.run([ENGINE, "ps", "--format", "{{.Names}}"], check=False, capture_output=True, text=True,
                             timeout=60, env=ENGINE_ENV)
        assert out.returncode == 0, out.stderr
        sep = "_" if ENGINE == "podman" else "-"
        return {n[len(self.project) + 1:].rsplit(sep, 1)[0]: n for n in out.stdout.split()
                if n.startswith(self.project + sep)}

    def healthy(self, name: str) -> bool:
        """compose.yaml's health check of the container passes: podman runs it here (without
        systemd it runs none by itself), docker reports its own runs."""
        if ENGINE == "podman":
            argv = ["podman", "healthcheck", "run", name]
        else:
            argv = ["docker", "inspect", "--format", "{{.State.Health.Status}}", name]
        out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60, env=ENGINE_ENV)
        return out.returncode == 0 and (ENGINE == "podman" or out.stdout.strip() == "healthy")

    def logs(self) -> str:
        out = self.compose("logs", "--tail", "40", timeout=120)
        return (out.stdout + out.stderr)[-20000:]


def _http(url: str, body: dict | None = None, token: str | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def _answers(url: str) -> bool:
    try:
        return _http(url)[0] == 200
    except OSError:  # not listening yet, or reset while starting (URLError is an OSError)
        return False


def _stack_folder(tmp: Path) -> Path:
    """compose.yaml and deploy/, with an .env of fresh secrets, z9.env from its example."""
    folder = tmp / "stack"
    folder.mkdir()
    shutil.copy(ROOT / "compose.yaml", folder / "compose.yaml")
    shutil.copytree(ROOT / "deploy", folder / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "z9.env.example", folder / "z9.env")
    lines = []
    for line in (ROOT / ".env.example").read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            if "change-me" in value:  # every change-me-… value changed, as the README says
                value = secrets.token_urlsafe(24)
            line = f"{key}={value}"
        lines.append(line)
    (folder / ".env").write_text("\n".join(lines) + "\n")
    return folder


def _up_on_free_ports(stack: Stack) -> dict[str, int]:
    """``up -d`` with the host ports in .env; ports free when chosen can be taken by another test
    process before podman binds them (other worktrees' tests draw from the same block): then
    ``down -v`` and again on other ports, three tries."""
    env_file = stack.folder / ".env"
    lines = env_file.read_text()
    for _ in range(3):
        ports = {"Z9_API_PORT": free_port(), "Z9_SIM_PORT": free_port(), "Z9_PROMETHEUS_PORT": free_port()}
        env_file.write_text(lines + "".join(f"{name}={port}\n" for name, port in ports.items()))
        out = stack.compose("up", "-d")
        if out.returncode == 0:
            return ports
        if "address already in use" not in out.stderr:
            break
        stack.ok("down", "-v")
    raise AssertionError(f"compose up -d: {out.returncode}\n{out.stdout}\n{out.stderr}")


@pytest.mark.timeout(900)
def test_the_compose_stack_comes_up_serves_a_server_is_scraped_and_goes_away(tmp_path: Path) -> None:
    tag = f"test-{uuid.uuid4().hex[:10]}"
    project = f"z9compose{uuid.uuid4().hex[:8]}"
    folder = _stack_folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("Z9_", "COMPOSE_", "OTEL_"))}
    env["Z9_IMAGE_TAG"] = tag
    if ENGINE == "podman":
        env.update(CONTAINERS_CONF=str(CONTAINERS_CONF), PODMAN_COMPOSE=str(_podman_compose()))
    else:
        env.update(Z9_POSTGRES_IMAGE="localhost/z9-compose/postgres:bookworm",
                   Z9_PROMETHEUS_IMAGE="localhost/z9-compose/prometheus:bookworm", COMPOSE_PROFILES="")
    stack = Stack(folder, project, env)

    # The images from Debian (the root file system cached in /var/cache/z9-compose), z9's tagged
    # for this run only.
    built = subprocess.run([str(ROOT / "deploy" / "compose" / "local-images.sh")], check=False,
                           env={**env, "Z9_COMPOSE_ENGINE": ENGINE}, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr[-20000:]
    try:
        ports = _up_on_free_ports(stack)
        api = f"http://127.0.0.1:{ports['Z9_API_PORT']}"
        try:
            poll_sync(lambda: _answers(f"{api}/healthz"), 180, "the API's /healthz", interval_s=0.5)

            # A token as the README makes one (-T: no terminal), then a server on the composed simulator.
            token = stack.ok("run", "--rm", "-T", "api", "token", "--tenant", "compose").strip().splitlines()[-1]
            status, out = _http(f"{api}/v1/servers", {"name": "compose-web", "region": "dev-1", "image": "debian-12",
                                                     "cores": 1, "memory_mib": 1024, "disk_gib": 4}, token)
            assert status == 202, out

            def finished() -> dict | None:
                job = _http(f"{api}/v1/jobs/{out['job']['id']}", token=token)[1]
                return job if job["status"] in ("succeeded", "failed") else None

            job = poll_sync(finished, 240, "the server's create job", interval_s=0.5)
            assert job["status"] == "succeeded", job
            server = _http(f"{api}/v1/servers/{out['server']['id']}", token=token)[1]["server"]
            assert server["status"] == "running" and server["observed"]["vmid"], server
            # a plan through the composed API: it reads the region with dev-1's token (compose.yaml
            # gives the api that secret too) and finds the server as its job left it
            status, plan = _http(f"{api}/v1/servers/{server['id']}/actions/plan", {}, token)
            assert status == 200 and plan["in_sync"] is True, (status, plan)

            # Prometheus of the stack scrapes every z9 service its configuration names.
            config = yaml.safe_load((folder / "deploy" / "prometheus" / "prometheus.yml").read_text())
            (z9_job,) = [j for j in config["scrape_configs"] if j["job_name"] == "z9"]
            services = {c["labels"]["service"] for c in z9_job["static_configs"]}
            assert services == {"api", "scheduler", "executor", "reaper"}
            query = urllib.parse.quote('up{job="z9"}')
            prometheus = f"http://127.0.0.1:{ports['Z9_PROMETHEUS_PORT']}/api/v1/query?query={query}"

            def all_up() -> dict | None:
                try:
                    status, answer = _http(prometheus)
                except OSError:
                    return None
                if status != 200:
                    return None
                up = {r["metric"]["service"]: r["value"][1] for r in answer["data"]["result"]}
                return up if up == {s: "1" for s in services} else None

            poll_sync(all_up, 120, f"Prometheus to scrape {sorted(services)} with up == 1", interval_s=0.5)

            # Every running service passes its compose health check on these images (postgres's
            # pg_isready, prometheus's wget, the z9 services' python), as Docker would run them.
            running = stack.running()
            assert set(running) == {"postgres", "sim", "prometheus", "api", "scheduler", "reaper",
                                    "executor-dev-1"}, running
            for name in running.values():
                poll_sync(lambda name=name: stack.healthy(name), 120, f"{name}'s health check", interval_s=0.5)
        except BaseException:
            print(stack.logs())
            raise
        stack.ok("down", "-v")
        assert stack.left() == {"containers": [], "networks": [], "volumes": []}
    finally:
        if any(stack.left().values()):  # a failed run leaves nothing behind either
            stack.compose("down", "-v")
        # the run's tag goes; its layers stay, the next build's cache
        subprocess.run([ENGINE, "rmi", "--no-prune", f"z9:{tag}"], check=False, capture_output=True, timeout=120,
                       env=ENGINE_ENV)
