"""Where the arbiters are, and this workload's mTLS material."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from .errors import ConfigError

# HTTP/2 keepalive on every connection, as the Go client (5 s / 5 s).
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
]


@dataclass(frozen=True)
class Config:
    """endpoints: every arbiter, "host:port" or "https://host:port" (the order
    does not matter: all clients with the same set route each key to the
    same one). ca_file: the CA bundle (PEM) that signed the arbiters'
    certificates. cert_file, key_file: this workload's X.509 SVID (a
    certificate whose one spiffe:// URI SAN is its identity) and key."""

    endpoints: Sequence[str]
    ca_file: str
    cert_file: str
    key_file: str = field(repr=False)

    def credentials(self) -> grpc.ChannelCredentials:
        """mTLS credentials, reading the three files now (so an unreadable
        file is refused at construction, not at the first call)."""

        def read(path: str, what: str) -> bytes:
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                raise ConfigError(f"{what}: {e}") from e

        ca = read(self.ca_file, "CA bundle (HOLDFAST_CA)")
        if b"-----BEGIN CERTIFICATE-----" not in ca:
            raise ConfigError(f"CA bundle {self.ca_file} (HOLDFAST_CA) holds no PEM certificate")
        cert = read(self.cert_file, f"client SVID (HOLDFAST_CERT {self.cert_file})")
        key = read(self.key_file, f"client key (HOLDFAST_KEY {self.key_file})")
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def config_from_env() -> Config:
    """Read HOLDFAST_ENDPOINT (one endpoint, or several separated by commas),
    HOLDFAST_CA, HOLDFAST_CERT and HOLDFAST_KEY, as ``holdfastctl dev``
    writes them (``source DIR/env``)."""
    missing = [n for n in ("HOLDFAST_ENDPOINT", "HOLDFAST_CA", "HOLDFAST_CERT", "HOLDFAST_KEY") if not os.environ.get(n)]
    endpoints = [e.strip() for e in os.environ.get("HOLDFAST_ENDPOINT", "").split(",") if e.strip()]
    if missing or not endpoints:
        raise ConfigError(f"{', '.join(missing or ['HOLDFAST_ENDPOINT'])} not set; `source DIR/env` from `holdfastctl dev`, or set them")
    return Config(endpoints, os.environ["HOLDFAST_CA"], os.environ["HOLDFAST_CERT"], os.environ["HOLDFAST_KEY"])


def target(endpoint: str) -> str:
    """The dial target of an endpoint; the server is verified against the CA
    with the endpoint's host as its name (as the Rust and Go clients do)."""
    rest = endpoint
    scheme, sep, r = endpoint.partition("://")
    if sep:
        if scheme != "https":
            raise ConfigError(f"endpoint {endpoint!r}: the arbiter speaks mTLS only; use host:port or https://host:port")
        rest = r
    i = rest.rfind(":")
    if i <= 0 or i == len(rest) - 1:
        raise ConfigError(f"endpoint {endpoint!r}: want host:port")
    return rest


def secure_channel(endpoint: str, config: Config) -> grpc.Channel:
    """A blocking channel to one arbiter (for :class:`holdfast.Client`)."""
    return grpc.secure_channel(target(endpoint), config.credentials(), options=_CHANNEL_OPTIONS)


def aio_secure_channel(endpoint: str, config: Config) -> grpc.aio.Channel:
    """An asyncio channel to one arbiter (for the lockers)."""
    return grpc.aio.secure_channel(target(endpoint), config.credentials(), options=_CHANNEL_OPTIONS)
