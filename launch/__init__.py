"""Thin absl entry points (`python -m launch.<stage>`): flags and config in, one library call."""
