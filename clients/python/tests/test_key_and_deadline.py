"""Key validation (as the arbiter's) and the deadline arithmetic."""

import pytest

import holdfast
from holdfast import FENCE_MARGIN, Key, fence_deadline, keepalive_period


def test_a_key_parses_at_the_first_slash():
    k = Key.parse("payments/ledger-7/2024")
    assert (k.namespace, k.path, str(k)) == ("payments", "ledger-7/2024", "payments/ledger-7/2024")


@pytest.mark.parametrize(
    "text, field",
    [
        ("nonamespace", "key"), ("/k", "namespace"), ("Jobs/k", "namespace"), ("-a/k", "namespace"),
        ("a" * 64 + "/k", "namespace"), ("jobs/", "key"), ("jobs/a//b", "key"), ("jobs/a/../b", "key"),
        ("jobs/./b", "key"), ("jobs/a b", "key"), ("jobs/é", "key"), ("jobs/a/", "key"), ("jobs/" + "k" * 513, "key"),
    ],
)
def test_bad_keys_are_refused_naming_the_field(text, field):
    with pytest.raises(holdfast.InvalidArgumentError) as e:
        Key.parse(text)
    assert e.value.field == field and e.value.message.startswith(field + ":")


def test_keepalive_period_is_a_third_of_the_ttl_at_least_half_a_second():
    assert keepalive_period(30.0) == 10.0
    assert keepalive_period(1.2) == 0.5
    assert keepalive_period(1.5) == 0.5


def test_the_deadline_counts_from_the_send_time_minus_the_margin():
    assert FENCE_MARGIN == 1.0
    assert fence_deadline(100.0, 10.0) == 109.0
    assert fence_deadline(100.0, 30.0) == 129.0
    # A TTL under the margin gives no time at all, never a deadline in the past.
    assert fence_deadline(100.0, 0.5) == 100.0
