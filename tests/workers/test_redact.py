"""Redaction of secrets in command lines, environment values and free text (positive and negative cases)."""

from __future__ import annotations

import pytest

from workers.redact import redact_argv, redact_env_value, redact_text, secret_name
from workers import redact_code

HF = "hf_" + "a1B2" * 9
GHP = "ghp_" + "Z9" * 18


@pytest.mark.parametrize("argv, expected", [
    (["--password", "x"], ["--password", "***"]),
    (["--token=x"], ["--token=***"]),
    (["--api-key", "k-123"], ["--api-key", "***"]),
    (["--api_key=abc"], ["--api_key=***"]),
    (["--hf_token", HF], ["--hf_token", "***"]),
    (["--hfToken", "abc"], ["--hfToken", "***"]),
    (["--secret", "s3"], ["--secret", "***"]),
    (["--db-passwd", "pw"], ["--db-passwd", "***"]),
    (["--aws-credentials", "c"], ["--aws-credentials", "***"]),
    (["--auth", "user:pw"], ["--auth", "***"]),
    (["--client_secret", "xyz"], ["--client_secret", "***"]),
    (["--password", "123456"], ["--password", "***"]),  # a strong name hides even a number
    (["HF_TOKEN=abc"], ["HF_TOKEN=***"]),
    (["WANDB_API_KEY=abc123"], ["WANDB_API_KEY=***"]),
    (["bash", "-c", "export WANDB_API_KEY=abc123; python t.py"],
     ["bash", "-c", "export WANDB_API_KEY=***; python t.py"]),
    (["--url", "https://alice:s3cr3t@example.com/repo"], ["--url", "https://alice:***@example.com/repo"]),
    (["redis://:pw@cache:6379"], ["redis://:***@cache:6379"]),
    (["--model", "x", GHP], ["--model", "x", "***"]),
    (["--header=Authorization: Bearer eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0NTY3.abcDEF_-x"],
     ["--header=Authorization: Bearer ***"]),
])
def test_secrets_are_masked_and_names_kept(argv: list, expected: list) -> None:
    assert redact_argv(argv) == expected


@pytest.mark.parametrize("argv", [
    ["python", "train.py", "--lr", "0.1", "--epochs", "3"],
    ["--keyframes", "3"],  # contains KEY but is a word of its own
    ["--max-tokens", "5"],  # a count of tokens, not a token
    ["--max_new_tokens=256"],
    ["--tokenizer", "/models/llama/tokenizer.model"],
    ["--num-key-value-heads", "8"],  # ambiguous 'key': a number under it is kept
    ["--use-auth", "--lr", "0.1"],  # a secret-named switch without a value
    ["--author", "me"],
    ["--master_addr=10.0.0.1", "--master_port", "29500"],
    ["http://host:8080/path"],
    ["--keyfile", "/etc/ssl/key.pem"],  # a path to a key file is not the key
])
def test_harmless_arguments_are_kept(argv: list) -> None:
    assert redact_argv(argv) == argv


@pytest.mark.parametrize("secret", [
    HF, "AKIAIOSFODNN7EXAMPLE", "xoxb-1234567890-abcdefghij", "github_pat_" + "A1" * 15, "gho_" + "x" * 36,
    "sk-proj-" + "Ab1" * 10, "eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0NTY3.abcDEF_-x",
])
def test_token_shapes_are_masked_anywhere(secret: str) -> None:
    out = redact_text("before (" + secret + ") after")
    assert out == "before (***) after"


@pytest.mark.parametrize("secret", [
    "abcdef.0123456789abcdef", "qz81kd.4mb0s2n7x3p9q1c6",  # kubeadm bootstrap tokens
    "AGE-SECRET-KEY-1" + "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L" * 2,  # an age (SOPS) identity
])
def test_more_token_shapes_are_masked_anywhere(secret: str) -> None:
    assert redact_text("kubeadm join 10.0.0.1:6443 --join " + secret + " now") == \
        "kubeadm join 10.0.0.1:6443 --join *** now"


@pytest.mark.parametrize("text", ["config.transformerslayer", "resnet.pretrainedweight", "abcdef.ghijklmnopqrstuv",
                                  "model1.checkpoint0000001"])
def test_names_with_a_dot_are_not_bootstrap_tokens(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize("text, expected", [
    ("{'host': 'pg', 'wachtwoord': 'Lantern-tundra'}", "{'host': 'pg', 'wachtwoord': '***'}"),  # nl
    ("conta = {'usuario': 'ml', 'senha': 'cinder'}", "conta = {'usuario': 'ml', 'senha': '***'}"),  # pt
    ("mot_de_passe = 'rosebud77'", "mot_de_passe = '***'"),  # fr
    ("# contraseña de respaldo: Lilac-cobalt", "# contraseña de respaldo: ***"),  # es, a comment
    ("# пароль от стенда: tulpan", "# пароль от стенда: ***"),  # ru
    ("note = '数据库密码：plumviolet'", "note = '数据库密码：***'"),  # zh, no space before the word
    ("parola = 'ciao'", "parola = 'ciao'"),  # it: `word`, not only a password: kept
])
def test_the_word_for_password_in_other_languages_names_a_secret(text: str, expected: str) -> None:
    assert redact_code.redact(text, redact_text) == expected


def test_private_key_block_is_masked_whole() -> None:
    out = redact_text("k=-----BEGIN OPENSSH PRIVATE KEY-----\nAAAAB3\nxyz\n-----END OPENSSH PRIVATE KEY----- done")
    assert "AAAAB3" not in out and out.endswith(" done")


def test_env_values() -> None:
    assert redact_env_value("NCCL_IB_AUTH_TOKEN", "x") == "***"
    assert redact_env_value("NCCL_SOCKET_IFNAME", "eth0") == "eth0"
    assert redact_env_value("NCCL_NET_PLUGIN_KEY", "8") == "8"  # weak name, numeric value
    assert secret_name("NCCL_SECRET") and not secret_name("NCCL_DEBUG")


@pytest.mark.parametrize("text", [
    'x "a.token", 5',
    'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\nValueError: bad batch token=s3cr3t-v4lue',
    "{'model.key': 3, 'password': 'hunter2hunter2'}",
])
def test_a_quoted_dotted_name_in_text_with_a_secret_word_is_kept_and_never_crashes(text: str) -> None:
    # the quoted-key rule has no separator group: a dotted key ("train.py", "a.token") once raised IndexError
    out = redact_text(text)
    assert "s3cr3t-v4lue" not in out and "hunter2hunter2" not in out
    assert ('"a.token", 5' in out) if text.startswith("x ") else True
    assert ('File "train.py", line 9' in out) if "train.py" in text else True


# Issue 25: a name that merely contains a secret word keeps a value that is safe by the default-deny rule, and a
# source line keeps its shape. Each of these must come out exactly as it went in, on the node.
@pytest.mark.parametrize("argv", [
    ["--token-limit", "512"], ["--num-key-value-heads", "8"], ["--auth-mode", "none"], ["--pass-count", "3"],
    ["--private-key-file", "/etc/ssl/private/node.pem"], ["ssh", "-p", "2222", "host"], ["mkdir", "-p", "/x/y"],
    ["gcc", "-pthread", "-pipe", "x.c"], ["curl", "-u", "deploy", "https://x"],
])
def test_names_that_mention_a_secret_keep_safe_values(argv: list) -> None:
    assert redact_argv(argv) == argv


@pytest.mark.parametrize("name, value", [
    ("key", "'input_ids'"), ("token_count", "4096"), ("pass_idx", "3"), ("auth_mode", "'none'"),
    ("cache_key", "'layer3'"), ("signature_version", "'v4'"), ("token_ids", "[101, 2023, 102]"),
    ("batch_keys", "['input_ids', 'attention_mask', 'labels']"), ("pad_token_id", "0"),
])
def test_ordinary_locals_under_secret_looking_names(name: str, value: str) -> None:
    from workers.redact import redact_named

    assert redact_named(name, value) == value


@pytest.mark.parametrize("line, expected", [
    ("key = batch['input_ids']", "key = batch['input_ids']"),
    ("key_states = self.k_proj(hidden_states)", "key_states = self.k_proj(hidden_states)"),
    ("password = os.environ[\"DB_PASSWORD\"]", "password = os.environ[\"DB_PASSWORD\"]"),
    ('os.environ["WANDB_API_KEY"] = "v3lvet7harbor"', 'os.environ["WANDB_API_KEY"] = "***"'),
    ("cfg['password'] = 'v3lvet7harbor'", "cfg['password'] = '***'"),
    ("settings.psk = 'v3lvet7harbor'  # rotated", "settings.psk = '***'  # rotated"),
    ('smtp.login(user, "v3lvet7harbor")', 'smtp.login(user, "***")'),
    ('run(["psql", "--password", "v3lvet7harbor", "-h", "db"])', 'run(["psql", "--password", "***", "-h", "db"])'),
    ('run(["mysql", "-u", "root", "-pv3lvet7harbor", "analytics"])', 'run(["mysql", "-u", "root", "-p***", "analytics"])'),
    ("token = get_token()  # password: v3lvet7harbor", "token = get_token()  # password: ***"),
])
def test_source_lines_keep_their_shape(line: str, expected: str) -> None:
    from workers.redact import redact_source

    assert redact_source(line) == expected


@pytest.mark.parametrize("argv, expected", [
    (["mysql", "-u", "root", "-pS3cret9x", "analytics"], ["mysql", "-u", "root", "-p***", "analytics"]),
    (["sshpass", "-p", "v3lvet7harbor", "ssh", "h"], ["sshpass", "-p", "***", "ssh", "h"]),
    (["curl", "-u", "admin:v3lvet7harbor", "https://x"], ["curl", "-u", "admin:***", "https://x"]),
    (["--passcode", "v3lvet7harbor"], ["--passcode", "***"]), (["--psk", "v3lvet7harbor"], ["--psk", "***"]),
    (["amqp://svc:p@ss@word@mq:5672/v"], ["amqp://svc:***@mq:5672/v"]),
    (["scott/v3lvet7harbor@db.internal:1521/orcl"], ["scott/***@db.internal:1521/orcl"]),
    (["machine h login ops password v3lvet7harbor"], ["machine h login ops password ***"]),
])
def test_short_flags_url_forms_and_netrc_lines(argv: list, expected: list) -> None:
    assert redact_argv(argv) == expected


@pytest.mark.parametrize("text, expected", [
    # a command list's repr (a local, a log line): the flag and its value are items of the list
    ("['curl', '-u', 'ops:v3lvet7harbor', 'https://x']", "['curl', '-u', 'ops:***', 'https://x']"),
    ('["wget", "--user", "ops:v3lvet7harbor"]', '["wget", "--user", "ops:***"]'),
    ("curl -u ops:v3lvet7harbor https://x", "curl -u ops:*** https://x"),
    # host:port and name:version stay
    ("['psql', '-U', 'db:5432']", "['psql', '-U', 'db:5432']"), ("['pip', '--user', 'torch:2.1']", None),
])
def test_user_password_pairs_in_text_and_in_command_lists(text: str, expected: str) -> None:
    assert redact_text(text) == (text if expected is None else expected)


def _random_letter_tokens(n: int, length: int, seed: int) -> list:
    import random
    import string
    rnd = random.Random(seed)
    return ["".join(rnd.choice(string.ascii_letters) for _ in range(length)) for _ in range(n)]


@pytest.mark.parametrize("length", [12, 15, 20])
def test_random_letter_tokens_without_digits_are_masked_on_screens(length: int) -> None:
    """An OS thread name (gdb's `Thread N (... "name")`, /proc's comm) or a token glued to a word may be random
    letters alone, no digit: the screen net masks most of them (the shared outputs hide every one by default-deny).
    The rate is a property of the rule: 6 in 10 measured on random letters; a test below 5 in 10 is a regression."""
    tokens = [t for t in _random_letter_tokens(400, length, seed=length) if not (t.islower() or t.isupper())]
    masked = 0
    for t in tokens:
        out = redact_text(f'Thread 5 (Thread 0x7f00 (LWP 12) "{t}"): uploader-{t}')
        assert out.count(t) in (0, 2)  # the same rule at both places
        masked += t not in out
    assert masked >= 0.5 * len(tokens)


@pytest.mark.parametrize("name", ["ProcessGroupGloo", "NCCLWatchdogThread", "ConcurrentHashMap", "getAddrInfoEx",
                                  "QueueFeederThread", "SimpleXMLRPCServer", "GruvboxDarkStyle", "tkMessageBox",
                                  "CppWrapperCpu", "ThreadPoolExecutor"])
def test_camelcase_names_without_digits_stay_on_screens(name: str) -> None:
    text = f'Thread 3 (Thread 0x7f00 (LWP 12) "pt_main"): #0 {name}::run () at {name}.cpp:12'
    assert redact_text(text) == text
