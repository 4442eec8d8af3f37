"""Tests of the server-rendered pages."""
