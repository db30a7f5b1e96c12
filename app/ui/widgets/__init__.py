"""Widgets of the TUI: the rank grid (Line API) and the side panels."""
