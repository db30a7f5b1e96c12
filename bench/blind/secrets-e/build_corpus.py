#!/usr/bin/env python3
"""Writes corpus.json for blind secrets benchmark E (seeded; see README.md).

Every secret value is a seeded-random marker in a realistic 2026 shape: never a real credential. Written before
any run; do not regenerate it to chase a score.

    python3 bench/blind/secrets-e/build_corpus.py
"""

import base64
import binascii
import json
import os
import random
import string
import urllib.parse
import uuid

SEED = 2026112911
rng = random.Random(SEED)

UP, LO, DG = string.ascii_uppercase, string.ascii_lowercase, string.digits
AN = UP + LO + DG
HEX = "0123456789abcdef"
B64 = AN + "+/"
B64U = AN + "-_"


def r(alpha, n):
    return "".join(rng.choice(alpha) for _ in range(n))


def mixed(n):
    """Random alnum with at least one upper, lower and digit (a real generator's output)."""
    while True:
        s = r(AN, n)
        if any(c in UP for c in s) and any(c in LO for c in s) and any(c in DG for c in s):
            return s


def b64(data):
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def b64u(data):
    return base64.urlsafe_b64encode(data.encode() if isinstance(data, str) else data).decode().rstrip("=")


def uid():
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


WORDS = ["tulip", "harbor", "lamp", "violet", "cactus", "meteor", "pepper", "glacier", "walnut", "orbit", "saffron",
         "ember", "falcon", "lantern", "mosaic", "pillow", "quartz", "ribbon", "thistle", "zephyr", "copper", "maple"]


def human_pw():
    """A human password: two words, digits, maybe a symbol."""
    a, b = rng.sample(WORDS, 2)
    return "%s%s%s%d%s" % (a.capitalize(), rng.choice(["", "-", "."]), b.capitalize(), rng.randint(10, 9999),
                           rng.choice(["", "!", "#", "%"]))


def gen_pw(n=20):
    return r(AN + "!#%^*-_", n)


def jwt(payload, alg="HS256", sig_len=43):
    h = b64u(json.dumps({"alg": alg, "typ": "JWT"}, separators=(",", ":")))
    p = b64u(json.dumps(payload, separators=(",", ":")))
    return "%s.%s.%s" % (h, p, r(B64U, sig_len)), p


S = []  # secrets
O = []  # ordinary values


def sec(channel, target, shape, plant, value, fragments, anchor):
    frs = [f for f in fragments if f]
    for f in frs:
        assert len(f) >= 8, (shape, f)
    S.append({"id": "E%03d" % (len(S) + 1), "channel": channel, "shape": shape, "target": target, "plant": plant,
              "value": value, "fragments": frs, "anchor": anchor})


def ordv(channel, target, what, plant, value, anchor, near=None):
    e = {"id": "O%02d" % (len(O) + 1), "channel": channel, "what": what, "target": target, "plant": plant,
         "value": value, "anchor": anchor}
    if near:
        e["near"] = near
    O.append(e)


def loc(frame, name, expr):
    return {"local": frame, "code": "%s = %s" % (name, expr)}


# =============================================================================================== argv (T0, T2, T3, T4)
# (T1 has a process title, which overwrites its argv area: no argv plants there)

pw = gen_pw(18)
v = "https://mlflow:%s@mlflow.internal.corp:5000" % urllib.parse.quote(pw, safe="")
sec("argv", "T0", "MLflow tracking URI with basic-auth userinfo (percent-encoded generated password)",
    {"argv": ["--tracking-uri", v]}, v, [urllib.parse.quote(pw, safe=""), pw], "--tracking-uri")

k = r(HEX, 64)
v = "openrouter:sk-or-v1-" + k
sec("argv", "T0", "provider:key spec (litellm style) with an OpenRouter key sk-or-v1-<64 hex>, flag --judge",
    {"argv": ["--judge", v]}, v, [k[:24], k[-24:]], "--judge")

k = mixed(25)
sec("argv", "T0", "LightningCLI dotted flag --trainer.logger.init_args.api_key=<Comet 25 alnum>",
    {"argv": ["--trainer.logger.init_args.api_key=" + k]}, k, [k], "--trainer.logger.init_args")

k = "glpat-" + r(B64U, 20)
v = "https://oauth2:%s@gitlab.corp.example/ml/experiments.git" % k
sec("argv", "T0", "git remote URL oauth2:glpat-... (GitLab PAT), flag --code-remote",
    {"argv": ["--code-remote", v]}, v, [k[6:]], "--code-remote")

ak, sk = "AKIA" + r(UP + "234567", 16), r(AN + "+/", 40)
v = json.dumps({"anon": False, "key": ak, "secret": sk, "client_kwargs": {"region_name": "eu-west-1"}})
sec("argv", "T0", "fsspec --storage-options JSON with AWS key id and secret key",
    {"argv": ["--storage-options", v]}, v, [sk, ak[4:]], "--storage-options")

pw = human_pw()
v = "postgresql+psycopg://trainer:%s@pg-runs.internal:5432/runs" % pw
sec("argv", "T2", "SQLAlchemy URL with driver suffix and a human password, --db",
    {"argv": ["--db", v]}, v, [pw], "--db")

t1, t2, t3 = "T0" + r(UP + DG, 9), "B0" + r(UP + DG, 9), mixed(24)
v = "https://hooks.slack.com/services/%s/%s/%s" % (t1, t2, t3)
sec("argv", "T2", "Slack incoming webhook URL, flag --notify", {"argv": ["--notify", v]}, v, [t3], "--notify")

k = "gsk_" + mixed(52)
v = json.dumps({"pip": ["vllm==0.9.2"], "env_vars": {"GROQ_API_KEY": k, "HF_HUB_ENABLE_HF_TRANSFER": "1"}})
sec("argv", "T2", "Ray --runtime-env-json with env_vars holding a Groq key gsk_",
    {"argv": ["--runtime-env-json", v]}, v, [k[4:]], "--runtime-env-json")

pw = gen_pw(16)
v = "admin:" + pw
sec("argv", "T3", "user:password pair under --basic-auth (no URL)", {"argv": ["--basic-auth", v]}, v, [pw],
    "--basic-auth")

kid, kk = r(B64U, 20), r(B64U, 22)
v = b64("%s:%s" % (kid, kk))
sec("argv", "T3", "Elasticsearch ApiKey (base64 of id:key), flag --es-credential-b64",
    {"argv": ["--es-credential-b64", v]}, v, [v[8:40], kk], "--es-credential-b64")

k = "pcsk_" + r(AN, 6) + "_" + mixed(63)
v = "https://docs-idx-3k2j.svc.aped-4627-b74a.pinecone.io?api_key=" + k
sec("argv", "T4", "vector DB URL with ?api_key=pcsk_ (Pinecone) in the query, --vector-db",
    {"argv": ["--vector-db", v]}, v, [k[12:44]], "--vector-db")

# ======================================================================================================== env
k = "hf_" + r(UP + LO, 34)
v = "ft-llama-" + k
sec("env", "T0", "SLURM_JOB_NAME built from $HF_TOKEN by a template slip", {"env": ["SLURM_JOB_NAME", v]}, v,
    [k[3:]], "SLURM_JOB_NAME")

pw = human_pw()
v = "http://svc-ml:%s@proxy.corp.example:3128" % urllib.parse.quote(pw, safe="")
sec("env", "T1", "HTTPS_PROXY with proxy credentials", {"env": ["HTTPS_PROXY", v]}, v,
    [urllib.parse.quote(pw, safe="")], "HTTPS_PROXY")

k = "pypi-AgEIcHlwaS5vcmc" + r(B64U, 120)
v = "https://__token__:%s@pypi.internal.example/simple" % k
sec("env", "T2", "PIP_EXTRA_INDEX_URL with __token__:pypi-AgEI... (PyPI macaroon)",
    {"env": ["PIP_EXTRA_INDEX_URL", v]}, v, [k[20:52]], "PIP_EXTRA_INDEX_URL")

k = "gsk_" + mixed(52)
v = "groq:" + k
sec("env", "T3", "unusual variable name JUDGE_BACKEND=groq:gsk_...", {"env": ["JUDGE_BACKEND", v]}, v, [k[4:]],
    "JUDGE_BACKEND")

nk = "nvapi-" + r(B64U, 64)
a = b64("$oauthtoken:" + nk)
v = json.dumps({"auths": {"nvcr.io": {"auth": a}}})
sec("env", "T4", "DOCKER_AUTH_CONFIG JSON: auth = base64($oauthtoken:nvapi-...) for nvcr.io",
    {"env": ["DOCKER_AUTH_CONFIG", v]}, v, [a[16:56], nk[6:38]], "DOCKER_AUTH_CONFIG")

gk = r(B64, 40)
v = "glc_" + b64(json.dumps({"o": "912345", "n": "hangjob-write", "k": gk, "m": {"r": "prod-eu-west-2"}},
                            separators=(",", ":")))
sec("env", "T0", "Grafana Cloud access-policy token glc_ + base64 JSON, variable OBS_PUSH",
    {"env": ["OBS_PUSH", v]}, v, [v[30:70], gk], "OBS_PUSH")

# ======================================================================================================== title (T1)
ordv("title", "T1", "process title words", {"title": "embed-worker[2]"}, "embed-worker[2]", "embed-worker")

pw = gen_pw(22)
v = "(worker -A tasks --broker redis://:%s@cache.internal:6379/0)" % pw
sec("title", "T1", "Celery-style title carrying the worker argv: redis://:password@ (password-only userinfo)",
    {"title": v}, v, [pw], "embed-worker")

k = b64u(bytes(rng.getrandbits(8) for _ in range(24)))
v = "sglang::scheduler --api-key " + k
sec("title", "T1", "server title with --api-key <32 url-safe base64>", {"title": v}, v, [k], "embed-worker")

k = "%d:AA%s" % (rng.randint(6000000000, 7999999999), r(B64U, 33))
v = "notifier(bot=%s)" % k
sec("title", "T1", "Telegram bot token <10 digits>:AA<33> in a title", {"title": v}, v, [k.split(":")[1]],
    "embed-worker")

# ================================================================================================ locals (main thread)
ak, sk = "AKIA" + r(UP + "234567", 16), r(AN + "+/", 40)
v = '{"anon": False, "key": "%s", "secret": "%s"}' % (ak, sk)
sec("locals", "T0", "fsspec storage_options dict {key: AKIA..., secret: 40}",
    loc("run_training", "storage_options", v), sk, [sk, ak[4:]], "storage_options")

k = "sk-ant-api03-" + r(B64U, 93) + "AA"
sec("locals", "T0", "header line 'x-api-key: sk-ant-api03-...' kept as a str (py-spy cuts it at ~128 chars)",
    loc("fetch_batch", "req_header", repr("x-api-key: " + k)), k, [k[13:45]], "req_header")

pw = human_pw()
v = "Server=tcp:sqlml.database.windows.net,1433;Database=feat;User ID=ro;Password=%s;Encrypt=yes" % pw
sec("locals", "T0", "ADO.NET connection string Password=...; under name conn",
    loc("wait_for_peer", "conn", repr(v)), v, [pw], "conn")

k = r(HEX, 40)
v = "machine api.wandb.ai\n  login user\n  password %s\n" % k
sec("locals", "T1", "~/.netrc text as wandb writes it (password = 40-hex W&B key)",
    loc("serve_forever", "netrc_text", repr(v)), k, [k], "netrc_text")

k = "sk-proj-" + r(B64U, 74) + "T3BlbkFJ" + r(B64U, 74)
v = "WANDB_MODE=online\nOPENAI_API_KEY=%s\n" % k
sec("locals", "T1", "dotenv file text with OPENAI_API_KEY=sk-proj-... (cut by py-spy)",
    loc("poll_queue", "dotenv_text", repr(v)), k, [k[8:40]], "dotenv_text")

n1, n2, tail = str(rng.randint(10 ** 9, 10 ** 10 - 1)), str(rng.randint(10 ** 9, 10 ** 10 - 1)), mixed(24)
v = repr(["xoxb-", n1, "-", n2, "-", tail])
sec("locals", "T1", "Slack bot token xoxb- kept as a list of its parts (split across values)",
    loc("poll_queue", "tok_parts", v), "xoxb-%s-%s-%s" % (n1, n2, tail), [tail], "tok_parts")

pw = gen_pw(24)
sec("locals", "T3", "requests auth tuple (user, password) under a harmless name",
    loc("sync_state", "basic", repr(("svc-ingest", pw))), pw, [pw], "basic")

k = "hf_" + r(UP + LO, 34)
v = "apiVersion: v1\nkind: Secret\ndata:\n  HF_TOKEN: %s\n" % b64(k)
sec("locals", "T3", "Kubernetes Secret manifest text: data value base64(hf_...)",
    loc("sync_state", "manifest", repr(v)), b64(k), [b64(k)[4:36], k[3:]], "manifest")

ak = r(B64, 86) + "=="
v = ("DefaultEndpointsProtocol=https;AccountName=mlckpt;AccountKey=%s;EndpointSuffix=core.windows.net" % ak)
sec("locals", "T3", "Azure Storage connection string AccountKey=<88 base64> (cut by py-spy)",
    loc("await_barrier", "blob_conn", repr(v)), ak, [ak[:32]], "blob_conn")

pw = human_pw()
v = "mot de passe du bastion: " + pw
sec("locals", "T3", "French label in ASCII ('mot de passe') then a human password, name note",
    loc("await_barrier", "note", repr(v)), pw, [pw], "note")

pw = human_pw()
sec("locals", "T4", "dict with a Polish key in ASCII (haslo)",
    loc("main_wait", "konto", repr({"uzytkownik": "ml", "haslo": pw})), pw, [pw], "konto")

pw = gen_pw(14)
sec("locals", "T4", "dict with an Indonesian key (kata_sandi)",
    loc("main_wait", "opsi", repr({"pengguna": "etl", "kata_sandi": pw})), pw, [pw], "opsi")

k = "ops_" + b64u(json.dumps({"signInAddress": "my.1password.com", "userAuth": {"method": "SRPg-4096",
                                                                              "alg": "PBES2g-HS256"},
                              "email": "%s@%s.1password.com" % (r(LO, 10), r(LO, 6)), "srpX": r(HEX, 64),
                              "muk": {"k": r(B64U, 43), "kty": "oct"}}))
sec("locals", "T4", "1Password service-account token ops_ + base64url JSON under a one-letter name",
    loc("check_links", "x", repr(k)), k, [k[4:40], k[60:100]], "x")

host, pw = "cluster0.%s.mongodb.net" % r(LO + DG, 5), gen_pw(20)
sec("locals", "T0", "a mongodb+srv URL kept as split parts (scheme, user, password, host) in a tuple",
    loc("run_training", "url_parts", repr(("mongodb+srv", "ingest", pw, host))), pw, [pw], "url_parts")

cs = "GOCSPX-" + r(B64U, 28)
v = json.dumps({"client_secret": cs,
                "client_id": "%d-%s.apps.googleusercontent.com" % (rng.randint(10 ** 11, 10 ** 12), r(LO + DG, 32))})
sec("locals", "T0", "JSON text (escaped quotes) with a Google OAuth client_secret GOCSPX-",
    loc("fetch_batch", "oauth_json", repr(v)), cs, [cs[7:]], "oauth_json")

wk = b64(bytes(rng.getrandbits(8) for _ in range(32)))
v = {"PrivateKey": wk, "Address": "10.8.0.3/32", "Endpoint": "vpn.corp.example:51820"}
sec("locals", "T0", "WireGuard interface dict: PrivateKey (44 base64) under name wg0",
    loc("wait_for_peer", "wg0", repr(v)), wk, [wk[:30]], "wg0")

cid, csec = uid(), "%s8Q~%s" % (r(AN, 3), r(AN + "~_.-", 34))
sec("locals", "T1", "Entra ID app credential tuple (client id uuid, client secret with 8Q~)",
    loc("serve_forever", "app_cred", repr((cid, csec))), csec, [csec], "app_cred")

k = "dapi" + r(HEX, 32)
sec("locals", "T1", "Databricks PAT dapi<32 hex> in a workspace dict under key pat",
    loc("poll_queue", "ws", repr({"host": "https://adb-%d.7.azuredatabricks.net" % rng.randint(10 ** 14, 10 ** 15),
                                  "pat": k})), k, [k[4:]], "ws")

# ======================================================================================== thread_locals (bg threads)
k1, k2 = r(UP + DG, 24), r(UP + DG, 64)
v = "Authorization: Api-Token dt0c01.%s.%s" % (k1, k2)
sec("thread_locals", "T2", "Dynatrace token dt0c01.<24>.<64> in a header line, metrics shipper thread",
    loc("ship_metrics", "auth_line", repr(v)), v, [k1 + "." + k2[:20], k2[:32]], "auth_line")

k = "NRAK-" + r(UP + DG, 27)
sec("thread_locals", "T2", "New Relic user key NRAK- in a header dict, metrics shipper thread",
    loc("ship_metrics", "nr_hdrs", repr({"Api-Key": k, "Content-Type": "application/json"})), k, [k[5:]], "nr_hdrs")

sbk, sbp = jwt({"iss": "supabase", "ref": r(LO, 20), "role": "service_role", "iat": 1767225600, "exp": 2082758400})
sec("thread_locals", "T4", "Supabase service_role JWT under name sb_key, vector sync thread",
    loc("sync_vectors", "sb_key", repr(sbk)), sbk, [sbp[:40], sbk.split(".")[2]], "sb_key")

ak, sk = r(UP + DG, 20), r(AN, 40)
v = {"url": "https://minio.lab:9000", "accessKey": ak, "secretKey": sk, "api": "s3v4"}
sec("thread_locals", "T3", "MinIO mc alias dict (accessKey, secretKey), checkpoint push thread",
    loc("push_ckpt", "mc_alias", repr(v)), sk, [sk, ak], "mc_alias")

k = "lsv2_pt_%s_%s" % (r(HEX, 32), r(HEX, 10))
sec("thread_locals", "T3", "LangSmith key lsv2_pt_ under a misspelled name tokn, checkpoint push thread",
    loc("push_ckpt", "tokn", repr(k)), k, [k[8:40]], "tokn")

k1, k2 = "hf_" + r(UP + LO, 34), "hf_" + r(UP + LO, 34)
v = "[ci-bot]\nhf_token = %s\n[me]\nhf_token = %s\n" % (k1, k2)
sec("thread_locals", "T0", "HF stored_tokens INI text (two tokens), hub mirror thread",
    loc("hub_mirror", "stored", repr(v)), k1, [k1[3:], k2[3:]], "stored")

# ======================================================================================================= source
pw = human_pw()
sec("source", "T0", "auth tuple literal passed as a keyword: requests.get(url, auth=(user, password))",
    {"source": "fetch_batch", "where": "before",
     "code": 'resp = requests.get(index_url, auth=("ml-ro", "%s"), timeout=30)' % pw}, pw, [pw],
    "requests.get(index_url")

pw = human_pw()
sec("source", "T0", "Italian comment in ASCII after the return: credenziali staging user / password",
    {"source": "wait_for_peer", "where": "after", "code": "# credenziali staging: ml / %s" % pw}, pw, [pw],
    "credenziali staging")

pw = gen_pw(16)
sec("source", "T1", "positional password to ftplib.FTP_TLS(host, user, passwd)",
    {"source": "serve_forever", "where": "before",
     "code": 'ftp = ftplib.FTP_TLS("ftp.vendor.example", "partner-ml", "%s")' % pw}, pw, [pw], "ftplib.FTP_TLS")

pw = human_pw()
v = "postgresql://ro:%s@pg.internal/feat" % pw
sec("source", "T1", "dead code after the return: psycopg.connect with a URL holding a password",
    {"source": "poll_queue", "where": "after", "code": 'conn = psycopg.connect("%s")' % v}, pw, [pw],
    "psycopg.connect")

k = "pa-" + r(B64U, 43)
sec("source", "T3", "fallback literal: os.environ.get('EMB_KEY', 'pa-...') (Voyage key as default)",
    {"source": "sync_state", "where": "before",
     "code": 'headers["X-Embed-Key"] = os.environ.get("EMB_KEY", "%s")' % k}, k, [k[3:]], "os.environ.get")

k = "tgp_v1_" + r(B64U, 43)
sec("source", "T3", "comment after the return holding a shell export line (Together key tgp_v1_)",
    {"source": "await_barrier", "where": "after", "code": "# export TOGETHER_API_KEY=%s" % k}, k, [k[7:]],
    "# export TOGETHER")

pw = human_pw()
sec("source", "T4", "bytes literal password passed positionally to hashlib.pbkdf2_hmac",
    {"source": "main_wait", "where": "before",
     "code": 'dk = hashlib.pbkdf2_hmac("sha256", b"%s", salt, 600000)' % pw}, pw, [pw], "hashlib.pbkdf2_hmac")

ak, sk = "AKIA" + r(UP + "234567", 16), r(AN + "+/", 40)
sec("source", "T4", "boto3.client with access key and secret passed positionally (7th, 8th args)",
    {"source": "check_links", "where": "after",
     "code": 's3 = boto3.client("s3", "us-east-1", None, None, False, None, "%s", "%s")' % (ak, sk)}, sk,
    [sk, ak[4:]], "boto3.client")

ek = b64(bytes(rng.getrandbits(8) for _ in range(32)))
v = "Endpoint=sb://ml-events.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=%s" % ek
sec("source", "T2", "Event Hubs connection string (SharedAccessKey=) in a from_connection_string call, bg thread",
    {"source": "ship_metrics", "where": "before",
     "code": 'producer = EventHubProducerClient.from_connection_string("%s")' % v}, ek, [ek[:32]],
    "from_connection_string")

hk = r(HEX, 64)
sec("source", "T4", "AES key as a hex literal in a Cipher(...) call after the return, bg thread",
    {"source": "sync_vectors", "where": "after",
     "code": 'enc = Cipher(algorithms.AES(bytes.fromhex("%s")), modes.GCM(iv)).encryptor()' % hk}, hk,
    [hk[:32], hk[32:]], "algorithms.AES")

# ======================================================================================================= thread
k = "%d:AA%s" % (rng.randint(6000000000, 7999999999), r(B64U, 33))
v = "poll-https://api.telegram.org/bot%s/getUpdates" % k
sec("thread", "T0", "thread named after the URL it polls: Telegram bot token in the path",
    {"thread": v}, v, [k.split(":")[1]], "_bg_wait")

k = "glrt-" + r(B64U, 20)
sec("thread", "T3", "thread named refresh[glrt-...] (GitLab runner token)", {"thread": "refresh[%s]" % k}, k,
    [k[5:]], "_bg_wait")

k = "sk_" + r(HEX, 48)
sec("thread", "T4", "thread named tts-stream-sk_<48 hex> (ElevenLabs key)", {"thread": "tts-stream-" + k}, k,
    [k[3:27], k[27:]], "_bg_wait")

pw = human_pw()
v = "imap-ml-alerts@corp.example:" + pw
sec("thread", "T2", "thread named mailbox:password (imap-user@domain:password)", {"thread": v}, v, [pw],
    "_bg_wait")

# ======================================================================================================= comm
k = "npm_" + r(AN, 36)
sec("comm", "T0", "OS thread name = first 15 bytes of an npm token", {"comm": k[:15]}, k[:15], [k[:15], k[4:15]],
    {"gdb_of": "T0"})

k = "rk_live_" + mixed(24)
sec("comm", "T3", "main thread's comm (process name) = first 15 of a Stripe restricted key",
    {"main_comm": k[:15]}, k[:15], [k[:15]], {"gdb_of": "T3"})

k = "xapp-1-A0" + r(UP + DG, 9) + "-" + r(DG, 13)
sec("comm", "T2", "pthread name set from C: first 15 of a Slack app token xapp-1-", {"native_thread": k[:15]},
    k[:15], [k[:15]], {"gdb_of": "T2"})

# ======================================================================================================= stderr
k = "ghu_" + r(AN, 36)
v = "git push failed: remote https://%s@github.com/acme-ml/evals.git: 403" % k
sec("stderr", "T0", "chained exception, first: ConnectionError with a token as the URL user (ghu_)",
    {"stderr": "chain_first", "exc": "ConnectionError", "msg": v}, k, [k[4:]], "git push failed")

k = "hf_" + r(UP + LO, 34)
v = ("1 validation error for HubSettings\nhub_token\n  String should match pattern '^hf_[A-Za-z]{34}$' "
     "[type=string_pattern_mismatch, input_value='%s ', input_type=str]" % k)
sec("stderr", "T0", "pydantic v2 ValidationError echoing input_value= (token with a trailing space)",
    {"stderr": "raise", "exc": "RuntimeError", "msg": v}, k, [k[3:]], "validation error for HubSettings")

k = "AIza" + r(B64U, 35)
v = ('DEBUG:httpx:HTTP Request: POST https://generativelanguage.googleapis.com/v1beta/models/'
     'gemini-2.5-flash:generateContent?key=%s "HTTP/1.1 429 Too Many Requests"' % k)
sec("stderr", "T0", "httpx debug log line: Gemini key in ?key= query", {"stderr": "line", "line": v}, k,
    [k[4:]], "DEBUG:httpx:HTTP Request")

ordv("stderr", "T0", "NCCL watchdog line: sequence number and op",
     {"stderr": "line", "line": "[rank0]:[E1129 11:20:50.123456 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught "
                                "collective operation timeout: WorkNCCL(SeqNum=4711, OpType=ALLREDUCE, NumelIn=262144, "
                                "NumelOut=262144, Timeout(ms)=600000) ran for 600021 milliseconds before timing out."},
     "SeqNum=4711, OpType=ALLREDUCE", "Watchdog caught collective operation timeout")

sk = r(AN + "+/", 40)
sec("stderr", "T1", "CalledProcessError: aws configure set aws_secret_access_key <40>",
    {"stderr": "called_process", "cmd": ["aws", "configure", "set", "aws_secret_access_key", sk]}, sk, [sk],
    "CalledProcessError")

pw = gen_pw(20)
v = json.dumps({"level": "error", "event": "metrics push failed",
                "sink": "clickhouse://default:%s@ch.internal:8443/metrics" % pw, "retry_in": 30})
sec("stderr", "T1", "structlog JSON log line with a clickhouse:// URL holding a password",
    {"stderr": "line", "line": v}, pw, [pw], "metrics push failed")

pw = human_pw()
sec("stderr", "T1", "Spanish label in ASCII: 'clave de acceso: <password>'",
    {"stderr": "line", "line": "WARN fallback a la clave de acceso: %s (usuario etl)" % pw}, pw, [pw],
    "fallback a la clave de acceso")

k = "ghp_" + r(AN, 36)
sec("stderr", "T2", "PermissionError with a path named after a token (/run/secrets/ghp_...)",
    {"stderr": "raise", "exc": "PermissionError", "msg": "[Errno 13] Permission denied: '/run/secrets/%s'" % k},
    k, [k[4:]], "Permission denied")

k = "gho_" + r(AN, 36)
sec("stderr", "T2", "GIT_CURL_VERBOSE line: Authorization: token gho_... (legacy 'token' scheme)",
    {"stderr": "line", "line": "11:20:41.309 http.c:703 => Send header: Authorization: token %s" % k}, k, [k[4:]],
    "=> Send header")

ordv("stderr", "T2", "CUDA OOM size",
     {"stderr": "line", "line": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a "
                                "total capacity of 79.10 GiB of which 1.12 GiB is free."},
     "Tried to allocate 2.50 GiB", "CUDA out of memory")

k = mixed(32)
sec("stderr", "T3", "ValueError echoing a secret that landed in the wrong flag (could not convert to float)",
    {"stderr": "raise", "exc": "ValueError", "msg": "could not convert string to float: '%s'" % k}, k, [k],
    "could not convert string to float")

pw = gen_pw(18)
sec("stderr", "T3", "bash xtrace line in the log: + curl -sSf -u user:password",
    {"stderr": "line", "line": "+ curl -sSf -u ci-bot:%s https://nexus.corp.example/repository/ml/" % pw}, pw, [pw],
    "+ curl -sSf")

g = "ghs_" + r(AN, 36)
h = b64("x-access-token:" + g)
sec("stderr", "T3", "xtrace of git -c http.extraheader='AUTHORIZATION: basic base64(x-access-token:ghs_)'",
    {"stderr": "line", "line": "+ git -c http.extraheader=\"AUTHORIZATION: basic %s\" fetch origin main" % h}, h,
    [h[12:48], g[4:]], "http.extraheader")

ordv("stderr", "T3", "NCCL peer in a warning",
     {"stderr": "line", "line": "node17:2218:2291 [3] NCCL WARN NET/IB : Got completion from peer 10.0.3.18<43871> "
                                "with status=12 opcode=0 len=0 vendor err 129 (Recv)"},
     "peer 10.0.3.18<43871>", "Got completion from peer")

ecr = "eyJwYXlsb2FkIjoi" + r(B64, 200)
sec("stderr", "T4", "xtrace: + docker login -u AWS -p <ECR password: base64 JSON eyJwYXlsb2FkIjoi...>",
    {"stderr": "line", "line": "+ docker login -u AWS -p %s 123456789012.dkr.ecr.us-east-1.amazonaws.com" % ecr},
    ecr, [ecr[16:56]], "+ docker login")

ordv("stderr", "T4", "W&B run id in a log line",
     {"stderr": "line", "line": "wandb: ERROR run ks8f2x1q crashed; resume with WANDB_RUN_ID=ks8f2x1q"},
     "ks8f2x1q", "crashed; resume with", near="wandb: ERROR run")

k = "sk-ant-admin01-" + r(B64U, 93) + "AA"
sec("stderr", "T4", "torchelastic error file message: AuthenticationError echoing an Anthropic admin key",
    {"elastic": "message", "text": "AuthenticationError: invalid x-api-key '%s'" % k}, k, [k[15:47]],
    "AuthenticationError")

k = mixed(32)
sec("stderr", "T4", "torchelastic error file py_callstack source line: Mistral(os.getenv(...) or '<32 alnum>')",
    {"elastic": "callstack", "text": '    client = Mistral(os.getenv("MISTRAL_KEY") or "%s")' % k}, k, [k],
    "Mistral(os.getenv")

# ======================================================================================================= strace (T3)
pw = gen_pw(24)
sec("strace", "T3", "Redis RESP array AUTH default <password> (verb is *3, not AUTH)",
    {"send": "*3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$24\r\n%s\r\n" % pw}, pw, [pw], {"strace_of": "T3"})

pw = human_pw()
plain = b64("\0ml-alerts@corp.example\0" + pw)
sec("strace", "T3", "SMTP AUTH PLAIN base64(\\0user\\0password)", {"send": "AUTH PLAIN %s\r\n" % plain}, plain,
    [plain[12:44], pw], {"strace_of": "T3"})

k = "pa-" + r(B64U, 43)
sec("strace", "T3", "HTTP request with Authorization: Bearer pa-... (Voyage) as a header, not the first line",
    {"send": "POST /v1/embeddings HTTP/1.1\r\nHost: api.voyageai.com\r\nAuthorization: Bearer %s\r\n"
             "Content-Length: 2\r\n\r\n{}" % k}, k, [k[3:]], {"strace_of": "T3"})

pw = gen_pw(16)
sec("strace", "T3", "IMAP tagged LOGIN: a1 LOGIN user password (the tag comes first)",
    {"send": "a1 LOGIN ml-alerts %s\r\n" % pw}, pw, [pw], {"strace_of": "T3"})

k = "hvs.CAES" + r(B64U, 88)
sec("strace", "T3", "reply read back: Vault login JSON with auth.client_token hvs.CAES...",
    {"reply": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
              "{\"auth\":{\"client_token\":\"%s\",\"lease_duration\":3600}}" % k}, k, [k[8:40]], {"strace_of": "T3"})

# ======================================================================================================= gdb (T2)
pw = gen_pw(18)
sec("gdb", "T2", "char* argument: NATS CONNECT JSON with pass",
    {"gdb": "sent_line", "text": 'CONNECT {"verbose":false,"user":"ml","pass":"%s","name":"trainer"}\r\n' % pw},
    pw, [pw], {"gdb_of": "T2"})

pw = human_pw()
sec("gdb", "T2", "char* argument: Oracle EZConnect user/password@host:port/service",
    {"gdb": "conn_str", "text": "ml_ro/%s@db.corp.example:1521/FEATPDB" % pw}, pw, [pw], {"gdb_of": "T2"})

gk = r(AN, 32)
g = b64(json.dumps({"k": gk, "n": "hang-bot", "id": 1}, separators=(",", ":")))
sec("gdb", "T2", "char* argument: 'Bearer <Grafana legacy API key: base64 JSON {k,n,id}>'",
    {"gdb": "peer_hint", "text": "Bearer " + g}, g, [g[4:36], gk], {"gdb_of": "T2"})

sid, sig = r(B64U, 32), r(B64U, 27)
sec("gdb", "T2", "recv buffer's earlier contents: Set-Cookie with an Express signed session id",
    {"gdb": "buf", "text": "Set-Cookie: connect.sid=s%%3A%s.%s; Path=/" % (sid, sig)}, sid, [sid, sig],
    {"gdb_of": "T2"})

ek = "MHcCAQEEI" + r(B64, 55)
sec("gdb", "T2", "char[160] local: EC PRIVATE KEY PEM head",
    {"gdb": "scratch", "text": "-----BEGIN EC PRIVATE KEY-----\n%s\n" % ek}, ek, [ek[9:41]], {"gdb_of": "T2"})

ordv("gdb", "T2", "label argument of the C frame", {"gdb": "label", "text": "allgather-shard-7"}, "allgather-shard-7",
     "blind_native_wait")

# ======================================================================================================= path
k = r(HEX, 40)
sec("path", "T0", "working directory named by Hydra's override_dirname: ...,wandb_key=<40 hex>",
    {"path": "cwd", "rel": "runs/model=llama3-8b,lr=3e-4,wandb_key=%s" % k}, k, [k], "model=llama3-8b")

k = "hf_" + r(UP + LO, 34)
sec("path", "T3", "script directory: a code snapshot under an override_dirname holding hub_token=hf_...",
    {"path": "script_dir", "rel": "exp/user=ml,hub_token=%s/code" % k}, k, [k[3:]], "sync_state")

k = "hf_" + r(UP + LO, 34)
sec("path", "T1", "stderr log named from the SLURM job name (%x) that holds an HF token",
    {"path": "stderr_file", "rel": "ft-llama-%s-7712345.err" % k}, k, [k[3:]], "-7712345.err")

k = "syt_%s_%s_%s" % (b64u("ml-bot"), r(AN, 20), r(AN, 6))
sec("path", "T4", "plugin module file named after a Matrix access token syt_...",
    {"path": "module_file", "rel": "plugins/matrix_%s.py" % k}, k, [k[13:33]], "notify_loop")

k = r(B64U, 43)
sec("path", "T2", "FIFO a thread blocks opening, named after a 1Password CLI session token",
    {"fifo": "rpc/op-session-%s.fifo" % k}, k, [k[:24], k[20:]], "_fifo_wait")

sig = r(HEX, 128)
sec("path", "T0", "file lock a thread waits on: wget-named GCS V4 signed URL (X-Goog-Signature=hex) + .lock",
    {"flock": "downloads/model-00001-of-00004.safetensors?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Expires=900"
              "&X-Goog-Signature=%s.lock" % sig}, sig, [sig[:32], sig[-32:]], "_flock_wait")

ordv("path", "T3", "triton cache lock a thread waits on (base32 hash name, not secret)",
     {"flock": "locks/triton/cache/WJ6QWZ5JF3VWXKUYUNOX4AXQ7G5ZS3EUKQK6Q7LRU6NLZ4U3OT4A.lock"},
     "WJ6QWZ5JF3VWXKUYUNOX4AXQ7G5ZS3EUKQK6Q7LRU6NLZ4U3OT4A", "triton/cache/")
ordv("path", "T2", "script directory with a release name", {"path": "script_dir", "rel": "src/llm-ft-2026.03/scripts"},
     "llm-ft-2026.03/scripts", "/scripts/train_blind.py")

# ======================================================================================================= child
tok = mixed(32)
v = ["skopeo", "copy", "--src-creds", "robot$ml+ci:" + tok, "docker://harbor.corp.example/ml/trainer:2026.03",
     "oci:/scratch/img"]
sec("child", "T0", "child skopeo --src-creds robot$ml+ci:<token> (Harbor robot), the rank waits on it",
    {"child": v, "wait": True}, tok, [tok], "skopeo")

ak, sk = r(UP + DG, 20), r(AN, 40)
v = ["mc", "alias", "set", "ckpt", "https://minio.lab:9000", ak, sk]
sec("child", "T3", "child mc alias set NAME URL ACCESS SECRET (positional keys)", {"child": v}, sk, [sk, ak],
    "alias set ckpt")

k = "tskey-auth-k%s-%s" % (r(AN, 11), r(AN, 33))
sec("child", "T4", "child tailscale up --authkey tskey-auth-...", {"child": ["tailscale", "up", "--authkey", k,
                                                                            "--hostname", "gpu-node-17"]}, k,
    [k[11:23] + "-", k[-33:]], "tailscale")

pw = gen_pw(18)
sec("child", "T2", "child clickhouse-client --password <pw>",
    {"child": ["clickhouse-client", "--host", "ch.internal", "--user", "etl", "--password", pw, "--query",
               "SELECT 1"]}, pw, [pw], "clickhouse-client")

ordv("child", "T3", "child nvidia-smi query",
     {"child": ["nvidia-smi", "--query-gpu=index,uuid,memory.used", "--format=csv", "-l", "5"]},
     "--query-gpu=index,uuid,memory.used", "nvidia-smi")

# ======================================================================================================= peer
k = "ya29.a0" + r(B64U, 150)
sec("peer", "T0", "sidecar at the other end of a socket: cloud-sql-proxy --token ya29....",
    {"peer": ["cloud-sql-proxy", "--token", k, "--unix-socket", "/cloudsql", "proj-ml:europe-west4:feat"]}, k,
    [k[7:39]], "cloud-sql-proxy")

pw = gen_pw(24)
sec("peer", "T1", "local redis-server peer started with --requirepass <pw>",
    {"peer": ["redis-server", "--port", "0", "--unixsocket", "/run/redis.sock", "--requirepass", pw]}, pw, [pw],
    "redis-server")

pw = human_pw()
sec("peer", "T3", "mlflow server peer with --backend-store-uri postgresql://user:pw@...",
    {"peer": ["mlflow", "server", "--backend-store-uri", "postgresql://mlflow:%s@pg.internal/mlflow" % pw,
              "--host", "127.0.0.1"]}, pw, [pw], "--backend-store-uri")

k = "sk-" + r(AN, 22)
sec("peer", "T4", "litellm proxy peer with --master_key sk-...",
    {"peer": ["litellm", "--config", "/etc/litellm/config.yaml", "--master_key", k]}, k, [k[3:]], "litellm")

ordv("peer", "T2", "fluent-bit peer's config path",
     {"peer": ["fluent-bit", "-c", "/etc/fluent-bit/fluent-bit.conf"]}, "/etc/fluent-bit/fluent-bit.conf",
     "fluent-bit")

# ======================================================================================================= globals (T2)
sigs = [r(HEX, 128) for _ in range(4)]
urls = ["https://storage.googleapis.com/ml-shards/s%d.tar?X-Goog-Signature=%s" % (i, s) for i, s in enumerate(sigs)]
sec("globals", "T2", "module global list of GCS signed URLs read by the top-level loop (shard_url = SHARD_URLS[i])",
    {"global": "SHARD_URLS = %r" % urls}, sigs[0], [s[:32] for s in sigs], "shard_url")

# ================================================================================================= ordinary values
ordv("argv", "T0", "model name", {"argv": ["--model", "meta-llama/Llama-3.1-8B-Instruct"]},
     "meta-llama/Llama-3.1-8B-Instruct", "--model", near="--model")
ordv("argv", "T0", "checkpoint to resume from", {"argv": ["--resume-from", "/ckpt/run-7/global_step12000"]},
     "/ckpt/run-7/global_step12000", "--resume-from", near="--resume-from")
sha = r(HEX, 40)
ordv("argv", "T2", "git commit of the code (40 hex)", {"argv": ["--git-sha", sha]}, sha, "--git-sha", near="--git-sha")
rid = uid()
ordv("argv", "T3", "run id (uuid4)", {"argv": ["--run-id", rid]}, rid, "--run-id", near="--run-id")
ordv("argv", "T3", "a token limit (telling word, plain number)", {"argv": ["--max-new-tokens", "2048"]}, "2048",
     "--max-new-tokens", near="--max-new-tokens")
ordv("argv", "T4", "path of an SSH key file (a path, not a key)",
     {"argv": ["--ssh-key-file", "/home/ml/.ssh/id_ed25519"]}, "/home/ml/.ssh/id_ed25519", "--ssh-key-file",
     near="--ssh-key-file")

ordv("env", "T0", "visible GPUs", {"env": ["CUDA_VISIBLE_DEVICES", "0,1,2,3"]}, "0,1,2,3", "CUDA_VISIBLE_DEVICES",
     near="CUDA_VISIBLE_DEVICES")
ordv("env", "T2", "NCCL async error handling", {"env": ["TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"]}, "3",
     "TORCH_NCCL_ASYNC_ERROR_HANDLING", near="TORCH_NCCL_ASYNC_ERROR_HANDLING")
ordv("env", "T3", "SLURM job id", {"env": ["SLURM_JOB_ID", "7712345"]}, "7712345", "SLURM_JOB_ID",
     near="SLURM_JOB_ID")
ordv("env", "T4", "InfiniBand HCAs", {"env": ["NCCL_IB_HCA", "mlx5_0,mlx5_3"]}, "mlx5_0,mlx5_3", "NCCL_IB_HCA",
     near="NCCL_IB_HCA")


def oloc(target, frame, name, expr, what, value):
    ordv("thread_locals" if frame in ("ship_metrics", "push_ckpt", "sync_vectors", "hub_mirror") else "locals",
         target, what, loc(frame, name, expr), value, name, near=name)


oloc("T0", "run_training", "global_step", "12000", "training step", "12000")
sha = r(HEX, 40)
oloc("T0", "run_training", "code_rev", repr(sha), "git commit of the code (40 hex)", sha)
oloc("T0", "fetch_batch", "shard_path", repr("s3://ml-data/c4/en/c4-train.00412-of-01024.json.gz"),
     "data shard path", "s3://ml-data/c4/en/c4-train.00412-of-01024.json.gz")
oloc("T0", "wait_for_peer", "peer_addr", repr(("10.0.3.17", 29547)), "peer address", '("10.0.3.17", 29547)')
oloc("T0", "run_training", "api_key_env", repr("OPENAI_API_KEY"), "name of an env variable (not its value)",
     "OPENAI_API_KEY")
oloc("T1", "serve_forever", "triton_dir",
     repr("/root/.triton/cache/7ZQ3GKXN4VJ2M5TLWH6RCPEYA8D1FSUB9OIK0QNXHZLT3VY2MJ4A"),
     "triton cache dir (base32-like hash, not secret)", "/root/.triton/cache/7ZQ3GKXN4VJ2M5TLWH6RCPEYA8D1FSUB9OIK0QNXHZLT3VY2MJ4A")
pod = "trainer-7f9c6d5b8-" + r("bcdfghjklmnpqrstvwxz2456789", 5)
oloc("T1", "serve_forever", "pod_name", repr(pod), "Kubernetes pod name (random suffix)", pod)
iid = "i-0" + r(HEX, 16)
oloc("T1", "poll_queue", "instance_id", repr(iid), "EC2 instance id", iid)
mlr = r(HEX, 32)
oloc("T1", "poll_queue", "mlflow_run", repr(mlr), "MLflow run id (32 hex)", mlr)
oloc("T3", "sync_state", "role_arn", repr("arn:aws:iam::123456789012:role/ml-train"), "IAM role ARN",
     "arn:aws:iam::123456789012:role/ml-train")
fp = r(HEX, 16)
oloc("T3", "sync_state", "dataset_fp", repr(fp), "HF datasets fingerprint (16 hex)", fp)
gu = "GPU-" + uid()
oloc("T3", "await_barrier", "gpu_uuid", repr(gu), "GPU UUID", gu)
rj = "raysubmit_" + mixed(16)
oloc("T4", "main_wait", "ray_job", repr(rj), "Ray job submission id (random mixed case)", rj)
et = r(HEX, 32)
oloc("T4", "main_wait", "etag", repr(et), "object ETag (md5 hex)", et)
pub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + r(B64, 43) + " ml@node17"
oloc("T4", "check_links", "host_pubkey", repr(pub), "SSH public key (not secret)", pub[:60])
oloc("T4", "check_links", "secret_ref", repr("projects/123456789012/secrets/hf-token/versions/3"),
     "Secret Manager resource name (a reference, not the value)", "projects/123456789012/secrets/hf-token/versions/3")
oloc("T2", "ship_metrics", "flush_every_s", "15", "push interval", "15")
oloc("T3", "push_ckpt", "ckpt_name", repr("global_step12000/mp_rank_00_model_states.pt"), "checkpoint file name",
     "global_step12000/mp_rank_00_model_states.pt")
oloc("T4", "sync_vectors", "collection", repr("docs-v3-bge-m3"), "vector collection name", "docs-v3-bge-m3")

rev = r(HEX, 40)
ordv("source", "T0", "HF model revision (40 hex) in a source line",
     {"source": "fetch_batch", "where": "after",
      "code": 'tok = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-7B-Instruct", revision="%s")' % rev}, rev,
     "AutoTokenizer.from_pretrained")
ordv("source", "T0", "tokenizer name in a source line",
     {"source": "run_training", "where": "after", "code": 'tok_name = "Qwen/Qwen2.5-7B-Instruct"'},
     "Qwen/Qwen2.5-7B-Instruct", "tok_name =")
ordv("source", "T3", "device ids of a barrier",
     {"source": "await_barrier", "where": "before", "code": "dist.barrier(device_ids=[local_rank])"},
     "device_ids=[local_rank]", "dist.barrier")
ordv("source", "T4", "issue URL in a comment",
     {"source": "main_wait", "where": "after", "code": "# see https://github.com/pytorch/pytorch/issues/123456"},
     "https://github.com/pytorch/pytorch/issues/123456", "# see")
ordv("source", "T2", "OTLP endpoint in a source line (bg thread)",
     {"source": "ship_metrics", "where": "after", "code": 'endpoint = "https://otlp.eu01.nr-data.net:4317"'},
     "https://otlp.eu01.nr-data.net:4317", "endpoint =")

ordv("thread", "T0", "checkpoint writer thread name", {"thread": "ckpt-writer-rank0"}, "ckpt-writer-rank0",
     "_bg_wait")
ordv("thread", "T3", "prefetch thread name", {"thread": "data-prefetch-3"}, "data-prefetch-3", "_bg_wait")
ordv("thread", "T4", "heartbeat thread with a short hex id", {"thread": "heartbeat-9f3a2c"}, "heartbeat-9f3a2c",
     "_bg_wait")

# every secret marker distinct, no fragment inside an ordinary value
vals = [e["value"] for e in S]
assert len(set(vals)) == len(vals)
for e in S:
    for o in O:
        for f in e["fragments"]:
            assert f not in o["value"], (e["id"], o["id"])

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "corpus.json"), "w") as f:
    json.dump({"seed": SEED, "secrets": S, "ordinary": O}, f, indent=1, ensure_ascii=False)
chans = {}
for e in S:
    chans[e["channel"]] = chans.get(e["channel"], 0) + 1
print("%d secrets in %d channels %s, %d ordinary" % (len(S), len(chans), chans, len(O)))
