"""Wheels after the build: repair, platform tags, the wheelhouse, its index, and merging wheelhouses."""
