"""Upstream sources: git submodules and mirrors, sdists, pins, the offline kit, patch series and patches."""
