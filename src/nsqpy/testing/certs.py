"""A throwaway certificate authority and server certificate for TLS tests.

certs = make_certificates(tmp_path)     # needs the ``openssl`` command
nsqd = start_nsqd(data, f"--tls-cert={certs.cert}", f"--tls-key={certs.key}")
context = certs.client_context()        # trusts the CA; the server cert is for 127.0.0.1
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def make_certificates(directory: Path, ca_name: str = "nsqpy test CA") -> Certs:
    """A CA (ca.pem) and a server certificate (server.pem, server.key) for 127.0.0.1 and
    localhost, valid two days, made with the openssl command in ``directory``."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    days = ("-days", "2")
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
        "-out", "ca.pem", *days, "-subj", f"/CN={ca_name}",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
        "-out", "server.csr", "-subj", "/CN=localhost",
    )  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", *days, "-extfile", "san.ext",
    )  # fmt: skip
    return Certs(directory / "ca.pem", directory / "server.pem", directory / "server.key")
