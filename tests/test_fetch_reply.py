"""Reading fetch's reply: the common case (every text field valid UTF-8 bytes) takes a
shorter path than a record with mangled fields; both must read a job the same way."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from conveyor.scripts.calls import _leased, _leased_checked

numbers = st.one_of(st.integers(-10, 10**13).map(lambda n: str(n).encode()),
                    st.floats(allow_nan=False).map(lambda x: repr(x).encode()),
                    st.sampled_from([b"", b"x", b"nan", b"inf"]))
texts = st.one_of(st.text(max_size=20).map(str.encode), st.binary(max_size=20))


@given(short_id=texts, token=texts, task=texts, args=st.binary(max_size=30),
       fields=st.lists(numbers, min_size=5, max_size=5),
       confirm=st.sampled_from([b"", b"1", b"x"]))
def test_the_short_path_reads_a_job_as_the_checked_one(
    short_id: bytes, token: bytes, task: bytes, args: bytes, fields: list[bytes],
    confirm: bytes,
) -> None:
    reply = [short_id, token, task, args, *fields, confirm]
    fast, checked = _leased(reply), _leased_checked(reply)
    assert repr(fast) == repr(checked)  # repr: a NaN time compares unequal to itself
    valid = True
    for raw in (short_id, token, task):
        try:
            raw.decode()
        except UnicodeDecodeError:
            valid = False
    assert (fast.problem is None) == valid
    assert fast.confirm == (confirm == b"1")
