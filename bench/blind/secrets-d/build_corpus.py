#!/usr/bin/env python3
"""Writes corpus.json for the blind secrets benchmark D (seed 2026071903). Run once; kept for transparency.

Every secret is a fresh seeded-random marker in a realistic 2026 shape. Written without reading hangscope's
redactor, its tests or the earlier blind corpus (see README.md beside this file).
"""
import base64
import binascii
import json
import os
import random
import string
import urllib.parse
import uuid

SEED = 2026071903
R = random.Random(SEED)
UP, LOW, DIG = string.ascii_uppercase, string.ascii_lowercase, string.digits
ALNUM = UP + LOW + DIG
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
B32 = UP + "234567"
WORDS = ("maple otter tulip lantern velvet pickle orbit harbor cobalt saffron gravel meadow falcon juniper "
         "quartz thistle walnut ember lagoon prism hazel copper willow basalt canyon fjord nectar pepper "
         "raven sorrel tundra violet zephyr almond bramble cinder dune fennel garnet heron ivory kelp "
         "lilac mango nutmeg opal plum quill russet sable teal umber vesper wren yarrow").split()


def s(alpha, n):
    return "".join(R.choice(alpha) for _ in range(n))


def hx(n):
    return s(HEX, n)


def word():
    return R.choice(WORDS)


def human(sep="-", sym=True):
    """A low-entropy human password: two words, digits, a symbol (none where it would sit unencoded in a URL)."""
    return "%s%s%s%s%d%s" % (word().capitalize(), sep, word(), sep, R.randint(1000, 9999), R.choice("!#%*?") if sym else "")


def uuid4():
    return str(uuid.UUID(int=R.getrandbits(128), version=4))


def b64(raw: bytes, url=False):
    return (base64.urlsafe_b64encode if url else base64.b64encode)(raw).decode()


def rbytes(n):
    return bytes(R.getrandbits(8) for _ in range(n))


def jwt(header: dict, payload: dict, sig_bytes=32):
    enc = lambda d: b64(json.dumps(d, separators=(",", ":")).encode(), True).rstrip("=")
    return "%s.%s.%s" % (enc(header), enc(payload), b64(rbytes(sig_bytes), True).rstrip("="))


SECRETS = []
ORDINARY = []


def sec(channel, shape, target, plant, value, fragments, anchor):
    SECRETS.append({"id": "D%03d" % (len(SECRETS) + 1), "channel": channel, "shape": shape, "target": target,
                    "plant": plant, "value": value, "fragments": fragments, "anchor": anchor})


def ordv(channel, what, target, plant, value, anchor, near=None):
    o = {"id": "O%02d" % (len(ORDINARY) + 1), "channel": channel, "what": what, "target": target, "plant": plant,
         "value": value, "anchor": anchor}
    if near:
        o["near"] = near
    ORDINARY.append(o)


def loc(frame, name, value):
    return {"local": frame, "code": "%s = %r" % (name, value)}


# =============================================================================================== argv
wandb = hx(40)
sec("argv", "Hydra override without dashes, W&B key (40 hex) under trainer.logger.api_key", "T0",
    {"argv": ["trainer.logger.init_args.api_key=" + wandb]}, wandb, [wandb[:20], wandb[20:]],
    "trainer.logger.init_args.api_key")
wf_sig = s(B64URL, 43)
wf = ("https://prod-27.westeurope.logic.azure.com:443/workflows/%s/triggers/manual/paths/invoke?api-version="
      "2016-06-01&sp=%%2Ftriggers%%2Fmanual%%2Frun&sv=1.0&sig=%s" % (hx(32), wf_sig))
sec("argv", "Teams/Power Automate workflow webhook URL (sig= query), flag --report-to", "T0",
    {"argv": ["--report-to", wf]}, wf, [wf_sig], "--report-to")
pw = human()
dsn = "host=pg-feats.internal port=5432 dbname=feats user=trainer password=%s sslmode=verify-full" % pw
sec("argv", "libpq keyword DSN (password=... inside a space-separated value), --feature-store", "T0",
    {"argv": ["--feature-store", dsn]}, pw, [pw], "--feature-store")
aws_sk = s(B64[:-2] + "+/", 40)
sec("argv", "docker-style -e NAME=VALUE, AWS secret access key", "T0",
    {"argv": ["-e", "AWS_SECRET_ACCESS_KEY=" + aws_sk]}, aws_sk, [aws_sk[:20], aws_sk[20:]],
    "AWS_SECRET_ACCESS_KEY")
pw = s(ALNUM, 18)
jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="feat-writer" password="%s";'
        % pw)
sec("argv", "Kafka SASL/SCRAM JAAS config string", "T2", {"argv": ["--kafka-jaas", jaas]}, pw, [pw],
    "--kafka-jaas")
mistral = s(ALNUM, 32)
sec("argv", "prefixless LLM key (Mistral-like, 32 alnum) as URL userinfo without a colon", "T2",
    {"argv": ["--upstream", "https://%s@llm-gw.internal/v1" % mistral]}, mistral, [mistral],
    "llm-gw.internal")
pw = human("_")
cfgb64 = b64(json.dumps({"user": "svc-serve", "pass": pw, "db": "feats"}).encode())
sec("argv", "base64 of a JSON config holding a password, --cfg-b64", "T2", {"argv": ["--cfg-b64", cfgb64]},
    cfgb64, [cfgb64[20:44], cfgb64[44:]], "--cfg-b64")
aiza = "AIza" + s(B64URL, 35)
sec("argv", "Google API key glued to its header name (x-goog-api-key:VALUE) under --header", "T2",
    {"argv": ["--header", "x-goog-api-key:" + aiza]}, aiza, [aiza[4:24], aiza[20:]], "--header")
pw = human()
jdbc = "jdbc:sqlserver://sql-feats.internal:1433;databaseName=feat;user=etl;password=%s;encrypt=true" % pw
sec("argv", "JDBC SQL Server URL with ;password=...;", "T3", {"argv": ["--jdbc", jdbc]}, pw, [pw], "--jdbc")
sid = uuid4()
sec("argv", "UUID-shaped Vault AppRole secret_id, --role-secret-id", "T3", {"argv": ["--role-secret-id", sid]},
    sid, [sid], "--role-secret-id")
bt = s(LOW + DIG, 6) + "." + s(LOW + DIG, 16)
sec("argv", "Kubernetes bootstrap token (6.16 lowercase) under a harmless flag --join", "T4",
    {"argv": ["--join", bt]}, bt, [bt], "--join")
totp = s(B32, 32)
otp = "otpauth://totp/ci:release-bot?secret=%s&issuer=ci&digits=6" % totp
sec("argv", "TOTP seed in an otpauth:// URI (base32)", "T4", {"argv": ["--mfa", otp]}, totp, [totp], "--mfa")
# =============================================================================================== env
pw = human()
sec("env", "SSHPASS (sshpass reads it), human password", "T0", {"env": ["SSHPASS", pw]}, pw, [pw], "SSHPASS")
pw = s(ALNUM, 20)
sec("env", "torchrun PET_RDZV_ENDPOINT with etcd user:password@host", "T0",
    {"env": ["PET_RDZV_ENDPOINT", "etcd-ml:%s@etcd.internal:2379" % pw]}, pw, [pw], "PET_RDZV_ENDPOINT")
basic = b64(("otel-writer:" + s(ALNUM, 24)).encode())
sec("env", "OTEL_EXPORTER_OTLP_HEADERS with authorization=Basic base64", "T1",
    {"env": ["OTEL_EXPORTER_OTLP_HEADERS", "authorization=Basic %s,x-scope-orgid=ml" % basic]}, basic,
    [basic[8:28], basic[28:]], "OTEL_EXPORTER_OTLP_HEADERS")
pk = b64(bytes.fromhex("302e020100300506032b657004220420") + rbytes(32))
gcreds = json.dumps({"type": "service_account", "client_email": "ml@acme.iam.gserviceaccount.com",
                     "private_key_id": hx(40), "private_key": "-----BEGIN PRIVATE KEY-----\n%s\n-----END PRIVATE KEY-----\n" % pk})
sec("env", "inline service-account JSON (private_key PEM, private_key_id) in GOOGLE_CREDENTIALS", "T1",
    {"env": ["GOOGLE_CREDENTIALS", gcreds]}, pk, [pk[22:48], pk[48:]], "GOOGLE_CREDENTIALS")
hf = "hf_" + s(UP + LOW, 34)
sec("env", "free-text EXTRA_ARGS holding --hub-token hf_...", "T3",
    {"env": ["EXTRA_ARGS", "--push-to-hub --hub-token %s --private" % hf]}, hf, [hf[3:]], "EXTRA_ARGS")
nep = b64(json.dumps({"api_address": "https://app.neptune.ai", "api_url": "https://app.neptune.ai",
                      "api_key": uuid4()}).encode())
sec("env", "Neptune API token (base64 JSON, constant prefix)", "T4", {"env": ["NEPTUNE_API_TOKEN", nep]}, nep,
    [nep[-40:-4]], "NEPTUNE_API_TOKEN")
oss = b64(b"openssh-key-v1\x00" + rbytes(90))
ossh = "-----BEGIN OPENSSH PRIVATE KEY-----\n%s\n-----END OPENSSH PRIVATE KEY-----\n" % oss
sec("env", "multi-line OpenSSH private key in a CI variable DEPLOY_KEY", "T4", {"env": ["DEPLOY_KEY", ossh]},
    ossh, [oss[24:56], oss[60:100]], "DEPLOY_KEY")

# =============================================================================================== title
pw = human(sym=False)
sec("title", "process title with rediss://default:password@", "T1",
    {"title": "--cache rediss://default:%s@cache-01.internal:6380/0" % pw}, pw, [pw], "cache-01.internal")
xai = "xai-" + s(ALNUM, 80)
sec("title", "xAI key in brackets in the process title", "T1", {"title": "[%s]" % xai}, xai, [xai[4:30], xai[50:]],
    "ml-serve:")

# =============================================================================================== locals (main threads)
pw = human()
sec("locals", "dict with a Dutch password key (wachtwoord)", "T0",
    loc("run_training", "db_cfg", {"host": "pg.internal", "gebruiker": "etl", "wachtwoord": pw}), pw, [pw], "db_cfg")
coh = s(ALNUM, 40)
sec("locals", "camelCase apiKey, prefixless 40-alnum key (Cohere-like)", "T0", loc("run_training", "apiKey", coh),
    coh, [coh[:20], coh[20:]], "apiKey")
basic_pw = human()
bb = b64(("svc-reader:" + basic_pw).encode())
sec("locals", "list of header tuples with Basic base64(user:pass)", "T0",
    loc("fetch_batch", "hdrs", [("Accept", "application/json"), ("Authorization", "Basic " + bb)]), bb,
    [bb[12:], basic_pw], "hdrs")
raw = "p@ss/" + s(ALNUM, 14)
enc = urllib.parse.quote(raw, safe="")
sec("locals", "f-string result: URL with a percent-encoded password (%40 %2F), harmless name index_url", "T0",
    loc("fetch_batch", "index_url", "https://svc-reader:%s@artifacts.internal/simple/" % enc), enc, [enc, raw[5:]], "index_url")
ant = "sk-ant-api03-" + s(B64URL, 93) + "AA"
sec("locals", "Anthropic key split across two locals (part_a head, part_b tail)", "T0",
    {"local": "fetch_batch", "code": "part_a = %r\n    part_b = %r" % (ant[:60], ant[60:])}, ant, [ant[13:60], ant[60:]], "part_a")
num = R.randint(10 ** 9, 10 ** 10 - 1)
sec("locals", "numeric password (YAML loads it as int) in a config dict", "T0",
    loc("wait_for_peer", "pg_conf", {"host": "10.0.4.21", "port": 5432, "password": num}), str(num), [str(num)], "pg_conf")
jk = b64(rbytes(32), True).rstrip("=")
sec("locals", "symmetric JWK (kty oct, k=)", "T0", loc("wait_for_peer", "jwk", {"kty": "oct", "k": jk, "alg": "HS256"}),
    jk, [jk], "jwk")
pw = human()
sec("locals", "dict with a Portuguese password key (senha)", "T1",
    loc("serve_forever", "conta", {"usuario": "ml", "senha": pw}), pw, [pw], "conta")
az = b64(rbytes(64))
sec("locals", "Azure storage account key (88 base64) under a one-letter name", "T1", loc("serve_forever", "x", az), az,
    [az[:30], az[30:60]], "conta")
ini_sk = s(ALNUM + "+/", 40)
sec("locals", "INI text (~/.aws/credentials) in a string", "T1",
    loc("poll_queue", "creds_ini", "[ml]\naws_secret_access_key=%s\nregion=us-east-1" % ini_sk), ini_sk,
    [ini_sk[:20], ini_sk[20:]], "creds_ini")
tok = "ghs_" + s(ALNUM, 36)
sec("locals", "token as a dict KEY (allow-list token -> user)", "T1", loc("poll_queue", "allowed", {tok: "ci-bot"}),
    tok, [tok[4:]], "allowed")
lease = uuid4()
sec("locals", "UUID secret_id nested three deep in dict/list", "T3",
    loc("sync_state", "lease_state", {"peers": ["10.0.4.17:29533"], "lease": {"id": "l-7", "auth": {"secret_id": lease}}}),
    lease, [lease], "lease_state")
user_pw = "etl:" + human()
hexed = binascii.hexlify(user_pw.encode()).decode()
sec("locals", "hex-encoded user:password under a harmless name ctx_hex", "T3", loc("sync_state", "ctx_hex", hexed), hexed,
    [hexed[:24], hexed[24:]], "ctx_hex")
age = "AGE-SECRET-KEY-1" + s("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L".upper(), 58)
sec("locals", "age secret key (bech32 uppercase) for SOPS", "T3", loc("await_barrier", "sops_age", age), age,
    [age[16:46], age[46:]], "sops_age")
ek = "ek_" + s(ALNUM, 32)
sec("locals", "realtime ephemeral key in a wss:// query (client_secret=ek_)", "T3",
    loc("await_barrier", "ws_url", "wss://realtime.example.ai/v1/stream?model=rt-2&client_secret=%s" % ek), ek,
    [ek[3:]], "ws_url")
adm = "sk-ant-admin01-" + s(B64URL, 60)
sec("locals", "secret inside an error message kept as a string local", "T4",
    loc("main_wait", "last_error", "401 Unauthorized: invalid x-api-key %s" % adm), adm, [adm[15:50]], "last_error")
pw = "%s%s%d" % (word(), word(), R.randint(100000, 999999))
sec("locals", "Chinese label 密码 then a human password, harmless name db_note", "T4",
    loc("main_wait", "db_note", "数据库密码：%s" % pw), pw, [pw], "db_note")
sat = jwt({"alg": "RS256", "kid": b64(rbytes(32), True).rstrip("=")},
          {"aud": ["https://kubernetes.default.svc"], "exp": 1781000000, "iss": "https://kubernetes.default.svc",
           "sub": "system:serviceaccount:ml:trainer"}, 256)
sec("locals", "Kubernetes service-account JWT (RS256, truncated by py-spy)", "T4", loc("main_wait", "sa_jwt", sat), sat,
    [sat[28:70], sat.split(".")[2][:40]], "sa_jwt")
pw = human()
sec("locals", "SSH_ASKPASS script text echoing a password", "T0",
    loc("wait_for_peer", "askpass", "#!/bin/sh\necho '%s'\n" % pw), pw, [pw], "askpass")

# =============================================================================================== locals of other threads
pw = human(sym=False)
sec("thread_locals", "push-gateway URL with user:password in a background thread", "T1",
    loc("metrics_pusher", "pushgw_url", "https://svc:%s@pushgw.internal:9091/metrics/job/ml" % pw), pw, [pw], "pushgw_url")
dd = hx(32)
sec("thread_locals", "Datadog API key (32 hex) in a header dict, background thread", "T1",
    loc("metrics_pusher", "dd_headers", {"DD-API-KEY": dd, "Content-Type": "application/json"}), dd, [dd], "dd_headers")
kg = hx(32)
sec("thread_locals", "kaggle.json dict {username, key}", "T4", loc("hub_sync", "kaggle", {"username": "acme-ml", "key": kg}),
    kg, [kg], "kaggle")
edk = b64(bytes.fromhex("302e020100300506032b657004220420") + rbytes(32))
pem = "-----BEGIN PRIVATE KEY-----\n%s\n-----END PRIVATE KEY-----" % edk
sec("thread_locals", "Ed25519 PKCS#8 PEM private key under name pk", "T0", loc("otel_export", "pk", pem), pem,
    [edk[20:]], "otlp_endpoint")

# =============================================================================================== module globals (T2)
cf_sig = s(B64URL.replace("-", "~"), 86)
cf = ("https://d3k9x2pq8v.cloudfront.net/shards/0001.tar?Expires=1781000000&Signature=%s&Key-Pair-Id=K%s"
      % (cf_sig, s(UP + DIG, 13)))
sec("globals", "CloudFront signed URL held by a module global the top-level loop reads (shard_url)", "T2",
    {"global": "SHARD_URLS = [%r, %r, %r, %r]" % ("s3://acme-shards/train/0000.tar", cf,
                                                  "s3://acme-shards/train/0002.tar", "s3://acme-shards/train/0003.tar")},
    cf, [cf_sig[:40], cf_sig[40:]], "shard_url")

# =============================================================================================== source lines
pw = human()
sec("source", "positional password to redis.Redis(host, port, db, password)", "T0",
    {"source": "run_training", "where": "before", "code": 'cache = redis.Redis("cache.internal", 6380, 0, %r)' % pw},
    pw, [pw], "cache.internal")
mak, msk = s(UP + DIG, 20), s(ALNUM, 40)
sec("source", "positional access/secret key to Minio(host, access, secret)", "T0",
    {"source": "fetch_batch", "where": "before", "code": 'store = Minio("s3.internal:9000", %r, %r, secure=True)' % (mak, msk)},
    msk, [msk[:20], msk[20:]], "s3.internal:9000")
phrase = " ".join(word() for _ in range(4)) + " " + str(R.randint(10, 99))
sec("source", "HS256 signing secret passed positionally to jwt.encode (words)", "T0",
    {"source": "wait_for_peer", "where": "before", "code": 'assertion = jwt.encode({"sub": "svc"}, %r, algorithm="HS256")' % phrase},
    phrase, [phrase], "assertion = jwt.encode")
ya = "ya29." + s(B64URL, 120)
sec("source", "TOML in a 3-line triple-quoted string: index URL with oauth2accesstoken:ya29", "T1",
    {"source": "poll_queue", "where": "before",
     "code": 'UV_TOML = """[[tool.uv.index]]\nname = "internal"\nurl = "https://oauth2accesstoken:%s@us-python.pkg.dev/acme/ml/simple/" """' % ya},
    ya, [ya[5:45], ya[60:100]], "us-python.pkg.dev")
pw = human()
sec("source", "Spanish comment after the return: contraseña de respaldo", "T1",
    {"source": "poll_queue", "where": "after", "code": "# contraseña de respaldo: %s" % pw}, pw, [pw], "de respaldo")
pw = human()
sec("source", "positional bind password to ldap simple_bind_s", "T3",
    {"source": "sync_state", "where": "before",
     "code": 'ldap_conn.simple_bind_s("cn=ml-bot,ou=svc,dc=acme,dc=internal", %r)' % pw}, pw, [pw], "cn=ml-bot")
cs = s(ALNUM + "~._-", 40)
sec("source", "OAuth client_secret in a form-encoded body string", "T3",
    {"source": "await_barrier", "where": "before",
     "code": 'requests.post(TOKEN_URL, data="grant_type=client_credentials&client_id=ml-trainer&client_secret=%s")' % cs},
    cs, [cs[:20], cs[20:]], "grant_type=client_credentials")
ferb = b64(rbytes(32), True)
sec("source", "bytes literal key in a call: Fernet(b'...')", "T4",
    {"source": "main_wait", "where": "before", "code": "box = Fernet(b%r)" % ferb}, ferb, [ferb[:40]], "box = Fernet")
glpat = "glpat-" + s(B64URL, 27) + ".01." + s(LOW + DIG, 9)
sec("source", "curl command in a comment after the return, PRIVATE-TOKEN header (routable glpat-)", "T4",
    {"source": "check_links", "where": "after",
     "code": '# curl -H "PRIVATE-TOKEN: %s" https://gitlab.acme.internal/api/v4/projects/42/jobs' % glpat},
    glpat, [glpat[6:33]], "gitlab.acme.internal")
gchat_tok = s(B64URL, 43)
gchat = ("https://chat.googleapis.com/v1/spaces/AAQA%s/messages?key=AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI&token=%s%%3D"
         % (s(B64URL, 7), gchat_tok))
sec("source", "Google Chat webhook URL (token= query) in a background thread's source", "T1",
    {"source": "metrics_pusher", "where": "before", "code": "ALERTS = %r" % gchat}, gchat, [gchat_tok], "chat.googleapis.com")
pw = human()
sec("source", "Russian comment in a background thread's source (пароль от стенда)", "T4",
    {"source": "hub_sync", "where": "before", "code": "# пароль от стенда: %s" % pw}, pw, [pw], "от стенда")

# =============================================================================================== thread names
hvs = "hvs.CAESI" + s(B64URL, 80)
sec("thread", "Python thread name with a Vault service token (hvs.)", "T0", {"thread": "lease-renew " + hvs}, hvs,
    [hvs[9:40], hvs[40:]], "lease-renew")
pw = human(sym=False)
sec("thread", "thread named after its amqps:// URL with user:password", "T3",
    {"thread": "consumer amqps://ml-ingest:%s@mq.internal:5671/%%2Fjobs" % pw}, pw, [pw], "mq.internal")
repl = "r8_" + s(ALNUM, 37)
sec("thread", "thread named after the key it uploads with (uploader-r8_...)", "T4", {"thread": "uploader-" + repl}, repl,
    [repl[3:20], repl[20:]], "uploader-")

# =============================================================================================== OS thread names (comm)
ghp = "ghp_" + s(ALNUM, 36)
sec("comm", "OS thread name = first 15 bytes of a GitHub PAT (as Python 3.14 sets it)", "T1", {"comm": ghp[:15]}, ghp,
    [ghp[:15]], None)
akia = "AKIA" + s("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)
sec("comm", "main thread's comm (process name) = AWS access key id prefix (15 chars)", "T3", {"main_comm": akia[:15]},
    akia, [akia[:15]], None)
rpl = "r8_" + s(ALNUM, 37)
sec("comm", "pthread name set from C: Replicate token prefix (r8_ + 12)", "T2", {"native_thread": rpl[:15]}, rpl,
    [rpl[:15]], None)

# =============================================================================================== stderr tails
dl_tok = s(B64URL, 40)
sec("stderr", "chained exception, first: urllib3 MaxRetryError with ?download_token= in the URL", "T0",
    {"stderr": "chain_first", "exc": "ConnectionError",
     "msg": "HTTPSConnectionPool(host='hub.internal', port=443): Max retries exceeded with url: "
            "/api/models/llama/resolve/main/config.json?download_token=%s (Caused by NewConnectionError)" % dl_tok},
    dl_tok, [dl_tok], "Max retries exceeded")
asia = "ASIA" + s("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)
sig4 = hx(64)
stok = "IQoJb3JpZ2luX2VjE" + s(B64, 60)
sec("stderr", "botocore debug line: SigV4 Authorization (Signature=hex) and X-Amz-Security-Token", "T0",
    {"stderr": "line",
     "line": "DEBUG botocore.endpoint Sending http request: <AWSPreparedRequest stream_output=False, method=PUT, "
             "url=https://acme-ckpt.s3.amazonaws.com/sft/step-12000.pt, headers={'Authorization': b'AWS4-HMAC-SHA256 "
             "Credential=%s/20260509/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=%s', "
             "'X-Amz-Security-Token': b'%s'}>" % (asia, sig4, stok)},
    sig4, [sig4[:32], sig4[32:], stok[17:50]], "Sending http request")
oat = "sk-ant-oat01-" + s(B64URL, 80)
sec("stderr", "http.client debuglevel send: b'...' bytes repr with Authorization: Bearer", "T0",
    {"stderr": "line",
     "line": "send: b'POST /v1/messages HTTP/1.1\\r\\nHost: api.anthropic.com\\r\\nAuthorization: Bearer %s\\r\\n"
             "Content-Type: application/json\\r\\n\\r\\n'" % oat}, oat, [oat[13:50], oat[50:]], "POST /v1/messages")
pw = human(sym=False)
sec("stderr", "CalledProcessError: command list with a mongodb+srv:// URI", "T1",
    {"stderr": "called_process", "cmd": ["mongodump", "--uri", "mongodb+srv://etl:%s@cluster0.ab1cd.mongodb.net/feats" % pw,
                                         "--out", "/tmp/dump"]}, pw, [pw], "mongodump")
pw = human()
sec("stderr", "Hydra config YAML printed after the traceback (German key passwort)", "T1",
    {"stderr": "line", "line": "db:\n  host: pg.internal\n  benutzer: etl\n  passwort: %s\n  port: 5432" % pw}, pw, [pw],
    "benutzer: etl")
jp = s(ALNUM, 40)
sec("stderr", "Japanese log line: APIキー=KEY", "T1",
    {"stderr": "line", "line": "2026-05-09 07:12:03 ERROR 認証に失敗しました: APIキー=%s" % jp}, jp, [jp[:20], jp[20:]],
    "2026-05-09 07:12:03 ERROR")
dp = "dp.st.prd." + s(ALNUM, 40)
sec("stderr", "KeyError whose key is a Doppler service token", "T3", {"stderr": "raise", "exc": "KeyError", "msg": dp}, dp,
    [dp[10:]], "KeyError")
apim = hx(32)
sec("stderr", "logging extra dict repr with Ocp-Apim-Subscription-Key", "T3",
    {"stderr": "line", "line": "WARNING gateway retry 3/5 extra={'headers': {'Ocp-Apim-Subscription-Key': '%s', "
                               "'Accept': 'application/json'}}" % apim}, apim, [apim], "gateway retry 3/5")
code = "4/0A" + s(B64URL, 60)
sec("stderr", "OAuth authorization code in a logged callback URL (percent-encoded 4%2F0A...)", "T3",
    {"stderr": "line", "line": "INFO 127.0.0.1 - \"GET /oauth2/callback?state=ml&code=%s&scope=openid%%20email HTTP/1.1\" 200"
                               % urllib.parse.quote(code, safe="")}, code, [code[4:40]], "/oauth2/callback")
kdata = b64(("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI" + s(B64, 60) + "\n-----END EC PRIVATE KEY-----\n").encode())
sec("stderr", "kubeconfig YAML line client-key-data: base64(PEM)", "T4",
    {"stderr": "line", "line": "    client-key-data: %s" % kdata}, kdata, [kdata[56:100], kdata[100:140]], "client-key-data")
gpat = "github_pat_" + s(ALNUM, 22) + "_" + s(ALNUM, 59)
sec("stderr", "exception message: 401 with a fine-grained GitHub PAT echoed", "T4",
    {"stderr": "raise", "exc": "PermissionError",
     "msg": "401 Bad credentials for https://api.github.com/repos/acme-ml/evals (token %s)" % gpat}, gpat,
    [gpat[11:33], gpat[34:70]], "Bad credentials")
azk = hx(32)
sec("stderr", "torchelastic error file: message with an Azure OpenAI api-key header", "T4",
    {"elastic": "message", "text": "AuthenticationError: Error code: 401 - request headers {'api-key': '%s'} rejected" % azk},
    azk, [azk], "AuthenticationError")
sva = "sk-svcacct-" + s(B64URL, 90)
sec("stderr", "torchelastic error file: py_callstack source line with api_key=", "T4",
    {"elastic": "callstack", "text": "    client = OpenAI(api_key=%r)" % sva}, sva, [sva[11:50], sva[50:]], "client = OpenAI")
# =============================================================================================== strace payloads (T3)
pw = s(ALNUM, 14)
sec("strace", "FTP USER then PASS in one write", "T3", {"send": "USER svc-ml\r\nPASS %s\r\n" % pw}, pw, [pw],
    {"strace_of": "T3"})
pw = s(ALNUM, 16)
sec("strace", "PostgreSQL PasswordMessage (binary: p, length, password, NUL)", "T3",
    {"send": "p\x00\x00\x00%s%s\x00" % (chr(4 + len(pw) + 1), pw)}, pw, [pw], {"strace_of": "T3"})
pw = s(ALNUM, 18)
sec("strace", "SASL PLAIN initial response, starts with NUL (\\0user\\0password)", "T3",
    {"send": "\x00ml-svc\x00%s" % pw}, pw, [pw], {"strace_of": "T3"})
wj = jwt({"alg": "ES256"}, {"sub": s(LOW + DIG, 12), "sid": s(ALNUM, 16)}, 32)
sec("strace", "bare JWT sent as the first message of a socket protocol", "T3", {"send": wj + "\n"}, wj,
    [wj.split(".")[1][:30], wj.split(".")[2][:30]], {"strace_of": "T3"})
hft2 = "hf_" + s(UP + LOW, 34)
sec("strace", "raw token as the whole message (the 'verb' is the token)", "T3", {"send": hft2 + "\n"}, hft2, [hft2[3:]],
    {"strace_of": "T3"})
sid2 = s(B64URL, 40)
sec("strace", "reply read back: HTTP response with Set-Cookie session id", "T3",
    {"reply": "HTTP/1.1 200 OK\r\nSet-Cookie: sid=%s; HttpOnly\r\n\r\n" % sid2}, sid2, [sid2], {"strace_of": "T3"})
rt = "1//0g" + s(B64URL, 60)
sec("strace", "reply read back: JSON token response, refresh_token first", "T3",
    {"reply": '{"refresh_token":"%s","expires_in":3599}' % rt}, rt, [rt[5:40]], {"strace_of": "T3"})

# =============================================================================================== gdb (T2)
pw = s(ALNUM, 16)
sec("gdb", "char* argument: Redis HELLO 3 AUTH user password", "T2", {"gdb": "sent_line", "text": "HELLO 3 AUTH ml-ro %s" % pw},
    pw, [pw], {"gdb_of": "T2"})
pw = human()
sec("gdb", "char* argument: ODBC connection string Pwd={...}", "T2",
    {"gdb": "conn_str", "text": "Driver={ODBC Driver 18 for SQL Server};Server=tcp:feat.database.windows.net,1433;Uid=etl;Pwd={%s};Encrypt=yes;" % pw},
    pw, [pw], {"gdb_of": "T2"})
nva = "nvapi-" + s(B64URL, 64)
sec("gdb", "char* argument: peer hint 'Bearer nvapi-...'", "T2", {"gdb": "peer_hint", "text": "Bearer " + nva}, nva,
    [nva[6:40]], {"gdb_of": "T2"})
dt = "dckr_pat_" + s(B64URL, 27)
sec("gdb", "recv buffer's earlier contents: JSON with a Docker Hub PAT", "T2",
    {"gdb": "buf", "text": '{"token":"%s","ttl":3600}' % dt}, dt, [dt[9:]], {"gdb_of": "T2"})
ecd = b64(rbytes(32), True).rstrip("=")
sec("gdb", "char[160] local: EC JWK with its private d", "T2",
    {"gdb": "scratch", "text": '{"kty":"EC","crv":"P-256","d":"%s"}' % ecd}, ecd, [ecd], {"gdb_of": "T2"})

# =============================================================================================== paths
sas_sig = urllib.parse.quote(b64(rbytes(32)), safe="")
sec("path", "script directory named after a wget download with an Azure SAS query (sig=)", "T0",
    {"path": "script_dir", "rel": "unpacked-bundles/job.tgz?sv=2025-05-05&se=2026-06-01&sr=b&sp=r&sig=" + sas_sig},
    sas_sig, [sas_sig[:24], sas_sig[24:]], "unpacked-bundles")
hfp = "hf_" + s(UP + LOW, 34)
sec("path", "working directory named after $HF_TOKEN (a shell-expansion slip)", "T1",
    {"path": "cwd", "rel": "jobscratch/" + hfp}, hfp, [hfp[3:]], "jobscratch")
glptt = "glptt-" + hx(40)
sec("path", "stderr log file named after a GitLab trigger token", "T3",
    {"path": "stderr_file", "rel": "ci-logs/trigger-%s.err" % glptt}, glptt, [glptt[6:26], glptt[26:]], "ci-logs")
dwh = "%d/%s" % (R.randint(10 ** 17, 10 ** 18 - 1), s(B64URL, 68))
dtok = dwh.split("/")[1]
sec("path", "plugin module file named after a Discord webhook id and token", "T4",
    {"path": "module_file", "rel": "notify_plugins/discord_%s.py" % dwh.replace("/", "_")}, dtok, [dtok[:34], dtok[34:]],
    "notify_plugins")
psig = hx(64)
sec("path", "file lock a thread waits on: wget-named presigned S3 file (X-Amz-Signature) + .lock", "T3",
    {"flock": "dl-locks/model-00003.safetensors?X-Amz-Credential=AKIA%s%%2F20260509%%2Fus-east-1%%2Fs3%%2Faws4_request"
              "&X-Amz-Signature=%s.lock" % (s("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16), psig)},
    psig, [psig[:32], psig[32:]], "dl-locks")

# =============================================================================================== child processes
ghs = "ghs_" + s(ALNUM, 36)
sec("child", "child git clone with x-access-token:ghs_ in the URL", "T0",
    {"child": ["git", "clone", "--depth", "1", "https://x-access-token:%s@github.com/acme-ml/private-corpora.git" % ghs,
               "/data/corpora"]}, ghs, [ghs[4:]], "acme-ml/private-corpora")
rsk = s(ALNUM + "+/", 40)
sec("child", "child rclone with --s3-secret-access-key", "T1",
    {"child": ["rclone", "copy", "--s3-access-key-id", "AKIA" + s("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16),
               "--s3-secret-access-key", rsk, ":s3:acme-ckpt/sft", "/mnt/ckpt"]}, rsk, [rsk[:20], rsk[20:]],
    ":s3:acme-ckpt/sft")
pw = human()
sec("child", "child sshpass -p PASSWORD rsync", "T1",
    {"child": ["sshpass", "-p", pw, "rsync", "-az", "/ckpt/", "backup@10.0.3.4:/srv/ckpt/"]}, pw, [pw], "backup@10.0.3.4")
azsig = urllib.parse.quote(b64(rbytes(32)), safe="")
sec("child", "child azcopy with an Azure blob SAS URL (sig=)", "T4",
    {"child": ["azcopy", "copy", "https://acmeml.blob.core.windows.net/ckpt/step-12000?sv=2025-05-05&ss=b&srt=co&sp=rwl"
               "&se=2026-06-01T00:00:00Z&sig=" + azsig, "/ckpt/step-12000", "--recursive"]}, azsig,
    [azsig[:24], azsig[24:]], "acmeml.blob.core.windows.net")

SECRETS[:] = [e for e in SECRETS if e]

# =============================================================================================== ordinary values
ordv("argv", "model name", "T0", {"argv": ["--model_name_or_path", "meta-llama/Llama-3.1-8B-Instruct"]},
     "meta-llama/Llama-3.1-8B-Instruct", "--model_name_or_path", near="--model_name_or_path")
ordv("argv", "learning rate", "T0", {"argv": ["--learning_rate", "2e-5"]}, "2e-5", "--learning_rate", near="--learning_rate")
ordv("argv", "a token limit (telling word, plain number)", "T2", {"argv": ["--max-tokens", "8192"]}, "8192", "--max-tokens",
     near="--max-tokens")
ordv("argv", "data file path", "T3", {"argv": ["--train-data", "/datasets/fineweb-edu/sample-10BT/000_00017.parquet"]},
     "/datasets/fineweb-edu/sample-10BT/000_00017.parquet", "--train-data", near="--train-data")
ordv("argv", "checkpoint to resume from", "T4", {"argv": ["--resume-from-checkpoint", "/ckpt/sft-llama3-8b/step-12000"]},
     "/ckpt/sft-llama3-8b/step-12000", "--resume-from-checkpoint", near="--resume-from-checkpoint")
ordv("argv", "path of a key file (a path, not a key)", "T4", {"argv": ["--tls-key-file", "/etc/ssl/private/node-017.key"]},
     "/etc/ssl/private/node-017.key", "--tls-key-file", near="--tls-key-file")
ordv("env", "NCCL interface", "T0", {"env": ["NCCL_SOCKET_IFNAME", "ens5"]}, "ens5", "NCCL_SOCKET_IFNAME",
     near="NCCL_SOCKET_IFNAME")
ordv("env", "visible GPUs", "T1", {"env": ["CUDA_VISIBLE_DEVICES", "0,1,2,3"]}, "0,1,2,3", "CUDA_VISIBLE_DEVICES",
     near="CUDA_VISIBLE_DEVICES")
ordv("env", "SLURM job id", "T3", {"env": ["SLURM_JOB_ID", "4815162"]}, "4815162", "SLURM_JOB_ID", near="SLURM_JOB_ID")
ordv("env", "AWS profile name", "T4", {"env": ["AWS_PROFILE", "ml-train"]}, "ml-train", "AWS_PROFILE", near="AWS_PROFILE")
git_sha = hx(40)
ordv("locals", "training step", "T0", loc("run_training", "global_step", 48213), "48213", "global_step", near="global_step")
ordv("locals", "git commit of the code (40 hex, high entropy, not secret)", "T0", loc("run_training", "git_sha", git_sha),
     git_sha, "git_sha", near="git_sha")
ordv("locals", "data shard path", "T0",
     loc("fetch_batch", "data_path", "/datasets/redpajama-v2/en/head/0007/shard-00412.jsonl.zst"),
     "/datasets/redpajama-v2/en/head/0007/shard-00412.jsonl.zst", "data_path", near="data_path")
ordv("locals", "batch shape tuple", "T0", loc("fetch_batch", "batch_shape", (16, 4096)), "(16, 4096)", "batch_shape",
     near="batch_shape")
ordv("locals", "peer address", "T0", loc("wait_for_peer", "peer_addr", "10.0.4.17:29533"), "10.0.4.17:29533", "peer_addr",
     near="peer_addr")
ordv("locals", "served model id", "T1", loc("serve_forever", "model_id", "Qwen/Qwen2.5-7B-Instruct"),
     "Qwen/Qwen2.5-7B-Instruct", "model_id", near="model_id")
ordv("locals", "token budget (telling word, plain int)", "T1", loc("serve_forever", "token_budget", 131072), "131072",
     "token_budget", near="token_budget")
rid = uuid4()
ordv("locals", "request id (uuid4, not secret)", "T1", loc("poll_queue", "request_id", rid), rid, "request_id", near="request_id")
ordv("locals", "name of a Kubernetes Secret (not its value)", "T1", loc("poll_queue", "secret_name", "ml-hf-token"),
     "ml-hf-token", "secret_name", near="secret_name")
ordv("locals", "checkpoint directory", "T3", loc("sync_state", "ckpt_dir", "/ckpt/sft-llama3-8b/step-11500"),
     "/ckpt/sft-llama3-8b/step-11500", "ckpt_dir", near="ckpt_dir")
digest = hx(64)
ordv("locals", "container image digest (sha256, not secret)", "T3",
     loc("sync_state", "trainer_image", "ghcr.io/acme-ml/trainer@sha256:" + digest),
     "ghcr.io/acme-ml/trainer@sha256:" + digest, "trainer_image", near="trainer_image")
ordv("locals", "barrier timeout", "T3", loc("await_barrier", "barrier_timeout_s", 1800), "1800", "barrier_timeout_s", near="barrier_timeout_s")
ordv("locals", "hostname of the node", "T4", loc("main_wait", "node_hostname", "gpu-node-017.cluster.internal"),
     "gpu-node-017.cluster.internal", "node_hostname", near="node_hostname")
ordv("locals", "last loss", "T4", loc("main_wait", "last_loss", 2.3817), "2.3817", "last_loss", near="last_loss")
ordv("locals", "W&B run id (8 lowercase alnum)", "T4", loc("check_links", "wandb_run_id", "3k9x2pqa"), "3k9x2pqa",
     "wandb_run_id", near="wandb_run_id")
ordv("locals", "path of a mounted secret file (a path, not the secret)", "T4",
     loc("check_links", "password_file", "/run/secrets/db_password"), "/run/secrets/db_password", "password_file",
     near="password_file")
ordv("locals", "KMS key resource name (a name, not key material)", "T4",
     loc("check_links", "kms_key", "projects/acme-ml/locations/global/keyRings/train/cryptoKeys/ckpt"),
     "projects/acme-ml/locations/global/keyRings/train/cryptoKeys/ckpt", "kms_key", near="kms_key")
ordv("thread_locals", "push interval", "T1", loc("metrics_pusher", "push_every_s", 15), "15", "push_every_s",
     near="push_every_s")
ordv("thread_locals", "hub repo id", "T4", loc("hub_sync", "repo_id", "acme-ml/llama3-8b-sft"), "acme-ml/llama3-8b-sft",
     "repo_id", near="repo_id")
ordv("thread_locals", "exporter endpoint", "T0", loc("otel_export", "otlp_endpoint", "http://otel-collector.monitoring:4318"),
     "http://otel-collector.monitoring:4318", "otlp_endpoint", near="otlp_endpoint")
ordv("source", "gradient accumulation in a source line", "T0",
     {"source": "run_training", "where": "before", "code": "grad_accum_steps = 8"}, "grad_accum_steps = 8", "grad_accum_steps")
ordv("source", "API base URL without credentials", "T1",
     {"source": "serve_forever", "where": "before", "code": 'api_base = "https://api.openai.com/v1"'},
     "https://api.openai.com/v1", "api_base", near="api_base =")
ordv("source", "batch key lookup (key = batch['input_ids'])", "T3",
     {"source": "sync_state", "where": "before", "code": 'key = batch["input_ids"]'}, 'key = batch["input_ids"]',
     "batch[")
ordv("source", "device ids of a barrier", "T3",
     {"source": "await_barrier", "where": "before", "code": "dist.barrier(device_ids=[3])"}, "dist.barrier(device_ids=[3])",
     "dist.barrier")
ordv("source", "tokenizer name", "T4",
     {"source": "main_wait", "where": "before", "code": 'tok = AutoTokenizer.from_pretrained("meta-llama/Llama-3.1-8B")'},
     'from_pretrained("meta-llama/Llama-3.1-8B")', "AutoTokenizer")
ordv("stderr", "message of the raised exception (ends the chain)", "T0",
     {"stderr": "raise", "exc": "RuntimeError", "msg": "could not fetch the model config for step 48213"},
     "model config for step 48213", "could not fetch the")
ordv("thread", "DataLoader pin-memory thread name", "T1", {"thread": "Thread-7 (_pin_memory_loop)"},
     "Thread-7 (_pin_memory_loop)", "_pin_memory_loop")
ordv("thread", "checkpoint writer thread name", "T3", {"thread": "ckpt-writer-0"}, "ckpt-writer-0", "ckpt-writer")
ordv("stderr", "NCCL watchdog line: sequence number and op", "T0",
     {"stderr": "line", "line": "[rank0]:[E509 07:12:03.123] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4817, "
                                "OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600042 "
                                "milliseconds before timing out."},
     "SeqNum=4817, OpType=ALLREDUCE", "Watchdog caught collective operation timeout")
ordv("stderr", "CUDA OOM size", "T1",
     {"stderr": "line", "line": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
                                "capacity of 79.25 GiB of which 1.12 GiB is free."}, "Tried to allocate 2.00 GiB",
     "CUDA out of memory")
ordv("stderr", "NCCL peer in a warning", "T3",
     {"stderr": "line", "line": "gpu-node-017:4242:4301 [3] NCCL WARN NET/Socket : peer 10.0.4.18<45612> message truncated"},
     "10.0.4.18<45612>", "NCCL WARN NET/Socket")
ordv("gdb", "label argument of the C frame", "T2", {"gdb": "label", "text": "shard-0017"}, "shard-0017", "label=")
ordv("title", "process title words", "T1", {"title": "llm-gw-replica-1"}, "llm-gw-replica-1", "ml-serve:")
hub_sha = hx(64)
ordv("path", "HF hub lock file a thread waits on (sha256 name)", "T3",
     {"flock": "hub/.locks/models--meta-llama--Llama-3.1-8B/%s.lock" % hub_sha}, hub_sha,
     ".locks/models--meta-llama--Llama-3.1-8B")
ordv("child", "child nvidia-smi query", "T0",
     {"child": ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv", "-l", "5"]},
     "--query-gpu=utilization.gpu,memory.used", "--format=csv")


def check():
    ids = set()
    texts = {}
    for e in SECRETS:
        assert e["id"] not in ids
        ids.add(e["id"])
        for f in e["fragments"]:
            assert len(f) >= 8, (e["id"], f)
        assert e["fragments"] or len(e["value"]) >= 8
        texts[e["id"]] = json.dumps(e["plant"], ensure_ascii=False)
        if isinstance(e["anchor"], str):
            for f in e["fragments"] + [e["value"]]:
                assert f not in e["anchor"], e["id"]
    # every fragment in its own plant (its raw or percent/base64/hex form) and in no other entry
    allt = {e["id"]: json.dumps(e["plant"], ensure_ascii=False) for e in SECRETS + ORDINARY}
    for e in SECRETS:
        for f in e["fragments"]:
            others = [i for i, t in allt.items() if i != e["id"] and f in t]
            assert not others, (e["id"], f, others)
    for e in SECRETS:
        plant_txt = json.dumps(e["plant"], ensure_ascii=False)
        enc = json.dumps(e["plant"])
        for f in e["fragments"]:
            if f not in plant_txt and f not in enc and json.dumps(f)[1:-1] not in plant_txt \
                    and repr(f)[1:-1] not in plant_txt:
                print("note: fragment not verbatim in plant (encoded form):", e["id"], f[:30])


check()
out = {"about": "blind secrets corpus D: seed %d, written by build_corpus.py before any run" % SEED,
       "seed": SEED, "secrets": SECRETS, "ordinary": ORDINARY}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.json"), "w") as f:
    json.dump(out, f, indent=1, ensure_ascii=False)
from collections import Counter
print(len(SECRETS), "secrets", dict(Counter(e["channel"] for e in SECRETS)))
print(len(ORDINARY), "ordinary", dict(Counter(e["channel"] for e in ORDINARY)))
