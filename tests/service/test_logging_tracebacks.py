"""Security: a JSON log line keeps the exception's traceback (`exc_info`), or an incident leaves no trace."""

from __future__ import annotations

import json
import logging
import sys

from service.logging_setup import FieldsFormatter


def _record_of_a_failure() -> logging.LogRecord:
    logger = logging.getLogger("tests.tracebacks")
    try:
        raise ValueError("the lease store is gone")
    except ValueError:
        return logger.makeRecord(
            logger.name, logging.ERROR, __file__, 1, "lease failed", (), exc_info=sys.exc_info()
        )


def test_a_json_line_carries_the_traceback() -> None:
    line = FieldsFormatter(as_json=True).format(_record_of_a_failure())
    body = json.loads(line)  # still one JSON object on one line
    assert "\n" not in line
    assert body["message"] == "lease failed"
    assert body["exc_info"].startswith("Traceback (most recent call last)")
    assert "ValueError: the lease store is gone" in body["exc_info"]
    assert "_record_of_a_failure" in body["exc_info"]  # the frame where it was raised


def test_a_json_line_carries_stack_info_and_nothing_extra_without_one() -> None:
    record = logging.getLogger("tests.tracebacks").makeRecord(
        "tests.tracebacks",
        logging.INFO,
        __file__,
        1,
        "fine",
        (),
        exc_info=None,
        sinfo="Stack (most recent call last):\n  here",
    )
    body = json.loads(FieldsFormatter(as_json=True).format(record))
    assert "exc_info" not in body
    assert body["stack_info"].startswith("Stack (most recent call last)")


def test_the_text_format_keeps_the_traceback_too() -> None:
    text = FieldsFormatter().format(_record_of_a_failure())
    assert "ValueError: the lease store is gone" in text
