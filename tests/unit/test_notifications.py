"""The pure part of notifications: event derivation, noise control, signatures, SSRF checks, secrets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from duetime.domain.models import NotificationRule
from duetime.domain.notifications import (
    Incident,
    RunSignal,
    RunSnapshot,
    address_refusal,
    carry_secrets,
    check_webhook_url,
    decide,
    delivery_backoff,
    derive_events,
    event_id,
    sign,
    signature_header,
    verify_signature,
)

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
SECRET = "0123456789abcdef"


def snap(state: str, **kw: object) -> RunSnapshot:
    return RunSnapshot(job_id="j1", due_at=T0, tenant="t1", state=state, **kw)  # type: ignore[arg-type]


def kinds(old: RunSnapshot | None, new: RunSnapshot) -> list[tuple[str, int]]:
    return [(s.kind, s.attempt) for s in derive_events(old, new)]


# ---- derivation ---------------------------------------------------------------------------------------
def test_a_failed_attempt_with_attempts_left_is_failed() -> None:
    new = snap("RETRY_WAIT", attempt=1, last_attempt={"attempt": 1, "state": "FAILED", "exit_code": 3})
    assert kinds(snap("RUNNING"), new) == [("failed", 1)]
    assert derive_events(snap("RUNNING"), new)[0].exit_code == 3


def test_the_last_failed_attempt_is_failed_and_dead_lettered() -> None:
    new = snap("FAILED", attempt=3, dead_lettered=True, last_attempt={"attempt": 3, "state": "FAILED"})
    assert kinds(snap("RUNNING", attempt=3), new) == [("failed", 3), ("dead_lettered", 3)]


def test_a_timed_out_attempt_is_timed_out_whether_retried_or_not() -> None:
    retried = snap("RETRY_WAIT", last_attempt={"attempt": 1, "state": "TIMED_OUT"})
    assert kinds(snap("RUNNING"), retried) == [("timed_out", 1)]
    assert kinds(snap("RUNNING"), snap("TIMED_OUT", last_attempt={"attempt": 1, "state": "TIMED_OUT"})) == [
        ("timed_out", 1)
    ]


def test_a_success_is_the_succeeded_signal_and_a_lost_worker_is_failed() -> None:
    assert kinds(snap("RUNNING"), snap("SUCCEEDED")) == [("succeeded", 1)]
    lost = snap("RETRY_WAIT", last_attempt={"attempt": 1, "state": "FAILED", "reason": "worker_lost"})
    [signal] = derive_events(snap("RUNNING"), lost)
    assert (signal.kind, signal.reason) == ("failed", "worker_lost")


@pytest.mark.parametrize("reason", ["missed", "starting_deadline_exceeded"])
def test_a_slot_skipped_as_missed_or_past_its_deadline_is_missed(reason: str) -> None:
    assert kinds(snap("PENDING"), snap("SKIPPED", error=reason)) == [("missed", 1)]
    assert kinds(None, snap("SKIPPED", error=reason)) == [("missed", 1)]


@pytest.mark.parametrize("reason", ["overlap", "paused", "deleted", "schedule_changed"])
def test_other_skips_give_nothing(reason: str) -> None:
    assert kinds(snap("PENDING"), snap("SKIPPED", error=reason)) == []


def test_a_run_claimed_after_an_outage_counts_its_missed_slots() -> None:
    [signal] = derive_events(None, snap("PENDING", missed_slots=4))
    assert (signal.kind, signal.count, signal.reason) == ("missed", 4, "catch_up")


def test_a_write_that_keeps_the_state_and_attempt_gives_nothing_so_a_duplicate_is_ignored() -> None:
    same = snap("RETRY_WAIT", last_attempt={"attempt": 1, "state": "FAILED"})
    assert kinds(same, same) == []
    assert kinds(snap("PENDING"), snap("RUNNING")) == []


def test_duplicates_of_a_change_give_the_same_event_ids_and_attempts_differ() -> None:
    new = snap("RETRY_WAIT", last_attempt={"attempt": 1, "state": "FAILED"})
    first = derive_events(snap("RUNNING"), new)[0].event_id
    assert first == derive_events(snap("RUNNING"), new)[0].event_id
    assert first == event_id("j1", T0, 1, "failed")
    assert first != event_id("j1", T0, 2, "failed") != event_id("j1", T0, 1, "dead_lettered")
    assert first.startswith("evt_") and len(first) == 36


# ---- noise control --------------------------------------------------------------------------------------
def rule(*events: str, remind: int | None = None, url: str = "https://h.example.com/x") -> NotificationRule:
    return NotificationRule.model_validate(
        {"on": list(events), "webhook": {"url": url, "secret": SECRET}, "remind_every_seconds": remind}
    )


def sig(kind: str, attempt: int = 1) -> RunSignal:
    return RunSignal(kind=kind, job_id="j1", due_at=T0, tenant="t1", attempt=attempt, state="FAILED")


def test_a_failing_streak_alerts_each_rule_once_then_recovered_closes_it() -> None:
    rules = [rule("failed", "recovered")]
    first = decide(sig("failed", 1), rules, Incident(), now=T0, muted=False)
    assert (first.kind, len(first.send), first.incident.open) == ("failed", 1, True)
    second = decide(sig("failed", 2), rules, first.incident, now=T0 + timedelta(minutes=1), muted=False)
    assert (second.send, dict(second.held)) == ((), {rules[0].key: "suppressed"})
    recovered = decide(sig("succeeded"), rules, second.incident, now=T0 + timedelta(minutes=2), muted=False)
    assert (recovered.kind, len(recovered.send), recovered.incident.open) == ("recovered", 1, False)
    # a new streak alerts again
    again = decide(sig("failed", 1), rules, recovered.incident, now=T0 + timedelta(minutes=3), muted=False)
    assert len(again.send) == 1


def test_a_success_without_an_open_incident_is_no_event() -> None:
    assert decide(sig("succeeded"), [rule("recovered")], Incident(), now=T0, muted=False).kind is None


def test_reminders_come_with_the_streaks_events_once_the_period_has_passed() -> None:
    rules = [rule("failed", remind=600)]
    state = decide(sig("failed", 1), rules, Incident(), now=T0, muted=False).incident
    early = decide(sig("failed", 2), rules, state, now=T0 + timedelta(seconds=599), muted=False)
    assert early.send == ()
    late = decide(sig("failed", 3), rules, early.incident, now=T0 + timedelta(seconds=600), muted=False)
    assert len(late.send) == 1


def test_dead_lettered_alerts_even_after_failed_did_in_the_same_streak() -> None:
    rules = [rule("failed", "dead_lettered")]
    state = decide(sig("failed", 3), rules, Incident(), now=T0, muted=False).incident
    assert len(decide(sig("dead_lettered", 3), rules, state, now=T0, muted=False).send) == 1


def test_muted_records_the_event_keeps_the_incident_and_sends_nothing() -> None:
    rules = [rule("failed")]
    muted = decide(sig("failed"), rules, Incident(), now=T0, muted=True)
    assert (muted.kind, muted.send, dict(muted.held)) == ("failed", (), {rules[0].key: "muted"})
    assert muted.incident.open


def test_late_overran_and_missed_are_sent_each_time() -> None:
    rules = [rule("late", "missed")]
    state = Incident()
    for attempt in (1, 2):
        decision = decide(sig("late", attempt), rules, state, now=T0, muted=False)
        assert len(decision.send) == 1
        state = decision.incident


def test_a_rule_not_on_the_event_is_not_sent() -> None:
    assert decide(sig("failed"), [rule("late")], Incident(), now=T0, muted=False).send == ()


# ---- signatures --------------------------------------------------------------------------------------------
def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    import hashlib
    import hmac

    body = b'{"a":1}'
    expected = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(SECRET, 1700000000, body) == expected
    assert signature_header([SECRET], 1700000000, body) == f"t=1700000000,v1={expected}"


def test_a_signature_verifies_with_either_secret_during_a_rotation_and_not_when_stale_or_tampered() -> None:
    body = b'{"event_id":"evt_1"}'
    header = signature_header(["new-secret-0123456", SECRET], 1700000000, body)
    assert verify_signature(header, body, SECRET, now=1700000100)
    assert verify_signature(header, body, "new-secret-0123456", now=1700000100)
    assert not verify_signature(header, body, "other-secret-01234", now=1700000100)
    assert not verify_signature(header, body + b" ", SECRET, now=1700000100)
    assert not verify_signature(header, body, SECRET, now=1700000000 + 301)


def test_a_signature_timestamp_not_in_ascii_digits_does_not_verify() -> None:
    # Given a valid signature whose t= is respelled in Arabic-Indic digits (int() reads it) or is "²"
    body = b'{"event_id":"evt_1"}'
    expected = sign(SECRET, 1700000000, body)
    arabic = "1700000000".translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    # Then neither verifies, and neither raises
    assert not verify_signature(f"t={arabic},v1={expected}", body, SECRET, now=1700000100)
    assert not verify_signature(f"t=²,v1={expected}", body, SECRET, now=1700000100)
    assert verify_signature(f"t=1700000000,v1={expected}", body, SECRET, now=1700000100)


# ---- SSRF -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "address", ["169.254.169.254", "169.254.0.1", "fd00:ec2::254", "fe80::1", "::ffff:169.254.169.254"]
)
def test_link_local_and_metadata_addresses_are_always_refused(address: str) -> None:
    assert address_refusal(address, allow_private=True) is not None
    assert address_refusal(address, allow_private=False) is not None


@pytest.mark.parametrize(
    "address",
    ["10.1.2.3", "172.16.0.1", "192.168.0.10", "127.0.0.1", "::1", "fc00::1", "100.64.0.1", "0.0.0.0"],
)
def test_private_and_loopback_addresses_are_refused_on_aws_only(address: str) -> None:
    assert address_refusal(address, allow_private=False) is not None
    assert address_refusal(address, allow_private=True) is None


def test_a_public_address_is_allowed() -> None:
    assert address_refusal("93.184.216.34", allow_private=False) is None
    assert address_refusal("2606:2800:220:1:248:1893:25c8:1946", allow_private=False) is None


@pytest.mark.parametrize(
    ("url", "local", "why"),
    [
        ("http://hooks.example.com/x", True, "https"),
        ("http://127.0.0.1:9/x", False, "https"),
        ("https://user:pw@hooks.example.com/x", False, "credentials"),
        ("https://localhost/x", False, "loopback"),
        ("https://10.0.0.1/x", False, "private"),
        ("https://169.254.169.254/x", True, "link-local"),
        # the legacy IPv4 forms a resolver reads as 169.254.169.254 (inet_aton)
        ("https://2852039166/x", True, "2852039166 is 169.254.169.254: .*link-local"),
        ("https://0xA9FEA9FE/x", True, "link-local"),
        ("https://0251.0376.0251.0376/x", True, "link-local"),
        ("https://169.254.43518/x", True, "link-local"),
        ("https://0x7f000001/x", False, "loopback"),
        ("gopher://hooks.example.com/x", False, "https"),
    ],
)
def test_a_webhook_url_is_checked_at_submit(url: str, local: bool, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_webhook_url(url, local=local)


def test_https_anywhere_public_and_http_to_loopback_locally_are_fine() -> None:
    assert check_webhook_url("https://hooks.example.com/x", local=False)
    assert check_webhook_url("http://127.0.0.1:8080/x", local=True)
    assert check_webhook_url("http://localhost:8080/x", local=True)
    assert check_webhook_url("http://2130706433:8080/x", local=True)  # 127.0.0.1 written as one number
    assert check_webhook_url("https://deadbeef.example.com/x", local=False)  # a name, not a number


# ---- secrets and backoff ---------------------------------------------------------------------------------
def test_set_keeps_the_stored_secret_a_new_one_rotates_and_the_same_one_changes_nothing() -> None:
    stored = [rule("failed")]
    kept = carry_secrets(
        stored,
        [
            NotificationRule.model_validate(
                {"on": ["late"], "webhook": {"url": "https://h.example.com/x", "secret": "set"}}
            )
        ],
        T0,
    )
    assert kept[0].webhook is not None and kept[0].webhook.secret == SECRET and kept[0].on == ["late"]
    rotated = carry_secrets(
        stored,
        [
            rule("failed").model_copy(
                update={"webhook": rule("failed").webhook.model_copy(update={"secret": "fresh-secret-0123"})}
            )
        ],
        T0,
    )  # type: ignore[union-attr]
    hook = rotated[0].webhook
    assert hook is not None and hook.secrets(T0) == ["fresh-secret-0123", SECRET]
    assert hook.secrets(T0 + timedelta(hours=24)) == ["fresh-secret-0123"]
    assert carry_secrets(stored, [rule("failed")], T0)[0].webhook.previous_secret is None  # type: ignore[union-attr]


def test_delivery_backoff_doubles_with_equal_jitter_up_to_its_cap() -> None:
    assert [delivery_backoff(n, base=5, cap=60, unit=1.0) for n in (1, 2, 3, 4, 5)] == [5, 10, 20, 40, 60]
    assert delivery_backoff(1, base=5, cap=60, unit=0.0) == 2.5
    assert delivery_backoff(10_000, base=5, cap=60, unit=0.5) == 45
