"""Bundled hardware profiles and presets (YAML/CSV data, read by paraplan.specs.loaders)."""
