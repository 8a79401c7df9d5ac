"""Presets run as sweeps, their metrics and reports."""
