"""The one error root of perftracker. Every error we raise derives from PerftrackerError."""

from __future__ import annotations


class PerftrackerError(Exception):
    """Root of all perftracker errors."""


class ConfigError(PerftrackerError):
    """A configuration value (environment variable, TOML file, flag) is invalid."""


class SchemaError(PerftrackerError):
    """A stored or received object has a wrong or unknown schema_version, or a bad shape."""


class TraceError(PerftrackerError):
    """A trace or raw-event file is truncated, invalid or unreadable."""


class ProfilerError(PerftrackerError):
    """The profiler could not be started or stopped (for example another one is active)."""


class TransportError(PerftrackerError):
    """A socket or HTTP exchange with the agent or the localizer failed."""


class InputError(PerftrackerError):
    """Bad input to an analysis: duplicate ranks, mixed sessions, NaN values, an empty set."""


class UsageError(PerftrackerError):
    """A command line that asks for two things that do not go together (exit code 2, as argparse's)."""
