"""Continuous integration: the generated GitHub workflows."""
