"""Which names say their value is a secret: flags, variables, dict keys, keyword arguments, headers. Stdlib only.

A name is split into words (dashes, underscores, dots, camelCase). Strong (2): a word that names a credential
(`password`, `passcode`, `token`, `secret`, `psk`, `privkey`; any word that starts with `pass` but `passes`,
`passage` ...) or a pair of words that do (`api key`, `private key`): its value is hidden whatever it looks like.
Weak (1): an ambiguous word (`key`, `auth`, `session`, `sig`, `ticket`), or a strong word with a word that says
the value is *about* the secret rather than the secret (`token_count`, `pass_idx`, `signature_version`,
`--private-key-file`, `--token-limit`): its value is kept when the default-deny rule finds it safe
(workers/cleartext.py: a number, a name, a path), hidden otherwise. Harmless (0): everything else.
"""

from __future__ import annotations

from workers.cleartext import clear_value
from workers.lazyre import lazy

MASK = "***"

# Whole words keep harmless names apart: --keyframes, --max-tokens (a count), --tokenizer (a path), --author.
_SECRET_WORDS = {"apikey", "token", "secret", "secrets", "pwd", "pw", "credential", "credentials", "cred", "creds",
                 "authorization", "cookie", "cookies", "privatekey", "privkey", "signature", "accesskey",
                 "secretkey", "sessionid", "sessiontoken", "bearer", "authtoken", "xsrf", "csrf", "jwt", "pin", "otp",
                 "apitoken", "dsn", "psk", "netrc", "pgpass"}
_WEAK_WORDS = {"key", "auth", "pat", "sas", "session", "sig", "salt", "nonce", "license", "cert", "keys", "ticket",
               "hmac", "pkey"}
_SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "apikey", "credential", "credentials", "pwd",
                    "cookie", "signature", "passcode", "passphrase")
_SECRET_PREFIXES = ("secret", "pass", "credential", "apikey", "authtoken")
# Two adjacent words that together say secret: API_KEY, access-key, private_key, X-Api-Key, session_id.
_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("session", "id"),
                 ("session", "key"), ("auth", "key"), ("signing", "key"), ("encryption", "key"), ("priv", "key"),
                 ("master", "key"), ("client", "key"), ("sas", "key"), ("account", "key"), ("shared", "key"),
                 ("pre", "shared")}
# Words that never make a name secret even though they start or end like one (bypass, compass, passes).
_NOT_SECRET = {"bypass", "compass", "keyframes", "keyboard", "monkey", "donkey", "turkey", "hockey", "passes",
               "passage", "passages", "passenger", "passthrough", "passive", "passed", "passing", "passband",
               "pinned", "pinning", "pins", "keys", "passport"}
# Words that make a strong name weak: the value is a count, an index, a kind, a limit, where the secret is kept
# (a file, a directory, a variable's name), not the secret.
_ABOUT = {"count", "counts", "num", "number", "idx", "index", "indices", "ids", "len", "length", "size", "sizes",
          "limit", "limits", "max", "min", "mode", "type", "types", "kind", "file", "files", "path", "paths", "dir",
          "dirs", "directory", "name", "names", "env", "var", "heads", "dim", "dims", "version", "format",
          "algorithm", "algo", "scheme", "budget", "window", "rate", "shape", "expiry", "expires", "ttl", "timeout",
          "required", "enabled", "use", "enable", "disable", "policy", "strategy", "method", "level", "step",
          "steps", "per", "total", "offset", "position", "positions", "start", "end", "memory", "first", "second",
          "last", "forward", "backward"}

# "Password" in the languages teams name their keys and write their comments in: a dict key `wachtwoord`, a
# comment `# contraseña: ...`, `密码：...`. Each means nothing but the credential in its language (`parola`,
# `parole`, `parol`, `clave` are left out: they also mean word, speech, key). Lower case, as written there.
PASSWORD_ABROAD = frozenset({
    "wachtwoord",  # nl
    "senha",  # pt
    "contraseña", "contrasena", "contraseñas", "contrasenas",  # es
    "motdepasse",  # fr (mot_de_passe, mot de passe: joined)
    "kennwort",  # de (Passwort starts with pass already)
    "hasło", "haslo",  # pl
    "heslo",  # cs, sk
    "lösenord", "losenord",  # sv
    "adgangskode",  # da
    "salasana",  # fi
    "jelszó", "jelszo",  # hu
    "şifre", "sifre",  # tr
    "lozinka",  # hr, sr, bs
    "geslo",  # sl
    "slaptažodis", "slaptazodis",  # lt
    "salasõna", "salasona",  # et
    "parolă",  # ro (with its accent only: `parola` is Italian for word)
    "пароль", "паролі", "пароля",  # ru, uk, bg
    "κωδικός",  # el
    "סיסמה", "סיסמא",  # he
    "كلمةالمرور", "كلمةالسر",  # ar (two words: joined)
    "पासवर्ड",  # hi
    "密码", "密碼", "口令",  # zh
    "パスワード", "暗証番号",  # ja
    "비밀번호", "암호",  # ko
    "mậtkhẩu", "matkhau",  # vi (two words: joined)
    "katasandi",  # id, ms (two words: joined)
    "รหัสผ่าน",  # th
})
_UNICODE_WORDS = lazy(r"[\W_]+")
# Scripts without spaces between words (CJK, Thai): the word is found inside a longer run of letters
_UNSPACED = tuple(w for w in PASSWORD_ABROAD if any("\u0e00" <= c <= "\u0e7f" or "\u3040" <= c <= "\u9fff"
                                                    or "\uac00" <= c <= "\ud7af" for c in w))


def password_abroad(name: str) -> bool:
    """Whether a name (a key, a variable, a comment's word) is the word for password in another language."""
    if name.isascii() and len(name) < 5:
        return False
    low = name.lower()
    words = [w for w in _UNICODE_WORDS.split(low) if w]
    if any(w.rstrip("0123456789") in PASSWORD_ABROAD or (len(w) > 5 and w.endswith("s") and w[:-1] in PASSWORD_ABROAD)
           for w in words):
        return True
    if "".join(words) in PASSWORD_ABROAD or any(x in low for x in _UNSPACED):
        return True
    return any("".join(words[i:i + n]) in PASSWORD_ABROAD for n in (2, 3) for i in range(len(words) - n + 1))


_WORD_SPLIT = lazy(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

_STRENGTH: dict = {}  # name -> strength; the same few local and variable names come back on every frame


def strength(name: str) -> int:
    """2: the name says secret; 1: it may (a weak word, or a strong one qualified); 0: harmless."""
    known = _STRENGTH.get(name)
    if known is None:
        if len(_STRENGTH) > 4096:
            _STRENGTH.clear()
        known = _STRENGTH[name] = _word_strength(name)
    return known


def _words(name: str) -> list:
    # creds2, token_1, pw0: a number at the end of a word does not change what it names
    return [w.lower().rstrip("0123456789") or w.lower() for w in _WORD_SPLIT.split(name.lstrip("-")) if w]


def _word_strength(name: str) -> int:
    if password_abroad(name):
        return 2
    words = _words(name)
    found = 0
    strong = False
    for i, w in enumerate(words):
        if w in _NOT_SECRET:
            continue
        if w == "token" and i + 1 < len(words) and words[i + 1] == "id":
            found = 1  # `pad_token_id`, `eos_token_id`: a vocabulary index
        elif w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) or w.startswith(_SECRET_PREFIXES):
            strong = True
        elif i + 1 < len(words) and (w, words[i + 1]) in _SECRET_PAIRS:
            strong = True
        elif w in _WEAK_WORDS or (w.endswith(("pass", "auth")) and len(w) > 4):
            found = 1
    if strong:
        # `token_count`, `--private-key-file`, `signature_version`; `pad_token_id`: the value is about a secret
        return 1 if any(w in _ABOUT for w in words) else 2
    return found


def secret_name(name: str) -> bool:
    """Whether a flag or variable name says its value may be a secret (HF_TOKEN, --api-key, --hf_token)."""
    return strength(name) > 0


_HARMLESS = lazy(r"[-+]?\d[\d_]*(?:\.\d*)?(?:[eE][-+]?\d+)?|True|False|None|true|false|none|null")


def secret_value(name: str, value: str) -> bool:
    """Whether `value`, given under `name`, must be masked: always under a strong name, under a weak one unless
    the default-deny rule finds it safe (a number, a name, a path: `key='input_ids'`, `--private-key-file PATH`)."""
    s = strength(name)
    if s == 0 or value == MASK:
        return False
    if s == 2:
        return True
    v = value.strip()
    if _PAIR.fullmatch(v.strip("'\"`")):
        return True  # `--auth user:pw`: a user and a password, however plain
    return not (v == "" or _HARMLESS.fullmatch(v) is not None or clear_value(v))


_PAIR = lazy(r"[^\s:/@]+:(?!\d+$)[^\s:/@]+")
