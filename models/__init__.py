"""The model catalog: aliases, where each model comes from, and its defaults. Data only, no weights.

Installed as `localinfer_models` so the catalog ships inside the wheel.
"""

from importlib.resources import files

CATALOG = files(__name__) / "catalog.toml"
