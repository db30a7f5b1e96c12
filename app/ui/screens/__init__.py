"""Screens of the TUI: main, drill-down, tree, diff, dialogs and the too-small overlay."""
