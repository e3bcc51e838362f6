"""Jinja templates of the generated modules, shipped as package data."""
