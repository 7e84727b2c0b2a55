"""The README's screenshot of the study view, taken from the README's own main job.

Starts ``radcaliper serve`` (the demo model, a fresh SQLite database and demo studies in a
temporary data dir, exactly as ``make run`` does on first start), logs in as the demo reviewer
in headless Chromium, opens the first study of the worklist and saves a picture.

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/experiments/readme_screenshot.py [--out docs/study-view.png]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.ui import CHROMIUM, CHROMIUM_ARGS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/study-view.png"))
    args = parser.parse_args()
    from playwright.sync_api import expect, sync_playwright

    with tempfile.TemporaryDirectory() as data:
        port = _free_port()
        env = dict(os.environ, RADCALIPER_DATA_DIR=data)
        radcaliper = Path(sys.executable).with_name("radcaliper")
        server = subprocess.Popen(
            [str(radcaliper), "serve", "--port", str(port)], env=env, stdout=subprocess.PIPE
        )
        try:
            users = Path(data) / "demo-users.txt"
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if server.poll() is not None:
                        raise SystemExit(f"serve exited with {server.returncode}") from None
                    time.sleep(1)
            line = next(x for x in users.read_text().splitlines() if x.startswith("reviewer:"))
            password = line.split(":", 1)[1].strip()
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
                )
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/login")
                page.fill("#username", "reviewer")
                page.fill("#password", password)
                page.click("#login")
                page.wait_for_url("**/app/**")
                page.get_by_text("Logged in as").wait_for(timeout=60000)
                page.get_by_role("button", name="Open study").click()
                page.locator("#study-image img").wait_for(timeout=60000)
                expect(page.locator("#study-image")).not_to_contain_text(
                    "processing", timeout=60000
                )
                page.wait_for_timeout(1500)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out), full_page=True)
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
