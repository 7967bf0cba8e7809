"""A profile asked for on rank 0, agreed through the rounds (issue 31)."""

from __future__ import annotations

from ddp_engine.rank.distributed import ROW_HEAD, StopFlag
from ddp_engine.rank.profile_ask import ProfileAsk


def test_an_ask_rides_in_the_rows_until_a_round_carries_it() -> None:
    ask, other = ProfileAsk(), ProfileAsk()  # rank 0's, and another rank's
    asked = ask.ask(5, stacks=True)
    assert ask.pending and ask.row() == (asked, 5.0, 2.0) and other.row() == ProfileAsk.NONE
    rows = [list(ask.row()), list(other.row())]
    for each in (ask, other):
        each.read(rows)
        agreed = each.take()
        assert agreed is not None and (agreed.asked_at, agreed.steps) == (asked, 5)
        assert agreed.stacks and not agreed.shapes
        assert each.take() is None  # once
    assert not ask.pending and ask.row() == ProfileAsk.NONE
    ask.read(rows)  # the same round read again (a flush): not a new profile
    assert ask.take() is None


def test_an_ask_made_while_a_round_is_in_flight_is_kept_for_the_next() -> None:
    ask = ProfileAsk()
    first = ask.ask(3)
    in_flight = [list(ask.row())]
    second = ask.ask(4)  # replaces the first before any round read it
    assert second > first
    ask.read(in_flight)  # the round that carried the first
    assert ask.take().steps == 3 and ask.pending  # the second still rides
    ask.read([list(ask.row())])
    assert ask.take().steps == 4 and not ask.pending


def test_a_rounds_row_carries_the_ask_before_the_report() -> None:
    flag = StopFlag(every=1)
    flag.profile.ask(2, shapes=True)
    [done] = flag.after_step(1, lambda: [7.0, 8.0], flush=True)
    assert len(done.rows[0]) == ROW_HEAD + 2 and done.reports() == [[7.0, 8.0]]
    agreed = flag.profile.take()
    assert agreed is not None and agreed.steps == 2 and agreed.shapes
