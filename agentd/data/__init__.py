"""Catalog data files (providers, models, aliases) shipped with the package."""
