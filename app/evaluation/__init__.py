"""Evaluation in the app: a model on a dataset (``dataset``), the clicked measurement against
radiologists (``clicks``), and their plots (``plots``). Import from the modules; importing the
package imports none of them."""

__all__: list[str] = []
