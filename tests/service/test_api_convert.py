"""`quoted` is `urllib.parse.quote(text, safe="")`, whatever the text (its shortcut only skips the work)."""

from __future__ import annotations

from urllib.parse import quote

from hypothesis import example, given
from hypothesis import strategies as st

from service.api.convert import quoted


@given(st.text())
@example("plain-user_1.name~")  # the shortcut's case
@example("p@ss:w/rd\n")  # what must be escaped
@example("café")  # letters outside ASCII are escaped (UTF-8)
@example("٣")  # an Arabic-Indic digit: a digit to Unicode, not to urllib
@example("a\n")  # a newline after plain text (a `$` would have let it through)
def test_quoted_is_urllib_s_quote(text: str) -> None:
    assert quoted(text) == quote(text, safe="")
