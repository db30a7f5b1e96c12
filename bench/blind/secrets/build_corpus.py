"""Writes corpus.json beside this file (run once; the committed corpus.json is the corpus).

Written blind: without reading hangscope's redactor or its tests, only its README, --help and the existing
corpus's shapes (tests/data/secrets_corpus.json, to stay away from them). Every secret is a random marker from
a seeded source, in a realistic shape; `fragments` are distinctive pieces (>= 8 chars) that count as a
partial leak. `anchor` is non-secret text that sits next to the value where it is planted: seen in an
output, it proves hangscope read that spot (so a leak was possible there).

Targets (rank processes run.py starts): T0 trainer (argv, locals, threads), T1 server (process title,
comm, env, threads), T2 native (module-level loop, globals, a C library for gdb), T3 client (socket
traffic for strace), T4 paths (token in directory and file names, elastic error file).
"""

import base64
import json
import os
import random
import string

R = random.Random(20260509)
AL = string.ascii_letters + string.digits


def aln(n):
    return "".join(R.choice(AL) for _ in range(n))


def low(n):
    return "".join(R.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def up(n):
    return "".join(R.choice(string.ascii_uppercase + string.digits) for _ in range(n))


def hx(n):
    return "".join(R.choice("0123456789abcdef") for _ in range(n))


def b64(n):
    return "".join(R.choice(AL + "+/") for _ in range(n))


def b64u(n):
    return "".join(R.choice(AL + "-_") for _ in range(n))


def wordpw():
    words = ["Marigold", "Lantern", "Tuesday", "Harbor", "Pepper", "Walrus", "Crimson", "Velvet", "Otter",
             "Juniper", "Saffron", "Glacier", "Biscuit", "Falcon", "Meadow", "Nimbus"]
    return R.choice(words) + R.choice(["!", "-", "_", "."]) + R.choice(words).lower() + str(R.randint(10, 99))


SECRETS = []
ORDINARY = []


def frag(v, start=None, n=10):
    """A distinctive piece of v: from `start` (default: the middle) n chars."""
    if start is None:
        start = max(0, (len(v) - n) // 2)
    return v[start:start + n]


def S(id, channel, shape, target, plant, value, anchor, fragments=None, note=None):
    if fragments is None:
        fragments = [frag(value)] if len(value) >= 12 else []
    for f in fragments:
        assert f in value and len(f) >= 8, (id, f)
    if channel == "env":  # the variable as hangscope lists it (NAME=value), not the name anywhere
        anchor = plant["env"][0] + "="
    e = {"id": id, "channel": channel, "shape": shape, "target": target, "plant": plant, "value": value,
         "fragments": fragments, "anchor": anchor}
    if note:
        e["note"] = note
    SECRETS.append(e)


def O(id, channel, what, target, plant, value, anchor, near=None):
    e = {"id": id, "channel": channel, "what": what, "target": target, "plant": plant, "value": value,
         "anchor": anchor}
    if near:
        e["near"] = near
    ORDINARY.append(e)


# ---------------------------------------------------------------- argv (T0 mostly; T3, T4 too)
v = "W" + aln(11)
S("argv-01", "argv", "mysql-style -pSECRET glued short flag", "T0", {"argv": ["-u", "root", "-p" + v]}, v, "-u root")
v = aln(9) + "x"
S("argv-02", "argv", "sshpass-style -p and value as two words", "T0", {"argv": ["-p", v]}, v, "-u root")
v = "hvs." + aln(24)
S("argv-03", "argv", "--token=<Vault service token hvs.>", "T0", {"argv": ["--token=" + v]}, v, "--token")
pw = aln(14)
S("argv-04", "argv", "positional mongodb+srv URL with credentials", "T0",
  {"argv": ["mongodb+srv://svc_train:%s@cluster0.ab1cd.mongodb.net/metrics?retryWrites=true" % pw]}, pw,
  "cluster0.ab1cd.mongodb.net")
pw = "p@ss" + aln(10)
S("argv-05", "argv", "amqp URL whose password holds a raw '@'", "T0",
  {"argv": ["--broker", "amqp://celery:%s@rabbit.internal:5672//" % pw]}, pw, "--broker",
  fragments=[pw[4:14]])
tok = hx(40)
S("argv-06", "argv", "token as the URL's user (https://TOKEN@host)", "T0",
  {"argv": ["--repo", "https://%s@git.internal/ml/ckpt.git" % tok]}, tok, "git.internal/ml/ckpt.git")
pw = wordpw()
S("argv-07", "argv", "Oracle-style user/password@host DSN, positional", "T0",
  {"argv": ["scott/%s@orcl-db:1521/TRAIN" % pw]}, pw, "orcl-db:1521/TRAIN", fragments=[pw[:9]])
sk = b64(40)
S("argv-08", "argv", "JSON argument with a terse key ('sk')", "T0",
  {"argv": ["--storage-json", json.dumps({"s3": {"endpoint": "https://s3.internal", "ak": "minio-ml",
                                                  "sk": sk}})]}, sk, "--storage-json")
v = wordpw()
S("argv-09", "argv", "--passcode and a word-like value", "T0", {"argv": ["--passcode", v]}, v, "--passcode",
  fragments=[v[:9]])
v = aln(16)
S("argv-10", "argv", "--psk (pre-shared key)", "T0", {"argv": ["--psk", v]}, v, "--psk")
v = "0x" + hx(64)
S("argv-11", "argv", "--privkey with a 0x hex private key", "T0", {"argv": ["--privkey", v]}, v, "--privkey")
v = "v4.local." + b64u(48)
S("argv-12", "argv", "PASETO token under --bearer", "T0", {"argv": ["--bearer", v]}, v, "--bearer")
t = aln(24)
S("argv-13", "argv", "Slack webhook URL: the token is the last path segment", "T0",
  {"argv": ["--notify", "https://hooks.slack.com/services/T04BLND2K/B07QX9M3ZPL/" + t]}, t,
  "hooks.slack.com/services")
t = b64u(68)
S("argv-14", "argv", "Discord webhook URL with id and token in the path", "T0",
  {"argv": ["--alert-url=https://discord.com/api/webhooks/1207749311182516224/" + t]}, t, "discord.com/api/webhooks")
pw = aln(13)
S("argv-15", "argv", "libpq conninfo string as one argument", "T3",
  {"argv": ["--feature-store", "host=pg.internal port=5432 dbname=feat user=svc password=%s sslmode=require" % pw]},
  pw, "--feature-store")
pw = aln(15)
S("argv-16", "argv", "helm-style --set with a dotted key", "T3", {"argv": ["--set", "auth.rootPassword=" + pw]}, pw,
  "auth.rootPassword")
k = b64(86) + "=="
S("argv-17", "argv", "Azure storage connection string (AccountKey=)", "T3",
  {"argv": ["--azure-conn", "DefaultEndpointsProtocol=https;AccountName=blindsa;AccountKey=%s;"
                            "EndpointSuffix=core.windows.net" % k]}, k, "AccountName=blindsa",
  fragments=[k[:10], k[40:50]])
body = b64(64)
pem = "-----BEGIN PRIVATE KEY-----\n" + body + "\n-----END PRIVATE KEY-----\n"
S("argv-18", "argv", "GCP service-account JSON with private_key (PEM, \\n-escaped) as an argument", "T3",
  {"argv": ["--sa-json", json.dumps({"type": "service_account", "project_id": "blind-ml",
                                     "private_key_id": "k1", "private_key": pem,
                                     "client_email": "trainer@blind-ml.iam.gserviceaccount.com"})]},
  body, "blind-ml.iam.gserviceaccount.com", fragments=[body[:10], body[30:40]])
pw = aln(12)
S("argv-19", "argv", "curl-style -u user:password", "T4", {"argv": ["-u", "admin:" + pw]}, pw, "admin:")
sig = b64(43)
S("argv-20", "argv", "Azure SAS query string (sig=) as an argument", "T4",
  {"argv": ["--sas", "sv=2022-11-02&ss=b&srt=sco&sp=rl&se=2030-01-01T00:00:00Z&sig=%s%%3D" % sig]}, sig, "--sas")
pw = aln(12)
S("argv-21", "argv", "netrc line as one argument", "T4",
  {"argv": ["--netrc-line", "machine hub.internal login bot password " + pw]}, pw, "machine hub.internal")

# ---------------------------------------------------------------- environment
pw = aln(14)
S("env-01", "env", "token in the query of the rendezvous endpoint", "T1",
  {"env": ["TORCHELASTIC_RDZV_ENDPOINT", "rdzv.internal:2379?auth_token=" + pw]}, pw, "TORCHELASTIC_RDZV_ENDPOINT")
pw = "x#" + aln(12)
S("env-02", "env", "PET_ (torchrun) endpoint URL with user:password", "T1",
  {"env": ["PET_RDZV_ENDPOINT", "etcd-v2://svc:%s@etcd.internal:2379" % pw]}, pw, "PET_RDZV_ENDPOINT",
  fragments=[pw[2:12]])
hf = "hf_" + aln(34)
S("env-03", "env", "HF token glued into the SLURM job name", "T1", {"env": ["SLURM_JOB_NAME", "ft-llama_" + hf]}, hf,
  "SLURM_JOB_NAME")
p = "pypi-AgEIcHlwaS5vcmc" + b64u(60)
S("env-04", "env", "PyPI token as the user of PIP_INDEX_URL", "T1",
  {"env": ["PIP_INDEX_URL", "https://__token__:%s@pypi.internal/simple" % p]}, p, "PIP_INDEX_URL",
  fragments=[p[22:34]])
pw = aln(13)
S("env-05", "env", "MLflow tracking URI with credentials", "T1",
  {"env": ["MLFLOW_TRACKING_URI", "https://ml:%s@mlflow.internal" % pw]}, pw, "MLFLOW_TRACKING_URI")
v = hx(40)
S("env-06", "env", "WANDB_API_KEY (40 hex)", "T1", {"env": ["WANDB_API_KEY", v]}, v, "WANDB_API_KEY")
pw = aln(12)
S("env-07", "env", "free-text variable with AWS creds (harmless name)", "T1",
  {"env": ["RUN_NOTES", "resume from s3://ckpt; creds AKIA%s/%s" % (up(16), pw)]}, pw, "RUN_NOTES")
v = wordpw()
S("env-08", "env", "SSHPASS (sshpass reads it; no secret word in the name)", "T1", {"env": ["SSHPASS", v]}, v,
  "SSHPASS", fragments=[v[:9]])
v = aln(20)
S("env-09", "env", "REDISCLI_AUTH", "T1", {"env": ["REDISCLI_AUTH", v]}, v, "REDISCLI_AUTH")
v = "FwoGZXIvYXdzE" + b64(80)
S("env-10", "env", "AWS_SESSION_TOKEN (long base64)", "T1", {"env": ["AWS_SESSION_TOKEN", v]}, v,
  "AWS_SESSION_TOKEN", fragments=[v[14:26]])
t = hx(32)
S("env-11", "env", "token in a path under an NCCL variable", "T1",
  {"env": ["NCCL_DEBUG_FILE", "/scratch/nccl-%s/%%h.%%p.log" % t]}, t, "NCCL_DEBUG_FILE")
pw = aln(12)
S("env-12", "env", "URL password under a custom TORCH_-prefixed variable", "T3",
  {"env": ["TORCH_STORE_URL", "tcp://root:%s@127.0.0.1:29533" % pw]}, pw, "TORCH_STORE_URL")

# ---------------------------------------------------------------- locals
L = lambda id, shape, target, frame, code, value, anchor, **kw: S(id, "locals", shape, target,
                                                                 {"local": frame, "code": code}, value, anchor, **kw)
v = wordpw()
L("loc-01", "str under 'passcode'", "T0", "fetch_batch", "passcode = %r" % v, v, "passcode", fragments=[v[:9]])
v = "0x" + hx(64)
L("loc-02", "hex private key under 'privkey'", "T0", "fetch_batch", "privkey = %r" % v, v, "privkey")
v = aln(18)
L("loc-03", "str under 'psk'", "T0", "fetch_batch", "psk = %r" % v, v, "psk")
pw = aln(13)
L("loc-04", "nested dict/list: nodes[].ssh.pass", "T0", "run_training",
  "cluster_cfg = {'nodes': [{'name': 'n1', 'ssh': {'user': 'root', 'pass': %r}}], 'retries': 3}" % pw, pw,
  "cluster_cfg")
pw = wordpw()
L("loc-05", "4-tuple (host, port, user, password)", "T0", "run_training",
  "dsn_parts = ('db.internal', 5432, 'svc', %r)" % pw, pw, "dsn_parts", fragments=[pw[:9]])
pw = aln(14)
L("loc-06", "dataclass instance whose repr holds the password", "T0", "run_training",
  "db_cfg = DbCfg(host='db.internal', password=%r)" % pw, pw, "db_cfg")
t = aln(16)
L("loc-07", "plain object whose attribute holds a token", "T0", "wait_for_peer",
  "client = ApiClient('https://api.internal', %r)" % t, t, "client")
pw = aln(12)
L("loc-08", "f-string result: URL built with the password", "T0", "wait_for_peer",
  "conn_url = f\"mysql://svc:{_lookup(%r)}@db.internal/train\"" % pw, pw, "conn_url")
t = aln(32)
L("loc-09", "header dict {'Authorization': 'Bearer ...'}", "T1", "poll_queue",
  "hdrs = {'Authorization': 'Bearer %s', 'Accept': 'application/json'}" % t, t, "hdrs")
t = hx(40)
L("loc-10", "header dict, lowercase 'authorization: token ...'", "T1", "poll_queue",
  "req_headers = {'authorization': 'token %s', 'user-agent': 'blind/1.0'}" % t, t, "req_headers")
v = aln(14)
L("loc-11", "bytes: a RESP AUTH command", "T1", "poll_queue", "raw_cmd = b'AUTH default %s\\r\\n'" % v, v, "raw_cmd")
pw = aln(12)
L("loc-12", "command list ['mysql', '-u', 'root', '-pSECRET']", "T1", "serve_forever",
  "argv_used = ['mysql', '-u', 'root', '-p%s', 'train']" % pw, pw, "argv_used")
t = "shpat_" + hx(32)
L("loc-13", "set holding a Shopify token", "T1", "serve_forever", "seen_tokens = {%r}" % t, t, "seen_tokens",
  fragments=[t[6:16]])
pw = aln(12)
L("loc-14", "Russian text: 'Пароль: ...'", "T3", "sync_state", "msg_ru = 'Пароль для входа: %s'" % pw, pw, "msg_ru")
pw = aln(12)
L("loc-15", "Japanese text with the password inline, no '=' or ':'", "T3", "sync_state",
  "note_ja = 'パスワードは%sです'" % pw, pw, "note_ja")
u, pw = "svc-ml", aln(14)
cred = base64.b64encode(("%s:%s" % (u, pw)).encode()).decode()
L("loc-16", "base64 of user:password, no 'Basic' prefix", "T3", "sync_state", "basic_b64 = %r" % cred, cred,
  "basic_b64", fragments=[cred[8:18]])
pw = "p@" + aln(12)
L("loc-17", "proxy URL whose password holds a raw '@'", "T3", "await_barrier",
  "proxy = 'http://bob:%s@proxy.internal:3128'" % pw, pw, "proxy", fragments=[pw[2:12]])
t = aln(32)
L("loc-18", "OAuth response text with refresh_token", "T3", "await_barrier",
  "resp_text = '{\"refresh_token\": \"%s\", \"expires_in\": 3600}'" % t, t, "resp_text")
body = b64(64)
L("loc-19", "PGP private key block", "T4", "check_links",
  "armored = '-----BEGIN PGP PRIVATE KEY BLOCK-----\\n\\nlQVYBG%s\\n-----END PGP PRIVATE KEY BLOCK-----'" % body,
  body, "armored", fragments=[body[:10]])
v = hx(8) + "Q~" + b64u(30)
L("loc-20", "Azure AD client secret (xxxQ~...) under a harmless name", "T4", "check_links", "value = %r" % v, v,
  "ckpt_path")
v = "dop_v1_" + hx(64)
L("loc-21", "DigitalOcean token under 'item'", "T4", "check_links", "item = %r" % v, v, "ckpt_path", fragments=[v[7:19]])
v = "SG." + b64u(22) + "." + b64u(43)
L("loc-22", "SendGrid key under 'line'", "T4", "main_wait", "line = %r" % v, v, "token_ids", fragments=[v[3:13]])
v = "dapi" + hx(32)
L("loc-23", "Databricks token in a list of mixed values", "T4", "main_wait",
  "row = ['ws-1', 42, %r, 0.5]" % v, v, "token_ids", fragments=[v[4:14]])
v = "sk-ant-api03-" + b64u(86)
L("loc-24", "Anthropic key inside a kwargs-like dict under 'x'", "T4", "main_wait",
  "x = {'model': 'claude', 'k': %r}" % v, v, "token_ids", fragments=[v[13:25]])
v = "npm_" + aln(36)
L("loc-25", "npm token as a function argument (arg named 'blob')", "T3", "await_barrier",
  "blob = _ident(%r)" % v, v, "blob", fragments=[v[4:14]])

# ---------------------------------------------------------------- module globals (T2: a top-level loop)
G = lambda id, shape, code, value, anchor, **kw: S(id, "globals", shape, "T2", {"global": code}, value, anchor, **kw)
t = aln(24)
G("glob-01", "str global: Slack webhook URL", "ALERT_HOOK = 'https://hooks.slack.com/services/T0BLND/B0BLND/%s'" % t,
  t, "ALERT_HOOK")
pw = wordpw()
G("glob-02", "str global: word-like service password", "SERVICE_PW = %r" % pw, pw, "SERVICE_PW", fragments=[pw[:9]])
pw = aln(13)
G("glob-03", "dict global with user/pass", "CREDS = {'user': 'svc', 'pass': %r}" % pw, pw, "CREDS")
G("glob-04", "int global: numeric account PIN", "ACCOUNT_PIN = 73915284", "73915284", "ACCOUNT_PIN",
  fragments=[])
sig = hx(64)
G("glob-05", "top-level loop variable: presigned S3 URL (X-Amz-Signature)",
  "SHARD_URLS = ['https://s3.internal/ckpt/shard-%%05d?X-Amz-Credential=AKIAIOSFODNN7BLIND&X-Amz-Signature=%s' %% i "
  "for i in range(4)]" % sig, sig, "shard_url")
v = aln(20)
G("glob-06", "bytes global: cached key", "_CACHED_KEY = %r" % v.encode(), v, "_CACHED_KEY")

# ---------------------------------------------------------------- source lines (dead or never-run code near frames)
def SRC(id, shape, target, frame, where, code, value, anchor, **kw):
    S(id, "source", shape, target, {"source": frame, "where": where, "code": code}, value, anchor, **kw)


v = hx(40)
SRC("src-01", "os.environ[...] = literal (subscript assignment)", "T0", "wait_for_peer", "before",
    "os.environ['WANDB_API_KEY'] = %r" % v, v, "os.environ['WANDB_API_KEY']")
v = wordpw()
SRC("src-02", "cfg['passcode'] = literal", "T0", "wait_for_peer", "before", "cfg['passcode'] = %r" % v, v,
    "cfg['passcode']", fragments=[v[:9]])
v = aln(12)
SRC("src-03", "command list literal ['psql', '--password', v]", "T0", "wait_for_peer", "before",
    "cmd = ['psql', '-h', 'db.internal', '--password', %r]" % v, v, "['psql', '-h'")
v = "glpat-" + b64u(20)
SRC("src-04", "PRIVATE-TOKEN header in a dict literal", "T0", "fetch_batch", "after",
    "headers = {'PRIVATE-TOKEN': %r}" % v, v, "PRIVATE-TOKEN", fragments=[v[6:16]])
body = b64(64)
SRC("src-05", "multi-line string: EC private key", "T0", "fetch_batch", "before",
    "KEY_PEM = '''-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI%s\n-----END EC PRIVATE KEY-----'''" % body, body,
    "KEY_PEM", fragments=[body[:10]])
pw = wordpw()
SRC("src-06", "literal password in a call: smtp.login(user, pw)", "T0", "run_training", "before",
    "smtp.login('alerts@corp.internal', %r)" % pw, pw, "smtp.login(", fragments=[pw[:9]])
pw = aln(12)
SRC("src-07", "libpq conninfo literal in connect()", "T0", "run_training", "after",
    "conn = psycopg2.connect('dbname=train user=svc password=%s host=db')" % pw, pw, "psycopg2.connect(")
k = b64(40)
SRC("src-08", "aws_secret_access_key= keyword in boto3.client()", "T1", "poll_queue", "after",
    "s3 = boto3.client('s3', aws_access_key_id='AKIAIOSFODNN7BLIND', aws_secret_access_key=%r)" % k, k,
    "boto3.client('s3'")
k = aln(32)
SRC("src-09", "HS256 signing key as a literal argument", "T1", "poll_queue", "after",
    "tok = jwt.encode(payload, %r, algorithm='HS256')" % k, k, "jwt.encode(payload")
v = aln(14)
SRC("src-10", "secret in a comment", "T1", "poll_queue", "before", "# TODO rotate: the old broker key was %s" % v, v,
    "TODO rotate")
pw = aln(12)
SRC("src-11", "HTTPBasicAuth('svc', literal)", "T1", "serve_forever", "before",
    "r = requests.post(url, auth=HTTPBasicAuth('svc', %r))" % pw, pw, "HTTPBasicAuth(")
v = hx(64)
SRC("src-12", "bytes.fromhex literal into opts['privkey']", "T1", "serve_forever", "before",
    "opts['privkey'] = bytes.fromhex(%r)" % v, v, "opts['privkey']")
v = aln(16)
SRC("src-13", "attribute assignment: settings.psk = literal", "T3", "sync_state", "before",
    "settings.psk = %r" % v, v, "settings.psk")
pw = aln(12)
SRC("src-14", "f-string with the password inline", "T3", "sync_state", "before",
    "url = f'https://{user}:%s@registry.internal/v2/'" % pw, pw, "registry.internal/v2/")
pw = aln(13)
SRC("src-15", "base64.b64encode(b'user:pw') literal", "T3", "await_barrier", "before",
    "DOCKER_AUTH = base64.b64encode(b'bot:%s')" % pw, pw, "DOCKER_AUTH")
pw = aln(12)
SRC("src-16", "multi-line netrc text", "T3", "await_barrier", "after",
    "NETRC = '''machine hub.internal\n  login bot\n  password %s'''" % pw, pw, "machine hub.internal")
pw = aln(12)
SRC("src-17", "Chinese comment holding the password", "T4", "check_links", "before", "# 数据库密码 %s" % pw, pw,
    "数据库密码")
t = "%d:AA%s" % (R.randint(10 ** 9, 10 ** 10 - 1), b64u(33))
SRC("src-18", "Telegram bot token in a URL path", "T4", "check_links", "after",
    "api = 'https://api.telegram.org/bot%s/sendMessage'" % t, t, "api.telegram.org/bot", fragments=[t[13:23]])
k = aln(24)
SRC("src-19", "HMAC key as a bytes literal in hmac.new()", "T4", "main_wait", "before",
    "sig = hmac.new(b'%s', msg, 'sha256').hexdigest()" % k, k, "hmac.new(")
k = b64(40)
SRC("src-20", "dotted config key string: spark s3a secret.key", "T4", "main_wait", "after",
    "conf.set('spark.hadoop.fs.s3a.secret.key', %r)" % k, k, "spark.hadoop.fs.s3a")
pw = wordpw()
SRC("src-21", "sshpass -p inside a shell command string", "T4", "main_wait", "after",
    "subprocess.run(\"sshpass -p '%s' ssh bot@bastion uptime\", shell=True)" % pw, pw, "sshpass -p",
    fragments=[pw[:9]])

# ---------------------------------------------------------------- Python thread names
TH = lambda id, shape, target, name, value, anchor, **kw: S(id, "thread", shape, target, {"thread": name}, value,
                                                             anchor, **kw)
t = hx(40)
TH("thr-01", "token as URL user in a thread name", "T0", "git-push https://%s@git.internal/ml/ckpt.git" % t, t,
   "git-push")
pw = aln(12)
TH("thr-02", "amqp URL with password in a thread name", "T0", "amqp-consumer amqp://ml:%s@mq:5672/" % pw, pw,
   "amqp-consumer")
v = "dop_v1_" + hx(64)
TH("thr-03", "DigitalOcean token glued into a thread name", "T1", "rotate-" + v, v, "rotate-", fragments=[v[7:19]])
v = aln(22)
TH("thr-04", "ticket= query in a thread name", "T1", "ws-listener?ticket=" + v, v, "ws-listener")
pw = wordpw()
TH("thr-05", "user/password DSN in a thread name", "T1", "login svc/%s@orcl" % pw, pw, "login svc/",
   fragments=[pw[:9]])

# ---------------------------------------------------------------- OS thread names (comm, 15 bytes)
v = aln(12)
S("comm-01", "comm", "OS name of a Python thread: 'pg:' + password", "T0", {"comm": "pg:" + v}, v, {"gdb_of": "T0"},
  fragments=[v[:10]])
v = aln(11)
S("comm-02", "comm", "main thread comm via prctl: 'psk=' + key", "T1", {"main_comm": "psk=" + v}, v,
  {"gdb_of": "T1"}, fragments=[v[:10]])
v = aln(10)
S("comm-03", "comm", "native (pthread) thread name: 'AUTH ' + password", "T2", {"native_thread": "AUTH " + v}, v,
  {"gdb_of": "T2"}, fragments=[v[:10]])
v = aln(15)
S("comm-04", "comm", "OS name of a Python thread: a bare 15-char token", "T1", {"comm": v}, v, {"gdb_of": "T1"},
  fragments=[v[:10]])

# ---------------------------------------------------------------- process title (T1 rewrites its argv)
pw = aln(13)
S("title-01", "title", "process title: postgres URL with password", "T1", {"title": "conn postgres://svc:%s@pg:5432/feat" % pw},
  pw, "ml-serve:")
v = aln(20)
S("title-02", "title", "process title: 'auth <token>' words", "T1", {"title": "auth " + v}, v, "ml-serve:")
t = aln(24)
S("title-03", "title", "process title: webhook token in a URL path", "T1", {"title": "hook https://hooks.example.com/T0/B0/" + t},
  t, "ml-serve:")
v = hx(32)
S("title-04", "title", "process title: sig=<hex>", "T1", {"title": "sig=" + v}, v, "ml-serve:")

# ---------------------------------------------------------------- stderr tails (a file; the last traceback on)
pw = aln(13)
S("err-01", "stderr", "CalledProcessError: command list with a URL password", "T0",
  {"stderr": "called_process", "cmd": ["psql", "postgresql://svc:%s@db.internal/train" % pw, "-c", "select 1"]},
  pw, "returned non-zero exit status")
pw = wordpw()
S("err-02", "stderr", "log line 'password <v>' after the traceback (no '=' or ':')", "T0",
  {"stderr": "line", "line": "WARNING retrying login for svc with password %s" % pw}, pw, "retrying login for svc",
  fragments=[pw[:9]])
v = aln(14)
S("err-03", "stderr", "ConnectionError message with ?apikey= in the URL", "T1",
  {"stderr": "raise", "exc": "ConnectionError",
   "msg": "HTTPSConnectionPool(host='hooks.internal', port=443): Max retries exceeded with url: "
          "/notify?apikey=%s&channel=ml" % v}, v, "HTTPSConnectionPool")
v = aln(10)
S("err-04", "stderr", "log line '(passcode <v>)' after the traceback", "T1",
  {"stderr": "line", "line": "INFO login ok for svc-train (passcode %s)" % v}, v, "login ok for svc-train",
  fragments=[v])
t = "rk_live_" + aln(24)
S("err-05", "stderr", "KeyError whose message is the bare token", "T2", {"stderr": "raise", "exc": "KeyError", "msg": t}, t,
  "KeyError", fragments=[t[8:18]])
pw = aln(12)
S("err-06", "stderr", "logfmt line with an Oracle DSN", "T2",
  {"stderr": "line", "line": 'level=warn msg="retry" dsn="svc/%s@orcl-db:1521/TRAIN" attempt=3' % pw}, pw,
  'msg="retry"')
k = aln(16)
S("err-07", "stderr", "first exception of a chain (before the last 'Traceback')", "T3",
  {"stderr": "chain_first", "exc": "PermissionError", "msg": "vault login failed for role ml: secret_id=%s" % k}, k,
  "vault login failed")
v = aln(20)
S("err-08", "stderr", "AssertionError message with ?key= in a URL (raised from the chain's first)", "T3",
  {"stderr": "raise", "exc": "AssertionError", "msg": "expected 200 from https://api.internal/v1/models?key=%s" % v},
  v, "expected 200 from")
pw = aln(14)
S("err-09", "stderr", "validation error echoing input_value", "T4",
  {"stderr": "raise", "exc": "ValueError",
   "msg": "1 validation error for DbSettings\ndsn\n  Input should be a valid URL [type=url_parsing, "
          "input_value='postgres:/svc:%s@db', input_type=str]" % pw}, pw, "validation error for DbSettings")
pw = aln(12)
S("err-10", "stderr", "Japanese log line: 'パスワード=<v>'", "T4", {"stderr": "line", "line": "ERROR 認証失敗: パスワード=%s" % pw}, pw,
  "認証失敗")
t = aln(26)
S("err-11", "stderr", "torchelastic error file: message with a bearer token", "T4",
  {"elastic": "message", "text": "ValueError: invalid bearer %s for https://api.internal" % t}, t,
  "invalid bearer")
pw = aln(12)
S("err-12", "stderr", "torchelastic error file: py_callstack source line with a literal password", "T4",
  {"elastic": "callstack", "text": "    login(user='svc', password='%s')" % pw}, pw, "login(user='svc'")

# ---------------------------------------------------------------- strace payloads (T3's client thread; 64 bytes kept)
def ST(id, shape, payload, value, anchor, side="send", **kw):
    raw = payload.encode("utf-8")
    S(id, "strace", shape, "T3", {side: payload}, value, anchor, **kw)


pw = aln(16)
ST("str-01", "Redis AUTH user password (inline)", "AUTH default %s\r\n" % pw, pw, "AUTH default")
pw = aln(20)
ST("str-02", "Redis RESP array AUTH", "*3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$20\r\n%s\r\n" % pw, pw, "$7",
   fragments=[pw[:10]])
pw = aln(14)
ST("str-03", "IMAP LOGIN user password", "a001 LOGIN svc@corp.internal %s\r\n" % pw, pw, "a001 LOGIN")
u, pw = "alerts", aln(12)
plain = base64.b64encode(("\0%s\0%s" % (u, pw)).encode()).decode()
ST("str-04", "SMTP AUTH PLAIN base64(\\0user\\0pass)", "AUTH PLAIN %s\r\n" % plain, plain, "AUTH PLAIN",
   fragments=[plain[8:18]])
pw = aln(14)
lg = base64.b64encode(pw.encode()).decode()
ST("str-05", "SMTP AUTH LOGIN: the base64 password line alone", "%s\r\n" % lg, lg, {"strace_of": "T3"},
   fragments=[lg[:10]], note="a bare base64 line: nothing beside it to anchor on; read if the strace channel is")
pw = aln(15)
ST("str-06", "SASL PLAIN raw bytes \\0user\\0pass (Kafka/AMQP)", "\0svc-kafka\0%s" % pw, pw, "svc-kafka")
b = base64.b64encode(("ops:" + aln(12)).encode()).decode()
ST("str-07", "Proxy-Authorization: Basic in a CONNECT request", "CONNECT a:443 HTTP/1.1\r\nProxy-Authorization: Basic %s\r\n\r\n" % b,
   b, "CONNECT a:443", fragments=[b[:10]])
v = "hvs." + aln(24)
ST("str-08", "X-Vault-Token header in a request", "GET /v1/kv HTTP/1.1\r\nX-Vault-Token: %s\r\n\r\n" % v, v,
   "GET /v1/kv", fragments=[v[4:14]])
v = aln(20)
ST("str-09", "PRIVATE-TOKEN header (GitLab) in a request", "GET /api/v4 HTTP/1.1\r\nPRIVATE-TOKEN: %s\r\n\r\n" % v, v,
   "GET /api/v4")
v = aln(40)
js = '{"model":"blind-7b","step":1200,"hf_write_token":"%s"}' % v
cut = 64 - js.index(v)
ST("str-10", "JSON cut mid-value at the 64-byte limit", js, v, '"model":"blind-7b"', fragments=[v[:cut]])
pw = aln(14)
ST("str-11", "NATS CONNECT JSON with pass", 'CONNECT {"user":"svc","pass":"%s","verbose":false}\r\n' % pw, pw,
   "CONNECT {")
pw = aln(14)
ST("str-12", "STOMP CONNECT frame with passcode header", "CONNECT\naccept-version:1.2\nlogin:svc\npasscode:%s\n\n\0" % pw,
   pw, "accept-version:1.2")
pw = aln(14)
ST("str-13", "ZooKeeper addauth digest user:password", "addauth digest svc:%s\n" % pw, pw, "addauth digest")
proof = b64(43) + "="
ST("str-14", "MongoDB SCRAM client-final proof", "c=biws,r=%s,p=%s" % (aln(8), proof), proof, "c=biws",
   fragments=[proof[:10]])
pw = aln(16)
ST("str-15", "reply (read side): Redis CONFIG GET requirepass", "*2\r\n$11\r\nrequirepass\r\n$16\r\n%s\r\n" % pw, pw,
   "requirepass", side="reply")
t = "gho_" + aln(36)
ST("str-16", "reply (read side): form-encoded OAuth token", "access_token=%s&scope=repo&token_type=bearer" % t, t,
   "access_token", side="reply", fragments=[t[4:16]])

# ---------------------------------------------------------------- gdb (T2's C library frame, built with -g)
pw = aln(14)
S("gdb-01", "gdb", "char* argument: the command line sent (AUTH)", "T2", {"gdb": "sent_line", "text": "AUTH svc %s" % pw},
  pw, "sent_line=")
pw = aln(14)
S("gdb-02", "gdb", "recv() buffer argument holding the last reply read", "T2",
  {"gdb": "buf", "text": "LOGIN svc %s OK" % pw}, pw, "LOGIN svc")
pw = aln(13)
S("gdb-03", "gdb", "ADO.NET connection string argument", "T2",
  {"gdb": "conn_str", "text": "Server=db;Database=ml;User Id=svc;Password=%s;" % pw}, pw, "Server=db;Database=ml")
k = hx(40)
S("gdb-04", "gdb", "char[] local (bt full only): HMAC key line", "T2", {"gdb": "scratch", "text": "HMAC %s" % k}, k,
  "scratch = ")
t = aln(24)
S("gdb-05", "gdb", "char* argument under a harmless name (label) holding a token", "T2",
  {"gdb": "peer_hint", "text": t}, t, "peer_hint=")

# ---------------------------------------------------------------- paths
t = aln(24)
S("path-01", "paths", "directory named after a Slack webhook token (script path)", "T4", {"path": "script_dir", "token": t}, t,
  "T04BLND2K/B07QX9M3ZPL")
t = "%d:AA%s" % (R.randint(10 ** 9, 10 ** 10 - 1), b64u(33))
S("path-02", "paths", "module file named after a Telegram bot token", "T4", {"path": "module_file", "token": t}, t, "tg_bot_",
  fragments=[t[13:23]])
t = hx(40)
S("path-03", "paths", "working directory named after a token", "T4", {"path": "cwd", "token": t}, t, "/cwd/run-")
t = aln(28)
S("path-04", "paths", "stderr log file named after a presigned signature", "T3", {"path": "stderr_file", "token": t}, t,
  "upload-log-")

# ================================================================ ordinary values (must stay visible)
# `value` must be seen; with `near`, right after that name (separated by spaces, quotes, '=', ':' or ',').
# `anchor`: text that proves the spot is shown in an output (where the value is then expected).
def OA(id, what, target, flag, val, anchor=None):
    O(id, "argv", what, target, {"argv": [flag, val]}, val, anchor or flag, near=flag)


def OE(id, what, target, name, val):
    O(id, "env", what, target, {"env": [name, val]}, val, name + "=", near=name)


def OL(id, what, target, frame, name, expr, val, anchor=None):
    O(id, "locals", what, target, {"local": frame, "code": "%s = %s" % (name, expr)}, val, anchor or name, near=name)


OA("ord-argv-01", "--token-limit 512", "T0", "--token-limit", "512")
OA("ord-argv-02", "a key file path (--private-key-file)", "T0", "--private-key-file", "/etc/ssl/private/blind-node.pem")
OA("ord-argv-03", "learning rate", "T0", "--lr", "0.00031")
OA("ord-argv-04", "model name", "T0", "--model-name", "llama-blind-7b")
OA("ord-argv-05", "--num-key-value-heads 8", "T0", "--num-key-value-heads", "8")
OA("ord-argv-06", "--auth-mode none", "T3", "--auth-mode", "none")
OA("ord-argv-07", "--pass-count 3", "T3", "--pass-count", "3")
OA("ord-argv-08", "output directory", "T3", "--output-dir", "/data/ckpt/blind-run-17")
OA("ord-argv-09", "host name", "T4", "--master-host", "gpu-node-17.cluster.local")
OA("ord-argv-10", "--max-tokens 2048", "T4", "--max-tokens", "2048")
OE("ord-env-01", "NCCL_DEBUG=INFO", "T0", "NCCL_DEBUG", "INFO")
OE("ord-env-02", "NCCL_SOCKET_IFNAME=lo", "T0", "NCCL_SOCKET_IFNAME", "lo")
OE("ord-env-03", "TORCH_DISTRIBUTED_DEBUG=DETAIL", "T1", "TORCH_DISTRIBUTED_DEBUG", "DETAIL")
OE("ord-env-04", "OMP_NUM_THREADS=2", "T1", "OMP_NUM_THREADS", "2")
OE("ord-env-05", "TOKENIZERS_PARALLELISM=false (TOKEN in the name)", "T3", "TOKENIZERS_PARALLELISM", "false")
OE("ord-env-06", "MASTER_PORT", "T0", "MASTER_PORT", "29533")
OL("ord-loc-01", "key = 'input_ids'", "T0", "fetch_batch", "key", "'input_ids'", "input_ids", anchor="token_count")
OL("ord-loc-02", "token_count = 4096", "T0", "fetch_batch", "token_count", "4096", "4096")
OL("ord-loc-03", "pass_idx = 3", "T0", "fetch_batch", "pass_idx", "3", "3")
OL("ord-loc-04", "auth_mode = 'none'", "T0", "run_training", "auth_mode", "'none'", "none")
OL("ord-loc-05", "cache_key = 'layer3'", "T1", "poll_queue", "cache_key", "'layer3'", "layer3")
OL("ord-loc-06", "learning rate float", "T1", "poll_queue", "lr", "0.00031", "0.00031", anchor="cache_key")
OL("ord-loc-07", "model name", "T3", "sync_state", "model_name", "'llama-blind-7b'", "llama-blind-7b")
OL("ord-loc-08", "step counter", "T3", "await_barrier", "step", "1234", "1234", anchor="hostname")
OL("ord-loc-09", "host name", "T3", "await_barrier", "hostname", "'gpu-node-17.cluster.local'",
   "gpu-node-17.cluster.local")
OL("ord-loc-10", "checkpoint path", "T4", "check_links", "ckpt_path", "'/data/ckpt/step_1234.pt'",
   "/data/ckpt/step_1234.pt")
OL("ord-loc-11", "key_len = 256", "T4", "check_links", "key_len", "256", "256")
OL("ord-loc-12", "list of batch keys", "T4", "main_wait", "keys", "['input_ids', 'attention_mask']", "attention_mask",
   anchor="token_ids")
OL("ord-loc-13", "token ids list", "T4", "main_wait", "token_ids", "[101, 2023, 102]", "101, 2023, 102")
OL("ord-loc-14", "tokenizer name", "T1", "serve_forever", "tokenizer_name", "'gpt2'", "gpt2")
OL("ord-loc-15", "signature_version = 'v4'", "T1", "serve_forever", "signature_version", "'v4'", "v4")
O("ord-glob-01", "globals", "iter_num = 4200 (int, counted by the top-level loop)", "T2", {"builtin": "T2 loop"},
  "4200", "iter_num", near="iter_num")
O("ord-glob-02", "globals", "shard_idx = 1717 (int, bound by the top-level loop)", "T2", {"builtin": "T2 loop"},
  "1717", "shard_idx", near="shard_idx")
O("ord-src-01", "source", "key = batch['input_ids']", "T0",
  {"source": "run_training", "where": "before", "code": "key = batch['input_ids']"}, "key = batch['input_ids']",
  "smtp.login(")
O("ord-src-02", "source", "os.environ['TOKENIZERS_PARALLELISM'] = 'false'", "T1",
  {"source": "serve_forever", "where": "after", "code": "os.environ['TOKENIZERS_PARALLELISM'] = 'false'"},
  "os.environ['TOKENIZERS_PARALLELISM'] = 'false'", "HTTPBasicAuth(")
O("ord-src-03", "source", "cfg['auth_mode'] = 'none'", "T3",
  {"source": "await_barrier", "where": "before", "code": "cfg['auth_mode'] = 'none'"}, "cfg['auth_mode'] = 'none'",
  "DOCKER_AUTH")
O("ord-src-04", "source", "tokens_per_iter = 524288", "T4",
  {"source": "check_links", "where": "after", "code": "tokens_per_iter = 524288"}, "tokens_per_iter = 524288",
  "数据库密码")
O("ord-src-05", "source", "the blocking call itself", "T0", {"builtin": "T0 blocking line"}, "return sock.recv(65536)",
  "sock = ctx['sock']")
O("ord-thr-01", "thread", "thread name", "T0", {"thread": "ckpt-writer-3"}, "ckpt-writer-3", "git-push")
O("ord-thr-02", "thread", "thread name with 'token' in it", "T1", {"thread": "token-bucket-refill"},
  "token-bucket-refill", "ws-listener")
O("ord-title-01", "title", "stage in the process title", "T1", {"title": "stage=warmup"}, "stage=warmup", "ml-serve:")
O("ord-err-01", "stderr", "log line with an attempt count", "T3",
  {"stderr": "line", "line": "INFO rank 3 giving up after 5 attempts"}, "giving up after 5 attempts", "expected 200 from")
O("ord-err-02", "stderr", "log line with a loss value", "T0", {"stderr": "line", "line": "INFO step 1200 loss 2.3174"},
  "INFO step 1200 loss 2.3174", "returned non-zero exit status")
O("ord-err-03", "stderr", "log line with max_tokens", "T2", {"stderr": "line", "line": "WARNING max_tokens=2048 truncated"},
  "max_tokens=2048 truncated", "KeyError")
O("ord-err-04", "stderr", "file and line of the traceback", "T1", {"builtin": "T1 stderr"}, "in write_stderr",
  "HTTPSConnectionPool")
O("ord-str-01", "strace", "HTTP health check", "T3", {"send": "GET /health HTTP/1.1\r\nHost: api\r\n\r\n"},
  "GET /health HTTP/1.1", "a001 LOGIN")
O("ord-str-02", "strace", "Redis PING", "T3", {"send": "PING\r\n"}, '"PING', "a001 LOGIN")
O("ord-str-03", "strace", "Redis +PONG reply", "T3", {"reply": "+PONG\r\n"}, "+PONG", "a001 LOGIN")
O("ord-gdb-01", "gdb", "the C function's name in gdb's frame", "T2", {"builtin": "gdb function"},
  "in blind_native_wait (fd=", "label=")
O("ord-gdb-02", "gdb", "an ordinary char* argument (shard label)", "T2", {"gdb": "label", "text": "shard-00017"},
  "shard-00017", "label=")
O("ord-path-01", "paths", "the code's file name", "T0", {"builtin": "script name"}, "train_blind.py", "wait_for_peer")
O("ord-path-02", "paths", "the code's directory", "T0", {"builtin": "script dir"}, "blind-targets/T0/train_blind.py",
  "wait_for_peer")

assert len({e["id"] for e in SECRETS + ORDINARY}) == len(SECRETS + ORDINARY)
# no 8-char window of one secret's fragments may occur in another entry's value
for a in SECRETS:
    for b in SECRETS + ORDINARY:
        if a is not b:
            for f in a["fragments"] + ([a["value"]] if len(a["value"]) >= 8 else []):
                assert f not in b["value"], (a["id"], b["id"])

out = {
    "about": "Blind secrets corpus for hangscope (bench/blind/secrets): written without reading the redactor or "
             "its tests; shapes chosen to differ from tests/data/secrets_corpus.json. Never tune the redactor "
             "against it. Values are seeded-random markers (seed 20260509) in realistic shapes. `fragments`: "
             "distinctive pieces (>= 8 chars) that count as a partial leak. `anchor`: non-secret text beside "
             "the value; seen in an output, it proves hangscope read that spot. run.py plants and checks.",
    "secrets": SECRETS,
    "ordinary": ORDINARY,
}
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "corpus.json"), "w") as f:
    json.dump(out, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(len(SECRETS), "secrets,", len(ORDINARY), "ordinary")
