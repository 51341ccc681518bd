"""TLS for tests: a test CA and its certificates, and redis-servers that speak only TLS.

:func:`make_certificates` writes, with ``cryptography``, a CA, a server certificate for
127.0.0.1 and localhost (the IP in the subject alternative names, as hostname checking
of an IP address needs), a client certificate signed by the same CA, and a second CA that
signed nothing of these (the "wrong CA" a client may be given).
:class:`TLSRedisServer` is a :class:`helpers.RedisServer` whose only port is its TLS port;
:class:`TLSSentinel` a TLS primary with a TLS sentinel watching it.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from helpers import REDIS_SERVER, RedisServer, free_port, stop_processes, wait_until

Key = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Certificates:
    """Paths of the PEM files :func:`make_certificates` wrote."""

    ca: Path            # the CA that signed the server's and the client's certificates
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path      # a CA that signed neither

    def client_options(self, ca: Path | None = None, client: bool = True) -> dict[str, str]:
        """redis-py's ``ssl_*`` options of a client trusting ``ca`` (default: the right
        one), with the client certificate unless ``client`` is false."""
        options = {"ssl_ca_certs": str(ca or self.ca)}
        if client:
            options |= {"ssl_certfile": str(self.client_cert),
                        "ssl_keyfile": str(self.client_key)}
        return options

    def query(self, ca: Path | None = None, client: bool = True) -> str:
        """:meth:`client_options` as a URL query (``?ssl_ca_certs=...``)."""
        return "?" + urlencode(self.client_options(ca, client), safe="/", quote_via=quote)

    def server_args(self, require_client_cert: bool = False) -> list[str]:
        """redis-server's TLS options with these files (its TLS connections to other
        servers, as a replica or a cluster node, present the same certificate)."""
        return ["--tls-cert-file", str(self.server_cert), "--tls-key-file",
                str(self.server_key), "--tls-ca-cert-file", str(self.ca),
                "--tls-auth-clients", "yes" if require_client_cert else "no"]

    def cli_args(self) -> list[str]:
        """redis-cli's options to reach a server started with :meth:`server_args`."""
        return ["--tls", "--cacert", str(self.ca), "--cert", str(self.client_cert),
                "--key", str(self.client_key)]


def _key() -> Key:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key: Key, cert: x509.Certificate) -> tuple[Path, Path]:
    key_path = path.with_suffix(".key")
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key_path


def _certificate(subject: str, key: Key, issuer: x509.Name | None, signer: Key,
                 extensions: list[tuple[Any, bool]]) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1)))
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(signer, hashes.SHA256())


def _ca(folder: Path, name: str) -> tuple[Path, x509.Certificate, Key]:
    key = _key()
    cert = _certificate(f"conveyor test {name}", key, None, key, [
        (x509.BasicConstraints(ca=True, path_length=None), True),
        (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                       content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, encipher_only=False,
                       decipher_only=False), True),
        (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False),
    ])
    path, _ = _write(folder / f"{name}.pem", key, cert)
    return path, cert, key


def _leaf(folder: Path, name: str, ca: x509.Certificate, ca_key: Key,
          usage: list[x509.ObjectIdentifier], alt_names: list[x509.GeneralName]
          ) -> tuple[Path, Path]:
    key = _key()
    extensions: list[tuple[Any, bool]] = [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.ExtendedKeyUsage(usage), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    ]
    if alt_names:
        extensions.append((x509.SubjectAlternativeName(alt_names), False))
    cert = _certificate(f"conveyor test {name}", key, ca.subject, ca_key, extensions)
    return _write(folder / f"{name}.pem", key, cert)


def make_certificates(folder: Path) -> Certificates:
    """Write a CA, a server and a client certificate it signed, and an unrelated CA."""
    ca_path, ca, ca_key = _ca(folder, "ca")
    other_ca, _, _ = _ca(folder, "other-ca")
    # The server certificate serves as a client's too: a replica or cluster node presents
    # it when it connects to another server that asks for one.
    server_cert, server_key = _leaf(
        folder, "server", ca, ca_key,
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    client_cert, client_key = _leaf(folder, "client", ca, ca_key,
                                    [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    return Certificates(ca_path, server_cert, server_key, client_cert, client_key, other_ca)


class TLSRedisServer(RedisServer):
    """A private redis-server that listens only for TLS, on ``port`` (``--port 0``); with
    ``require_client_cert`` a client must present a certificate the CA signed."""

    def __init__(self, certs: Certificates, require_client_cert: bool = False,
                 extra: list[str] | None = None) -> None:
        super().__init__(extra=extra)
        self.certs = certs
        self.require_client_cert = require_client_cert

    def start(self) -> TLSRedisServer:
        # Later options win: the plain port RedisServer.start gives is closed. Read at
        # start, since a cluster sets ``port`` after making the node.
        plain_extra = self.extra
        self.extra = ["--port", "0", "--tls-port", str(self.port),
                      *self.certs.server_args(self.require_client_cert), *plain_extra]
        try:
            super().start()
        finally:
            self.extra = plain_extra
        return self

    @property
    def url(self) -> str:
        """A ``rediss://`` URL with the right CA and the client certificate."""
        return f"rediss://127.0.0.1:{self.port}/0{self.certs.query()}"

    @property
    def bare_url(self) -> str:
        """The ``rediss://`` URL without TLS options (a test adds its own)."""
        return f"rediss://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, ssl=True, **self.certs.client_options())

    def stop(self, save: bool = False) -> None:
        if self.process is None:
            return
        # SIGTERM: redis-server shuts down as for SHUTDOWN (no save: --save "").
        stop_processes([self.process], grace=5)
        self.process = None


class TLSSentinel:
    """A TLS-only primary and one TLS-only sentinel watching it (quorum 1), both requiring
    client certificates; the sentinel reaches the primary over TLS (``tls-replication``)."""

    SERVICE = "tlsprimary"

    def __init__(self, certs: Certificates) -> None:
        self.certs = certs
        self.primary = TLSRedisServer(certs, require_client_cert=True)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-tls-sentinel-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return (f"rediss+sentinel://127.0.0.1:{self.port}/{self.SERVICE}/0"
                f"{self.certs.query()}")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, ssl=True, **self.certs.client_options())

    def start(self) -> TLSSentinel:
        self.primary.start()
        options = [("port", "0"), ("tls-port", str(self.port)), ("bind", "127.0.0.1"),
                   ("dir", str(self.dir)), ("logfile", str(self.dir / "sentinel.log")),
                   ("tls-replication", "yes"), ("tls-cert-file", str(self.certs.server_cert)),
                   ("tls-key-file", str(self.certs.server_key)),
                   ("tls-ca-cert-file", str(self.certs.ca)), ("tls-auth-clients", "yes"),
                   ("sentinel monitor", f"{self.SERVICE} 127.0.0.1 {self.primary.port} 1")]
        config = self.dir / "sentinel.conf"
        config.write_text("".join(f"{name} {value}\n" for name, value in options))
        self.process = subprocess.Popen([REDIS_SERVER, str(config), "--sentinel"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()

        def primary_known() -> bool:
            try:
                return client.sentinel_get_master_addr_by_name(self.SERVICE) is not None
            except redis.exceptions.ConnectionError:
                return False

        try:
            wait_until(primary_known, 10, message=f"sentinel on port {self.port}")
            # info-refresh: milliseconds since the primary answered the sentinel's INFO
            # (over TLS); huge until it first did.
            wait_until(lambda: int(client.sentinel_master(self.SERVICE)["info-refresh"])
                       < 10_000, 10, 0.1, "the sentinel to reach the primary")
        finally:
            client.close()
        return self

    def cleanup(self) -> None:
        if self.process is not None:
            stop_processes([self.process], grace=5)
            self.process = None
        self.primary.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
