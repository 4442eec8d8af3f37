"""The engine's own error lines, picked from its log."""

from engine.stages.serve.engine_log import error_lines, excerpt, refusal_reason

ARGPARSE_LOG = """\
INFO 12-01 18:00:00 [__init__.py:1] Automatically detected platform cpu.
usage: api_server.py [-h] [--host HOST]
api_server.py: error: unrecognized arguments: --no-such-flag
"""

TRACEBACK_LOG = """\
(APIServer pid=1) INFO 12-01 [api_server.py:1] vLLM API server version 0.32.0
Traceback (most recent call last):
  File "x.py", line 3, in <module>
    raise ValueError("boom")
RuntimeError: Engine core initialization failed. See root cause above.
(EngineCore pid=2) ERROR 12-01 18:00:01 [core.py:700] ValueError: Head size 16 is not supported
ValueError: Head size 16 is not supported by the CPU attention backend
"""


def test_argparse_error_first():
    lines = error_lines(ARGPARSE_LOG)
    assert lines[0] == "api_server.py: error: unrecognized arguments: --no-such-flag"
    assert refusal_reason(lines) == lines[0]


def test_last_exception_first_then_logged_errors():
    lines = error_lines(TRACEBACK_LOG)
    assert lines[0] == "ValueError: Head size 16 is not supported by the CPU attention backend"
    assert "RuntimeError: Engine core initialization failed. See root cause above." in lines
    assert any(line.startswith("(EngineCore pid=2) ERROR") for line in lines)
    assert len(lines) == len(set(lines))
    logged = "(EngineCore pid=2) ERROR 12-01 18:00:01 [core.py:700] ValueError: Head size 16"
    assert refusal_reason([logged]) == "ValueError: Head size 16"


def test_excerpt_keeps_head_and_tail():
    text = "\n".join(f"line {i}" for i in range(100))
    lines = excerpt(text, head=2, tail=3)
    assert lines == ["line 0", "line 1", "... 95 lines ...", "line 97", "line 98", "line 99"]
    assert excerpt("a\n\nb") == ["a", "b"]
    assert error_lines("\x1b[31mERROR\x1b[0m bad") == ["ERROR bad"]
