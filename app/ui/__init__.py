"""The review UI (Gradio behind our own login): ``app.ui.server.create_app``."""

__all__: list[str] = []
