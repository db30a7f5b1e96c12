"""The bundle redactor: secrets by name and by shape are replaced (and counted by rule), harmless values are
left alone, and a second pass changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.report.redact import REDACTED, Redactor, secret_name, secret_value

HF = "hf_QmZ8aXk2Lr9VtB7cYw3NdP6sJ1eF4gHuT0"
GH = "ghp_R4nd0mG1tHubT0k3nValue1234567890ab"
PAT = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
AKIA = "AKIAZX3KQ7RT5NV2LM4P"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk"
SLACK = "xoxb-1234567890-abcdefghijkl"
KEY_BLOCK = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"


@pytest.mark.parametrize("text, secret, rule", [
    (f"export HF_TOKEN={HF}", HF, "hf-token"),
    (f"token {GH} in a log line", GH, "github-token"),
    (f"{PAT}", PAT, "github-token"),
    (f"aws {AKIA}", AKIA, "aws-access-key"),
    (f"Authorization: Bearer {JWT}", JWT, "jwt"),
    (f"slack={SLACK}", SLACK, "slack-token"),
    (f"key:\n{KEY_BLOCK}\nafter", "b3BlbnNzaC1rZXktdjEAAAAA", "private-key"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEtruncated", "MIIEtruncated", "private-key"),
    ("https://alice:hunter2@data.example.com/x", "hunter2", "url-password"),
    ("redis://:pw0rd@cache:6379/0", "pw0rd", "url-password"),
    ("python train.py --password=x9y8z7 --lr 0.1", "x9y8z7", "secret-flag"),
    ("python train.py --api-key abc123def --lr 0.1", "abc123def", "secret-flag"),
    ("--use-auth --hf_token tok456", "tok456", "secret-flag"),
    ("WANDB_API_KEY=5d1c0a9e8f7b python train.py", "5d1c0a9e8f7b", "secret-assignment"),
    ("Namespace(db_password='s3cret!', lr=0.1)", "s3cret!", "secret-assignment"),
    ("{'client_secret': 'abc.def', 'lr': 0.1}", "abc.def", "secret-key-value"),
    ('{"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG"}', "wJalrXUtnFEMI/K7MDENG", "secret-key-value"),
])
def test_secrets_in_text_are_replaced_and_counted(text: str, secret: str, rule: str) -> None:
    red = Redactor()
    out = red.text(text)
    assert secret not in out
    assert REDACTED in out
    assert red.counts[rule] >= 1
    assert secret not in repr(red.summary())  # counts only, never values


@pytest.mark.parametrize("text", [
    "python train.py --lr 0.1 --max-tokens 4096 --keyframes 3 --batch-size=32",
    "TOKENIZERS_PARALLELISM=false MASTER_ADDR=10.0.0.1 NCCL_SOCKET_IFNAME=eth0",
    "https://data.example.com:8443/shards/a@b",  # a port and an @ in the path are not a password
    "for key, value in batch.items(): tokens=512 max_tokens=4096 num_tokens=7",
    "all_reduce (distributed_c10d.py:2501) <- wrapper (c10d_logger.py:81)",
    "NCCL_DEBUG=INFO OMP_NUM_THREADS=4 --num-key-value-heads 8",
    "hf_transfer enabled; ghp_short; AKIA123; eyJ.not.jwt",
])
def test_harmless_text_is_untouched(text: str) -> None:
    red = Redactor()
    assert red.text(text) == text
    assert not red.counts


@pytest.mark.parametrize("name, value, hidden", [
    ("HF_TOKEN", "abc", True), ("WANDB_API_KEY", "5d1c0a9e8f", True), ("AWS_SECRET_ACCESS_KEY", "wJal/rX", True),
    ("AWS_ACCESS_KEY_ID", "AKIA...", True), ("DB_PASSWORD", "x", True), ("db_passwd", "1234", True),
    ("apiKey", "'k-1'", True), ("clientSecret", "s", True), ("access_token", "t", True), ("--hub-token", "t", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp.json", True), ("token", "'abc'", True),
    # ambiguous words keep what the default-deny rule finds safe: numbers, booleans, names, paths (issue 25)
    ("num_key_value_heads", "8", False), ("--use-key-cache", "true", False), ("key", "'input_ids'", False),
    ("key", "'Xk9mQ2pL7vRtYw3Z'", True), ("cache_key", "'layer3'", False), ("auth_mode", "'none'", False),
    ("token_count", "4096", False), ("pass_idx", "3", False), ("--token-limit", "512", False),
    ("--private-key-file", "/etc/ssl/private/node.pem", False), ("signature_version", "'v4'", False),
    ("pad_token_id", "0", False), ("--auth", "admin:hunter2", True), ("db_pass", "hunter2", True),
    ("passcode", "4821", True), ("psk", "'sunshine'", True), ("privkey", "'0xabc'", True),
    ("TOKENIZERS_PARALLELISM", "false", False), ("max_tokens", "4096", False), ("num_tokens", "7", False),
    ("--keyframes", "3", False), ("keys", "['a']", False), ("monkey", "'x'", False), ("MASTER_ADDR", "10.0.0.1", False),
    ("RANK", "3", False), ("passes", "2", False),
    ("HF_TOKEN", REDACTED, False),  # already hidden (by the node): not hidden or counted twice
])
def test_which_named_values_are_hidden(name: str, value: str, hidden: bool) -> None:
    red = Redactor()
    assert (red.value(name, value, "secret-env") == REDACTED and red.counts["secret-env"] == 1) is hidden
    assert secret_value(name, value) is hidden


def test_names_follow_the_node_side_rule() -> None:
    from workers import redact as node

    for name in ("HF_TOKEN", "--api-key", "max_tokens", "keyframes", "SSH_AUTH_SOCK", "token_ids", "RANK"):
        assert secret_name(name) is node.secret_name(name)


def test_command_line_flag_pairs_keep_names_and_hide_values() -> None:
    red = Redactor()
    argv = ["python", "train.py", "--password", "x", "--hf_token", "abc", "--token", "--verbose", "--lr", "0.1",
            "--api-key=zzz", "HF_TOKEN=abc", "--data", "https://u:p4ss@host/x"]
    out = red.args(argv)
    assert out == ["python", "train.py", "--password", REDACTED, "--hf_token", REDACTED, "--token", "--verbose",
                   "--lr", "0.1", "--api-key=" + REDACTED, "HF_TOKEN=" + REDACTED, "--data",
                   "https://u:" + REDACTED + "@host/x"]
    assert red.summary() == {"secret-assignment": 1, "secret-flag": 3, "url-password": 1}


def test_tree_redacts_env_cmdline_locals_and_iteration_by_name() -> None:
    red = Redactor()
    doc = {"env": [["HF_TOKEN", "plain-looking"], ["RANK", "3"]],
           "cmdline": ["train.py", "--secret", "s"],
           "frames": [{"function": "train", "locals": [{"name": "password", "repr": "'x'", "arg": False},
                                                       {"name": "step", "repr": "5", "arg": False}],
                       "iteration": [["token", "'abc'"], ["step", "5"]]}]}
    out = red.tree(doc)
    assert out["env"] == [["HF_TOKEN", REDACTED], ["RANK", "3"]]
    assert out["cmdline"] == ["train.py", "--secret", REDACTED]
    frame = out["frames"][0]
    assert frame["locals"][0]["repr"] == REDACTED and frame["locals"][1]["repr"] == "5"
    assert frame["iteration"] == [["token", REDACTED], ["step", "5"]]
    assert red.summary() == {"secret-env": 1, "secret-flag": 1, "secret-local": 2}


def test_a_second_pass_finds_nothing() -> None:
    text = f"HF_TOKEN={HF} --password x https://u:p@h {{'api_key': 'k'}} {JWT}"
    first = Redactor()
    once = first.text(text)
    second = Redactor()
    assert second.text(once) == once
    assert not second.counts


_HARMLESS_ALPHABET = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 .,()/\n", max_size=80)
_TOKENS = st.sampled_from([HF, GH, PAT, AKIA, JWT, SLACK, "sk-proj-" + "Ab3" * 10])


@settings(max_examples=200, deadline=None)
@given(before=_HARMLESS_ALPHABET, after=_HARMLESS_ALPHABET, token=_TOKENS)
def test_a_token_anywhere_never_survives(before: str, after: str, token: str) -> None:
    red = Redactor()
    out = red.text(f"{before} {token} {after}")
    assert token not in out
    assert sum(red.counts.values()) >= 1
    assert red.text(out) == out  # idempotent


@settings(max_examples=200, deadline=None)
@given(text=_HARMLESS_ALPHABET)
def test_plain_text_is_never_changed(text: str) -> None:
    assert Redactor().text(text) == text


def test_redacting_a_snapshot_object_equals_redacting_its_json_form() -> None:
    from app.model import Snapshot
    from app.model.codec import from_dict, to_dict
    from test_report_build import make_snapshot

    for scenario in ("dataloader", "hostile", "skip"):
        snap = make_snapshot(scenario, failed_node=True)
        by_object, by_dict = Redactor(), Redactor()
        assert by_object.snapshot(snap) == from_dict(Snapshot, by_dict.tree(to_dict(snap)))
        assert by_object.summary() == by_dict.summary()
