"""The hub tests use the suite-wide `fake_hub` fixture and HF isolation (tests/conftest.py)."""
