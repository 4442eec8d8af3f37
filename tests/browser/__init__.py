"""Tests that drive the pages in real Chromium."""
