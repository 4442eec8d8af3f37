"""What the domain refuses: `ServiceError`, with a message for the person who made the request."""

from __future__ import annotations


class ServiceError(Exception):
    """A request the domain refuses, with a message for the person who made it."""
