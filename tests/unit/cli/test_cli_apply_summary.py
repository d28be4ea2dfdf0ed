"""What ``gpufrac apply`` says when the agent refuses documents: exactly how many, and "the others
were applied" only when some were (one refused document of one said so, before)."""

from __future__ import annotations

import pytest
from rich.text import Text

from gpufrac.cli.agent_cmds import refused_summary


@pytest.mark.parametrize(
    ("refused", "total", "said"),
    [
        (1, 1, "the document was refused; nothing was applied"),
        (2, 2, "all 2 documents were refused; nothing was applied"),
        (1, 2, "1 of 2 documents refused; the other 1 was applied"),
        (1, 3, "1 of 3 documents refused; the other 2 were applied"),
    ],
)
def test_the_refusal_summary_counts_what_was_applied(refused: int, total: int, said: str) -> None:
    assert Text.from_markup(refused_summary(refused, total)).plain == said
