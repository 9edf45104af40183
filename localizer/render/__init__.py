"""Renderers: take a Report, write it. They compute nothing."""
