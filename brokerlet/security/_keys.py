"""Key and credential values written the way Pulsar accepts them.

Pulsar's ``AuthTokenUtils.readKeyFromUrl`` (and the Basic provider's ``basicAuthConf``) take,
in this order: a ``data:`` URL (``data:;base64,<b64>`` or ``data:<mime>;base64,<b64>``), a
``file:///path`` URL, an existing plain path, and finally raw base64.
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.parse

from brokerlet.config import SettingsError

__all__ = ["read_key_value"]


def read_key_value(value: str, key: str) -> bytes:
    """The bytes ``value`` stands for.

    Args:
        value: The setting's value.
        key: The setting's name, for the error message (the value itself is never shown:
            it may be a secret).

    Raises:
        SettingsError: The URL is malformed, the file cannot be read, or the text is not
            base64.
    """
    if value.startswith("data:"):
        header, comma, data = value[5:].partition(",")
        if not comma:
            raise SettingsError(f"{key}: a data: URL needs a ',' before its data", key=key)
        if header.endswith(";base64"):
            return _b64(data, key)
        return urllib.parse.unquote_to_bytes(data)
    if value.startswith("file:"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(value).path)
        return _read(path, key)
    if os.path.isfile(value):
        return _read(value, key)
    return _b64(value, key)


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise SettingsError(f"{key}: cannot read {path!r}: {exc.strerror}", key=key) from exc


def _b64(text: str, key: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SettingsError(
            f"{key}: not a data: or file: URL, an existing file, or base64", key=key
        ) from exc
