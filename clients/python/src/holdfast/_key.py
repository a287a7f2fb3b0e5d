"""Lock keys, validated as the arbiter validates them."""

from __future__ import annotations

from dataclasses import dataclass

MAX_NAMESPACE_LEN = 63
MAX_KEY_LEN = 512


def _invalid(field: str, message: str):
    from .errors import InvalidArgumentError

    return InvalidArgumentError(f"{field}: {message}", code=_invalid_code(), field=field)


def _invalid_code():
    import grpc

    return grpc.StatusCode.INVALID_ARGUMENT


@dataclass(frozen=True, slots=True)
class Key:
    """A lock key: a namespace (its class decides TTL and tier) and a path
    inside it. Build it with :meth:`parse` or ``Key(namespace, path)``; a bad
    key is refused before any call."""

    namespace: str
    path: str

    def __post_init__(self) -> None:
        _validate_namespace(self.namespace)
        _validate_path(self.path)

    @classmethod
    def parse(cls, text: str) -> Key:
        """Parse ``NAMESPACE/KEY``: everything up to the first '/' is the namespace."""
        ns, sep, path = text.partition("/")
        if not sep:
            raise _invalid("key", f"{text!r} has no namespace; write it as NAMESPACE/KEY, e.g. payments/ledger-7")
        return cls(ns, path)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.path}"


def _validate_namespace(ns: str) -> None:
    if not ns:
        raise _invalid("namespace", 'is empty; every key lives in a namespace such as "payments"')
    if len(ns.encode()) > MAX_NAMESPACE_LEN:
        raise _invalid("namespace", f"is {len(ns.encode())} bytes; the limit is {MAX_NAMESPACE_LEN}")
    if not all(c.isascii() and (c.islower() or c.isdigit() or c == "-") for c in ns):
        raise _invalid("namespace", f"{ns!r} may contain only a-z, 0-9 and '-'")
    if ns.startswith("-") or ns.endswith("-"):
        raise _invalid("namespace", f"{ns!r} may not start or end with '-'")


def _validate_path(key: str) -> None:
    if not key:
        raise _invalid("key", 'is empty; name the resource the lock guards, e.g. "ledger-7"')
    if len(key.encode()) > MAX_KEY_LEN:
        raise _invalid("key", f"is {len(key.encode())} bytes; the limit is {MAX_KEY_LEN}")
    for c in key:
        if c <= " " or c > "~":
            raise _invalid("key", f"contains {c!r}; only visible ASCII characters are allowed")
    if key.startswith("/") or key.endswith("/"):
        raise _invalid("key", "may not start or end with '/'")
    for seg in key.split("/"):
        if seg == "":
            raise _invalid("key", 'contains an empty path segment ("//")')
        if seg in (".", ".."):
            raise _invalid("key", f"contains a {seg!r} path segment, which could leave the namespace")
