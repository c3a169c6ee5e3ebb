"""Data files shipped with the package (accelerators.json, published_scaling.json)."""
