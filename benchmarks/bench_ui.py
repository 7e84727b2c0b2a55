"""Benchmark: the review UI in a real browser (Debian's Chromium, headless, via Playwright).

Usage (from the repository root, in the project's virtualenv)::

    python benchmarks/bench_ui.py [--opens 10] [--sessions 10] [--seconds 60]
                                  [--screenshot docs/study-view.png]

Setup: a 60-slice phantom study (the spec's largest: 288 x 288 x 60) written as DICOM, its truth
stored as a measured result in a fresh SQLite store, and the UI server started on 127.0.0.1.

1. **First image after the click**: a logged-in page clicks "Open study"; the time until the
   study image is shown (the image element's picture loaded, no "processing" left) is measured
   ``--opens`` times, the first with the volume not yet read (cold), the rest warm.
   Target: <= 1 s.
2. **Concurrent sessions**: ``--sessions`` browser sessions (each its own login) browse for
   ``--seconds``: open the study, move the slice slider, switch window presets, zoom; every
   Gradio error message, failed HTTP response (>= 500) and uncaught page error counts.
   Target: no errors.
3. ``--screenshot``: a picture of the study view for the README.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import load, machine

from tests.support.ui import CHROMIUM, CHROMIUM_ARGS

PASSWORD = "benchmark password"


def _server(root: Path) -> tuple[str, object, object]:
    import socket

    import uvicorn

    from app.measuring import store_measured
    from app.ui.context import UiContext
    from app.ui.server import create_app
    from db.engine import open_store
    from db.migrate import upgrade
    from db.models import Role
    from db.users import add_user
    from ingestion.phantoms import PhantomSpec, write_phantoms

    from tests.support.ui import _Measurer, _result_from_truth

    spec = PhantomSpec(matrix_size=(288, 288), slice_count=(60, 60))
    write_phantoms(root / "studies", n=1, seed=5, spec=spec)
    url = f"sqlite:///{root / 'ui.sqlite3'}"
    upgrade(url)
    store = open_store(url)
    result, volume = _result_from_truth(root / "studies" / "phantom_0000")
    store_measured(
        store, _Measurer(), result, volume, started_at=datetime.now(UTC), actor="bench",
        pseudonym_key=None,
    )  # fmt: skip
    with store.writer() as session:
        for k in range(20):
            add_user(session, f"reviewer{k}", Role.REVIEWER, password=PASSWORD, actor="bench")
        session.commit()
    context = UiContext(store=store, model_dir=None, nifti_modality=None, upload_dir=root / "up")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(context), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, context


async def _login(browser: object, base: str, user: str) -> object:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = await context.new_page()
    await page.goto(f"{base}/login")
    await page.fill("#username", user)
    await page.fill("#password", PASSWORD)
    await page.click("#login")
    await page.wait_for_url("**/app/**")
    await page.get_by_text("Logged in as").wait_for(timeout=60000)
    return page


async def _open(page: object) -> float:
    from playwright.async_api import expect

    began = time.perf_counter()
    await page.get_by_role("button", name="Open study").click()  # type: ignore[attr-defined]
    image = page.locator("#study-image img")  # type: ignore[attr-defined]
    await image.wait_for(timeout=60000)
    await expect(page.locator("#study-image")).not_to_contain_text("processing", timeout=60000)  # type: ignore[attr-defined]
    await page.wait_for_function(  # type: ignore[attr-defined]
        "() => { const i = document.querySelector('#study-image img');"
        " return i && i.complete && i.naturalWidth > 0; }"
    )
    return time.perf_counter() - began


async def _first_image(browser: object, base: str, opens: int, context: object) -> list[float]:
    times = []
    for k in range(opens):
        if k == 0:
            context._volumes.clear()  # type: ignore[attr-defined]  # cold: read from disk
        page = await _login(browser, base, f"reviewer{k % 20}")
        times.append(await _open(page))
        await page.context.close()  # type: ignore[attr-defined]
    return times


async def _browse(browser: object, base: str, user: str, seconds: float, errors: list[str]) -> int:
    page = await _login(browser, base, user)
    page.on("pageerror", lambda e: errors.append(f"{user}: page error {e}"))  # type: ignore[attr-defined]
    page.on(  # type: ignore[attr-defined]
        "response",
        lambda r: errors.append(f"{user}: HTTP {r.status} {r.url}") if r.status >= 500 else None,
    )
    await _open(page)
    actions = 0
    deadline = time.monotonic() + seconds
    presets = ["lung", "bone", "soft tissue"]
    slider = page.locator("#slice-slider input[type=number]")  # type: ignore[attr-defined]
    while time.monotonic() < deadline:
        await slider.fill(str(5 + actions % 50))
        await slider.press("Enter")
        await page.get_by_label(presets[actions % 3], exact=True).check()  # type: ignore[attr-defined]
        await page.wait_for_timeout(300)  # type: ignore[attr-defined]
        toasts = await page.locator(".toast-body").all_inner_texts()  # type: ignore[attr-defined]
        errors.extend(f"{user}: {t}" for t in toasts if "rror" in t)
        actions += 2
    await page.context.close()  # type: ignore[attr-defined]
    return actions


async def _run(args: argparse.Namespace, base: str, context: object) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        times = await _first_image(browser, base, args.opens, context)
        if args.screenshot:
            page = await _login(browser, base, "reviewer0")
            await _open(page)
            await page.screenshot(path=args.screenshot, full_page=False)
            await page.context.close()  # type: ignore[attr-defined]
        errors: list[str] = []
        counts = await asyncio.gather(
            *(
                _browse(browser, base, f"reviewer{k}", args.seconds, errors)
                for k in range(args.sessions)
            )
        )
        await browser.close()
    warm = times[1:] or times
    print("| measurement | value | target | |")
    print("|---|---|---|---|")
    print(
        f"| first image after the click, cold (volume read from disk) | {times[0]:.2f} s | "
        f"<= 1 s | {'MET' if times[0] <= 1.0 else 'missed'} |"
    )
    print(
        f"| first image after the click, warm: median / max of {len(warm)} | "
        f"{statistics.median(warm):.2f} / {max(warm):.2f} s | <= 1 s | "
        f"{'MET' if statistics.median(warm) <= 1.0 else 'missed'} |"
    )
    print(
        f"| {args.sessions} concurrent sessions x {args.seconds:.0f} s: UI actions | "
        f"{sum(counts)} | | |"
    )
    print(
        f"| errors (Gradio messages, HTTP >= 500, page errors) | {len(errors)} | 0 | "
        f"{'MET' if not errors else 'missed'} |"
    )
    for error in errors[:10]:
        print(f"- {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--screenshot", type=Path, default=None)
    args = parser.parse_args()
    print(f"- command: `python benchmarks/bench_ui.py {' '.join(sys.argv[1:])}`".rstrip())
    print(f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}")
    print(f"- machine: {machine()}; load average at start {load()}")
    print("- study: 288 x 288 x 60 phantom (DICOM), server and browser on this machine")
    print()
    with tempfile.TemporaryDirectory() as tmp:
        base, server, context = _server(Path(tmp))
        try:
            asyncio.run(_run(args, base, context))
        finally:
            server.should_exit = True  # type: ignore[attr-defined]
    print(f"\n- load average at end: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
