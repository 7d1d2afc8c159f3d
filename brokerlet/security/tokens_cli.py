"""``brokerlet tokens``: make keys and JWTs the way ``pulsar tokens`` does.

Same commands and the same key file formats, so keys made here work with Pulsar and the
other way round:

* ``create-secret-key [--output FILE] [--base64]``: a random HMAC key, raw bytes (32 for
  HS256) or base64;
* ``create-key-pair [-a RS256|ES256...] --output-private-key F --output-public-key F``: DER
  files, PKCS#8 private and X.509 SubjectPublicKeyInfo public, as Pulsar writes them;
* ``create --subject ROLE [--expiry-time 1h] (--secret-key K | --private-key K)``: a token;
* ``validate TOKEN (--secret-key K | --public-key K)``: checks it and prints its claims;
* ``show TOKEN``: prints the header and claims without checking.

Keys are given as Pulsar takes them: ``file:///path``, ``data:;base64,...``, a path, or
base64.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import secrets
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

from brokerlet.config import SettingsError
from brokerlet.security._keys import read_key_value

# PyJWT and cryptography are imported by the commands that use them: `brokerlet serve` builds
# this parser too, and importing them took ~35 ms of every broker's start-up.

__all__ = ["add_tokens_parser", "parse_relative_time", "run_tokens"]

_HMAC_SIZES: Final = {"HS256": 32, "HS384": 48, "HS512": 64}
_EC_CURVES: Final = {"ES256": "SECP256R1", "ES384": "SECP384R1", "ES512": "SECP521R1"}
_RSA_ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_RELATIVE: Final = re.compile(r"^\s*(\d+)\s*([smhdwy]?)\s*$", re.IGNORECASE)


def parse_relative_time(text: str) -> int:
    """Seconds in a Pulsar relative time: ``30`` or ``30s``, ``10m``, ``1h``, ``2d``, ``1w``,
    ``1y``.

    Raises:
        ValueError: anything else.
    """
    match = _RELATIVE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a relative time such as 30s, 10m, 1h, 2d, 1w, 1y")
    return int(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]


def add_tokens_parser(commands: Any) -> None:
    """Add the ``tokens`` command and its subcommands to a subparsers object."""
    tokens = commands.add_parser("tokens", help="create keys and tokens like `pulsar tokens`")
    sub = tokens.add_subparsers(dest="tokens_command", required=True)

    secret = sub.add_parser("create-secret-key", help="a random HMAC secret key")
    secret.add_argument("-a", "--signature-algorithm", default="HS256", choices=_HMAC_SIZES)
    secret.add_argument("-o", "--output", help="file to write (default: standard output)")
    secret.add_argument("-b", "--base64", action="store_true", help="write it as base64")

    pair = sub.add_parser("create-key-pair", help="an RSA or EC key pair, DER encoded")
    pair.add_argument(
        "-a",
        "--signature-algorithm",
        default="RS256",
        choices=(*_RSA_ALGORITHMS, *_EC_CURVES),
    )
    pair.add_argument("--output-private-key", required=True)
    pair.add_argument("--output-public-key", required=True)

    create = sub.add_parser("create", help="a signed token for a subject (role)")
    create.add_argument("-s", "--subject", required=True)
    create.add_argument("-e", "--expiry-time", help="relative, e.g. 1h or 30d; default: never")
    create.add_argument("-a", "--signature-algorithm", default=None)
    keys = create.add_mutually_exclusive_group(required=True)
    keys.add_argument("-sk", "--secret-key", help="file:///..., data:;base64,..., path")
    keys.add_argument("-pk", "--private-key", help="file:///..., data:;base64,..., path")
    create.add_argument("--claim", action="append", default=[], metavar="NAME=VALUE")

    validate = sub.add_parser("validate", help="check a token and print its claims")
    validate.add_argument("token", nargs="?", help="the token (or --token-file / -i)")
    validate.add_argument("-f", "--token-file")
    validate.add_argument("-i", "--stdin", action="store_true")
    checks = validate.add_mutually_exclusive_group(required=True)
    checks.add_argument("-sk", "--secret-key")
    checks.add_argument("-pk", "--public-key")

    show = sub.add_parser("show", help="print a token's header and claims without checking")
    show.add_argument("token", nargs="?")
    show.add_argument("-f", "--token-file")
    show.add_argument("-i", "--stdin", action="store_true")


def run_tokens(args: argparse.Namespace) -> int:
    """Run a parsed ``tokens`` command; returns the exit status."""
    try:
        command = args.tokens_command
        if command == "create-secret-key":
            return _create_secret_key(args)
        if command == "create-key-pair":
            return _create_key_pair(args)
        if command == "create":
            print(_create(args))
            return 0
        if command == "validate":
            return _validate(args)
        return _show(args)
    except (SettingsError, ValueError, OSError) as error:
        print(f"brokerlet tokens: {error}", file=sys.stderr)
        return 2


def _write(path: str | None, data: bytes) -> None:
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    with open(path, "wb") as file:
        file.write(data)


def _create_secret_key(args: argparse.Namespace) -> int:
    key = secrets.token_bytes(_HMAC_SIZES[args.signature_algorithm])
    _write(args.output, base64.b64encode(key) + b"\n" if args.base64 else key)
    return 0


def _create_key_pair(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec, rsa  # noqa: PLC0415

    algorithm = args.signature_algorithm
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm in _EC_CURVES:
        private = ec.generate_private_key(getattr(ec, _EC_CURVES[algorithm])())
    else:
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(
        args.output_private_key,
        private.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    _write(
        args.output_public_key,
        private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return 0


def _private_key(raw: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    if raw.lstrip().startswith(b"-----"):
        return serialization.load_pem_private_key(raw, password=None)
    return serialization.load_der_private_key(raw, password=None)


def _public_key(raw: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415

    if raw.lstrip().startswith(b"-----"):
        return serialization.load_pem_public_key(raw)
    return serialization.load_der_public_key(raw)


def _create(args: argparse.Namespace) -> str:
    import jwt  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    claims: dict[str, Any] = {"sub": args.subject}
    if args.expiry_time:
        claims["exp"] = int(time.time()) + parse_relative_time(args.expiry_time)
    for item in args.claim:
        name, equals, value = item.partition("=")
        if not equals:
            raise ValueError(f"--claim {item!r}: expected NAME=VALUE")
        claims[name] = value
    if args.secret_key:
        key: Any = read_key_value(args.secret_key, "--secret-key")
        algorithm = args.signature_algorithm or "HS256"
    else:
        key = _private_key(read_key_value(args.private_key, "--private-key"))
        default = "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "RS256"
        algorithm = args.signature_algorithm or default
    return jwt.encode(claims, key, algorithm=algorithm)


def _token_text(args: argparse.Namespace) -> str:
    if args.stdin:
        return sys.stdin.read().strip()
    if args.token_file:
        with open(args.token_file, encoding="ascii") as file:
            return file.read().strip()
    if not args.token:
        raise ValueError("give a token, --token-file FILE or --stdin")
    return str(args.token).strip()


def _validate(args: argparse.Namespace) -> int:
    import jwt  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    token = _token_text(args)
    header = jwt.get_unverified_header(token)
    algorithm = str(header.get("alg", ""))
    if algorithm.lower() == "none":
        print("brokerlet tokens: unsigned token (alg: none) refused", file=sys.stderr)
        return 1
    if args.secret_key:
        key: Any = read_key_value(args.secret_key, "--secret-key")
        allowed = list(_HMAC_SIZES)
    else:
        key = _public_key(read_key_value(args.public_key, "--public-key"))
        is_ec = isinstance(key, ec.EllipticCurvePublicKey)
        allowed = list(_EC_CURVES) if is_ec else list(_RSA_ALGORITHMS)
    try:
        claims = jwt.decode(token, key, algorithms=allowed, options={"verify_aud": False})
    except jwt.InvalidTokenError as error:
        print(f"brokerlet tokens: invalid token: {error}", file=sys.stderr)
        return 1
    print(json.dumps(claims, sort_keys=True))
    return 0


def _show(args: argparse.Namespace) -> int:
    import jwt  # noqa: PLC0415

    token = _token_text(args)
    header = jwt.get_unverified_header(token)
    claims = jwt.decode(token, options={"verify_signature": False})
    print(json.dumps(header, sort_keys=True))
    print("---")
    print(json.dumps(claims, sort_keys=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m brokerlet.security.tokens_cli``: the same as ``brokerlet tokens``."""
    parser = argparse.ArgumentParser(prog="brokerlet")
    add_tokens_parser(parser.add_subparsers(dest="command", required=True))
    return run_tokens(parser.parse_args(argv))
