"""The scheduler actor in the Ray dashboard: its readable name and ``__repr__`` in the actor list, seen
through the dashboard's REST API and in a screenshot of the Actors page taken by headless Chromium.

Ray 2.60 starts a local cluster with token authentication on: the REST calls carry the token
(``Authorization: Bearer``), and Chromium loads the dashboard through a small proxy in this test that
adds the same header, so the page shows the actors rather than a token prompt. The screenshot is
saved under the test's tmp dir and, when ``PDML_SCREENSHOT_DIR`` is set, copied there. Needs
Chromium (``scripts/install_test_tools.sh`` installs Debian's); skipped, saying so, without it.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from pdml_ray.actors.scheduler import create_scheduler  # noqa: E402
from pdml_ray.dashboards import workload  # noqa: E402

CHROMIUM = os.environ.get("PDML_CHROMIUM", "/usr/bin/chromium")
NAME = "pdml-dashboard-test"

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"{CHROMIUM} is missing (scripts/install_test_tools.sh installs Debian's chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _auth_headers() -> dict[str, str]:
    """The Authorization header Ray's own clients send ({} with token authentication off)."""
    from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled

    return dict(get_auth_headers_if_auth_enabled({}) or {})


def _proxy(target: str, headers: dict[str, str]) -> http.server.ThreadingHTTPServer:
    """An HTTP proxy on a free local port to ``target`` that adds ``headers`` to every request."""
    hop = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "host", "content-length"}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            fwd = {k: v for k, v in self.headers.items() if k.lower() not in hop}
            req = urllib.request.Request(target + self.path, data=body, method=self.command, headers={**fwd, **headers})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    status, out_headers, data = r.status, r.getheaders(), r.read()
            except urllib.error.HTTPError as e:
                status, out_headers, data = e.code, list(e.headers.items()), e.read()
            self.send_response(status)
            for k, v in out_headers:
                if k.lower() not in hop:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _forward

        def log_message(self, *args) -> None:  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _png_size_and_colours(data: bytes) -> tuple[int, int, int]:
    """(width, height, distinct pixel values in a sample of rows) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    assert header is not None
    width, height, depth, colour = header[:4]
    channels = {2: 3, 6: 4}.get(colour)
    if depth != 8 or channels is None:
        return width, height, -1
    raw = zlib.decompress(idat)
    stride = width * channels + 1
    colours = set()
    for y in range(0, height, max(1, height // 50)):  # filtered rows: distinct byte runs stand in for colours
        row = raw[y * stride + 1:(y + 1) * stride]
        colours |= {row[i:i + channels] for i in range(0, len(row), channels * 7)}
    return width, height, len(colours)


@pytest.fixture(scope="module")
def dashboard():
    if ray.is_initialized():
        ray.shutdown()
    context = ray.init(address="local", num_cpus=1, include_dashboard=True, dashboard_port=_free_port(),
                       namespace="pdml-dashboard-test", log_to_driver=False)
    url = context.dashboard_url
    url = url if url.startswith("http") else f"http://{url}"
    handle = create_scheduler(workload.config(NAME), workload.NUM_WORKERS)
    workload.replay(handle, steps=10, call=lambda h, m, a: ray.get(getattr(h, m).remote(*a)))
    yield {"url": url, "handle": handle}
    ray.kill(handle)
    ray.shutdown()


def _actors(url: str, headers: dict[str, str]) -> list[dict]:
    req = urllib.request.Request(f"{url}/api/v0/actors?detail=1&limit=1000", headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        body = json.loads(r.read())
    return body["data"]["result"]["result"]


def test_the_rest_api_lists_the_scheduler_with_its_name_and_repr(dashboard):
    headers = _auth_headers()
    if headers:  # token authentication is on: without the token the dashboard refuses
        with pytest.raises(urllib.error.HTTPError) as refused:
            _actors(dashboard["url"], {})
        assert refused.value.code in (401, 403)
    deadline = time.monotonic() + 30
    mine: list[dict] = []
    while time.monotonic() < deadline:
        mine = [a for a in _actors(dashboard["url"], headers) if a.get("name") == NAME]
        if mine and mine[0].get("repr_name"):
            break
        time.sleep(1)
    assert mine, f"actor {NAME} not listed"
    actor = mine[0]
    assert actor["state"] == "ALIVE" and actor["class_name"] == "MeteredScheduler"
    # Ray takes the repr once, when the actor has been created: the run, its size and the start state
    assert re.fullmatch(rf"PDMLScheduler\(run={NAME}-[0-9a-f]{{8}}, workers=2, node v0, gradient v0, last_step=-1, "
                        r"reports=0\)", actor["repr_name"]), actor["repr_name"]


def test_the_actors_page_shows_the_scheduler_in_a_screenshot(dashboard, tmp_path):
    headers = _auth_headers()
    proxy = _proxy(dashboard["url"], headers) if headers else None
    base = f"http://127.0.0.1:{proxy.server_address[1]}" if proxy else dashboard["url"]
    shot = tmp_path / "ray_dashboard_actors.png"
    profile = tmp_path / "chromium-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1600,1000",
           "--virtual-time-budget=20000", f"{base}/#/actors"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=55)
    finally:
        if proxy is not None:
            proxy.shutdown()
    assert shot.exists(), f"no screenshot: {out.returncode}\n{out.stderr[-3000:]}"
    data = shot.read_bytes()
    width, height, colours = _png_size_and_colours(data)
    assert (width, height) == (1600, 1000)
    assert len(data) > 20_000 and colours > 20, (len(data), colours)  # a rendered page, not a blank one
    if os.environ.get("PDML_SCREENSHOT_DIR"):
        keep = Path(os.environ["PDML_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / shot.name)
