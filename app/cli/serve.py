"""``radcaliper serve``: the review UI (Gradio behind radcaliper's login); registered on the
``radcaliper`` app by ``app.cli.root``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from app.cli.store import DbOption, checked, open_database
from app.console import (
    out,
    settings_of,
)

__all__ = ["serve"]

logger = logging.getLogger(__name__)
_settings = settings_of


def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port.")] = 7860,
    db: DbOption = None,
    model_dir: Annotated[
        Path | None,
        typer.Option("--model", help="Measurer checkpoint directory (default: the demo model)."),
    ] = None,
    session_minutes: Annotated[
        float, typer.Option("--session-minutes", min=1, help="Login sessions expire after this.")
    ] = 30.0,
    demo: Annotated[
        bool | None,
        typer.Option(
            "--demo/--no-demo",
            help="Fill an empty database with demo studies and users (default: for the default "
            "database only).",
        ),
    ] = None,
    secure_cookies: Annotated[
        bool | None,
        typer.Option(
            "--secure-cookies/--no-secure-cookies",
            help="Send the session cookie over HTTPS only: turn on behind an HTTPS proxy "
            "(default: RADCALIPER_SECURE_COOKIES, else off).",
        ),
    ] = None,
) -> None:
    """Start the review UI: log in, worklist, study view with overlays, reviews, upload, audit.

    On the first start with the default database it measures three phantom studies with the demo
    model and creates the demo users reviewer, auditor and admin, printing their passwords once
    (also in DATA_DIR/demo-users.txt). Stop it with Ctrl-C.

    Failed logins back off: 5 for one user name from one address lock that name from that
    address for 30 s, doubled with each further failure up to 15 minutes; 30 from one address
    lock the address; a name with 10 failures from anywhere within 15 minutes is slowed (3 s)
    from other addresses, never locked, so its owner still gets in (RADCALIPER_LOGIN_*
    settings; 'radcaliper users unlock' ends a lock). The client address is the peer's; a
    proxy's X-Forwarded-For counts only from RADCALIPER_TRUSTED_PROXIES. The UI's temporary
    files are kept in DATA_DIR/ui-temp (owner-only, emptied when the server stops).
    """
    import uvicorn

    from app.files import owner_only_dir
    from app.progress import steps_display
    from app.ui.context import UiContext
    from app.ui.demo import demo_click_study, demo_real_study, seed_demo
    from app.ui.server import APP_PATH, create_app
    from ingestion import Modality

    settings = _settings(ctx)
    checked(lambda: owner_only_dir(settings.data_dir))  # uploads, demo studies, UI temp files
    store = open_database(ctx, db, create=True)
    context = UiContext(
        store=store,
        model_dir=model_dir,
        nifti_modality=Modality(settings.nifti_modality) if settings.nifti_modality else None,
        upload_dir=settings.data_dir / "uploads",
        pseudonym_key=settings.pseudonym_key,
        correction_limits=settings.correction_limits,
        temp_dir=settings.data_dir / "ui-temp",
    )
    if demo if demo is not None else db is None and settings.default_database:
        with steps_display("preparing the demo") as status:
            status.update("loading the demo model")
            measurer = context.measurer()
            real = demo_real_study()
            if real is None:
                out.print(
                    "no shared data folder on this machine: the demo shows phantoms only "
                    "(set RADCALIPER_SHARED_DATA to add the real CT demo study)"
                )
            passwords = seed_demo(
                store,
                measurer,
                settings.data_dir,
                on_step=lambda text: status.update(text),
                real_study=real,
                click_study=demo_click_study(),
            )
        for name, password in passwords.items():
            out.print(f"demo user [bold]{name}[/bold] password: {password}")
    out.print(f"radcaliper review UI on http://{host}:{port}/ (the app is at {APP_PATH}/)")
    uvicorn.run(
        create_app(
            context,
            session_minutes=session_minutes,
            login_limits=settings.login_limits,
            secure_cookies=settings.secure_cookies if secure_cookies is None else secure_cookies,
            trusted_origins=settings.trusted_origins,
            trusted_proxies=settings.trusted_proxies,
        ),
        host=host,
        port=port,
        log_level="warning",
        proxy_headers=False,  # the app reads X-Forwarded-For from trusted proxies only
    )
